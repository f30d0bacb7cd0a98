// The registry of address schemes: each scheme ("unix", "ucx") is the code that listens at
// and connects to its addresses. A new transport is a new entry here, not a new API:
// listen() and connect_*() look the scheme up. Schemes built into ferry_channels are in
// schemes() always; ucx:// lives in ferry_ucx (so that programs that do not use it never
// load UCX) and is found through a weak reference to ferry_ucx_scheme(), which the
// ferry::ucx target makes the linker keep (scheme_registry.cpp, docs/design/ucx.md).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/detail/deadline.hpp"
#include "ferry/detail/endpoint_core.hpp"
#include "ferry/detail/unique_fd.hpp"
#include "ferry/peer_credentials.hpp"

namespace ferry {
struct EndpointOptions;
}

namespace ferry::detail {

/// A connection a listening point accepted, with the peer's credentials as the kernel
/// recorded them.
struct AcceptedSocket {
  detail::UniqueFd socket;
  PeerCredentials peer;
};

/// A scheme's listening socket. Its destructor (in the process that made it) removes what
/// it left behind (a socket file).
class ListeningPoint {
 public:
  virtual ~ListeningPoint() = default;
  /// The descriptor that polls readable when a connection waits to be accepted.
  virtual int fd() const noexcept = 0;
  /// A waiting connection (a blocking stream socket that passes fds, close-on-exec), or
  /// std::nullopt when none waits. Throws SystemError for a failure of this process (out
  /// of descriptors: code() EMFILE or ENFILE, which StreamListenerCore survives).
  virtual std::optional<AcceptedSocket> accept() = 0;
  /// Forgets what the destructor would remove, without removing it (a forked child's copy).
  virtual void abandon() noexcept = 0;
};

/// One scheme: the code that listens at and connects to its addresses. listen() and
/// connect_*() look the scheme up by name and hand it the whole address.
class Scheme {
 public:
  virtual ~Scheme() = default;
  /// "unix", "ucx"
  virtual std::string_view name() const noexcept = 0;
  /// The forms of address it accepts, for messages: "unix:PATH (a socket file) or ...".
  virtual std::string_view forms() const noexcept = 0;
  /// Listens at `address` (`rest`: what follows "name:"). Throws AddressInUse, or Error for
  /// a malformed address.
  virtual std::unique_ptr<ListenerCore> listen(std::string_view address, std::string_view rest,
                                               const EndpointOptions& options) const = 0;
  /// Connects to the listener at `address` as a client of `kind`, waiting up to
  /// options.connect_timeout; this side's ends. Throws as connect_*() documents.
  virtual ConnectionEnds connect(std::string_view address, std::string_view rest, const EndKind& kind,
                                 const EndpointOptions& options) const = 0;
};

/// A scheme whose connection is a stream socket that passes fds (SCM_RIGHTS): the endpoint
/// handshake (handshake.hpp), the accept queue (StreamListenerCore) and the channel's ends
/// run over it, so the scheme says only how to listen and how to try one connect.
class SocketScheme : public Scheme {
 public:
  /// The listening socket at `rest`. Throws AddressInUse, or Error for a malformed address.
  virtual std::unique_ptr<ListeningPoint> listen_point(std::string_view address, std::string_view rest,
                                                       const EndpointOptions& options) const = 0;
  /// One attempt to connect to `rest`: the connected socket (blocking, close-on-exec), or
  /// an empty one when nobody listens there yet (the caller retries until its deadline).
  /// Throws Error for a malformed address.
  virtual detail::UniqueFd try_connect(std::string_view address, std::string_view rest) const = 0;

  std::unique_ptr<ListenerCore> listen(std::string_view address, std::string_view rest,
                                       const EndpointOptions& options) const final;
  ConnectionEnds connect(std::string_view address, std::string_view rest, const EndKind& kind,
                         const EndpointOptions& options) const final;
};

/// The scheme of `address` (parsed: its scheme name), or throws Error naming the address
/// and the accepted forms; for "ucx" in a program without ferry_ucx, how to get it.
const Scheme& scheme_of(std::string_view address, std::string_view scheme_name);
/// Every registered scheme (unix: first, then ucx: when ferry_ucx is linked).
const std::vector<const Scheme*>& schemes();

/// The built-in schemes (each in its own source file).
std::unique_ptr<Scheme> make_unix_scheme();

}  // namespace ferry::detail
