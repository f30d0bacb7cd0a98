// Building both sides' transport ends of a new connection. Over Transport::UnixSocket the
// connection itself carries the frames; over another transport (ShmRing, Pipe) the
// listener makes the transport, keeps its side and passes the client's side's
// descriptors in the Reply, which the client rebuilds with writer/reader_from_descriptors.
// Either way every segment fd travels over a socket (SCM_RIGHTS), never by /proc: the
// writers of pipes and rings pass them on their side socket (FdPassingWriter).
#pragma once

#include <memory>
#include <vector>

#include "endpoints/handshake.hpp"
#include "ferry/detail/endpoint_core.hpp"
#include "ferry/endpoint.hpp"

namespace ferry::detail {

/// The listener's side of a new connection, and the client's side still to be passed.
struct ListenerSide {
  ConnectionEnds mine;
  std::unique_ptr<FrameWriter> client_writer;  // passed, then closed here
  std::unique_ptr<FrameReader> client_reader;
  /// The descriptors to pass (the client's writer's, then its reader's).
  std::vector<int> descriptors_to_pass(std::uint8_t& writer_fds, std::uint8_t& reader_fds) const;
};

/// Makes the listener's side for a client of `kind` that enforces `client_limits`, over
/// `connection` (kept when the transport is UnixSocket).
ListenerSide make_listener_side(const EndKind& kind, const FrameLimits& client_limits, UniqueFd connection,
                                const EndpointOptions& options);

/// Makes the client's side from `connection` and the descriptors the Reply carried.
/// Throws ProtocolError when they do not fit the kind and transport.
ConnectionEnds make_client_side(const EndKind& kind, const Reply& reply, UniqueFd connection, std::vector<UniqueFd> fds,
                                const EndpointOptions& options);

}  // namespace ferry::detail
