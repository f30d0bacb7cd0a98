#include "endpoints/connection_ends.hpp"

#include "endpoints/fd_passing_writer.hpp"
#include "endpoints/handshake.hpp"

namespace ferry::detail {
namespace {

bool client_sends(const EndKind& kind) { return kind.end != ClientEnd::Receiver; }
bool client_receives(const EndKind& kind) { return kind.end != ClientEnd::Sender; }

// This side's options: its receiver enforces its own limits, its sender the peer's.
void set_options(ConnectionEnds& ends, const ChannelOptions& channel, const FrameLimits& peer_limits) {
  ends.receiver_options = per_connection_options(channel);
  ends.sender_options = ends.receiver_options;
  ends.sender_options.limits = peer_limits;
}

std::vector<UniqueFd> one(UniqueFd fd) {
  std::vector<UniqueFd> fds;
  fds.push_back(std::move(fd));
  return fds;
}

// Both directions over one stream socket (`duplex`: each direction shares it).
void over_connection(ConnectionEnds& ends, UniqueFd connection, bool sends, bool receives, const ChannelOptions& own,
                     const RingTiming& timing) {
  const bool duplex = sends && receives;
  if (sends && receives) {
    UniqueFd reading = connection.duplicate();
    ends.writer = writer_from_descriptors(Transport::UnixSocket, one(std::move(connection)), {}, 0, timing, duplex);
    ends.reader =
        reader_from_descriptors(Transport::UnixSocket, one(std::move(reading)), own.limits, 0, timing, duplex);
  } else if (sends) {
    ends.writer = writer_from_descriptors(Transport::UnixSocket, one(std::move(connection)), {}, 0, timing);
  } else {
    ends.reader = reader_from_descriptors(Transport::UnixSocket, one(std::move(connection)), own.limits, 0, timing);
  }
}

}  // namespace

std::vector<int> ListenerSide::descriptors_to_pass(std::uint8_t& writer_fds, std::uint8_t& reader_fds) const {
  std::vector<int> fds;
  if (client_writer) fds = client_writer->descriptors();
  writer_fds = static_cast<std::uint8_t>(fds.size());
  if (client_reader) {
    const std::vector<int> more = client_reader->descriptors();
    fds.insert(fds.end(), more.begin(), more.end());
  }
  reader_fds = static_cast<std::uint8_t>(fds.size() - writer_fds);
  return fds;
}

ListenerSide make_listener_side(const EndKind& kind, const FrameLimits& client_limits, UniqueFd connection,
                                const EndpointOptions& options) {
  ListenerSide side;
  ConnectionEnds& mine = side.mine;
  mine.transport = options.transport;
  set_options(mine, options.channel, client_limits);
  const ChannelOptions& own = options.channel;
  const bool sends = client_receives(kind);  // the listener sends what the client receives
  const bool receives = client_sends(kind);
  if (options.transport == Transport::UnixSocket) {
    over_connection(mine, std::move(connection), sends, receives, own, own.ring_timing());
    return side;
  }
  // A transport of its own per direction; the connection only carries the Reply.
  if (sends) {
    auto [writer, reader] = make_transport(options.transport, client_limits, own.ring_capacity, own.ring_timing());
    mine.writer = always_passing_fds(std::move(writer));
    side.client_reader = std::move(reader);
  }
  if (receives) {
    auto [writer, reader] = make_transport(options.transport, own.limits, own.ring_capacity, own.ring_timing());
    mine.reader = std::move(reader);
    side.client_writer = std::move(writer);
  }
  return side;
}

ConnectionEnds make_client_side(const EndKind& kind, const Reply& reply, UniqueFd connection, std::vector<UniqueFd> fds,
                                const EndpointOptions& options) {
  ConnectionEnds ends;
  ends.transport = options.transport;
  set_options(ends, options.channel, reply.limits);
  const ChannelOptions& own = options.channel;
  const bool sends = client_sends(kind);
  const bool receives = client_receives(kind);
  if (options.transport == Transport::UnixSocket) {
    if (!fds.empty()) throw ProtocolError("the listener passed descriptors for a connection over its own socket");
    over_connection(ends, std::move(connection), sends, receives, own, own.ring_timing());
    return ends;
  }
  if (reply.writer_fds + reply.reader_fds != fds.size() || (reply.writer_fds > 0) != sends ||
      (reply.reader_fds > 0) != receives) {
    throw ProtocolError("the listener's reply carried " + std::to_string(fds.size()) +
                        " descriptors that do not fit a " + kind.describe() + " over " +
                        std::string(transport_name(options.transport)));
  }
  std::vector<UniqueFd> writer_fds(std::make_move_iterator(fds.begin()),
                                   std::make_move_iterator(fds.begin() + reply.writer_fds));
  std::vector<UniqueFd> reader_fds(std::make_move_iterator(fds.begin() + reply.writer_fds),
                                   std::make_move_iterator(fds.end()));
  if (sends) {
    ends.writer = always_passing_fds(writer_from_descriptors(options.transport, std::move(writer_fds), reply.limits,
                                                             own.ring_capacity, own.ring_timing()));
  }
  if (receives) {
    ends.reader = reader_from_descriptors(options.transport, std::move(reader_fds), own.limits, own.ring_capacity,
                                          own.ring_timing());
  }
  return ends;
}

}  // namespace ferry::detail
