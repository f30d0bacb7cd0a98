#include "ferry/detail/transport.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "ferry/error.hpp"
#include "ring/ring_transport.hpp"
#include "transport/stream_transport.hpp"

namespace ferry {
namespace {

std::pair<detail::UniqueFd, detail::UniqueFd> make_pipe(int flags) {
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC | flags) != 0) throw_errno("pipe2");
  return {detail::UniqueFd(ends[0]), detail::UniqueFd(ends[1])};
}

void expect_descriptors(Transport transport, const std::vector<detail::UniqueFd>& fds, std::size_t count,
                        const char* role) {
  if (fds.size() != count) {
    throw ProtocolError("a " + std::string(transport_name(transport)) + " " + role + " is rebuilt from " +
                        std::to_string(count) + " descriptors, not " + std::to_string(fds.size()));
  }
}

[[noreturn]] void throw_cannot_cross(Transport transport) {
  if (transport == Transport::InProcess) {
    throw Error(
        "an in_process channel moves values between threads of one process and cannot reach another "
        "process; create the channel with Transport::Pipe, UnixSocket or ShmRing");
  }
  if (transport == Transport::Ucx) {
    throw Error(
        "a ucx end cannot be handed to another process (spawn, fork): UCX state must not cross fork; "
        "let the worker connect to the ucx:// address itself");
  }
  throw Error("transport " + std::string(transport_name(transport)) +
              " cannot be rebuilt in another process in this build");
}

}  // namespace

std::string_view transport_name(Transport transport) {
  switch (transport) {
    case Transport::Pipe: return "pipe";
    case Transport::UnixSocket: return "unix_socket";
    case Transport::ShmRing: return "shm_ring";
    case Transport::InProcess: return "in_process";
    case Transport::Ucx: return "ucx";
  }
  return "invalid";
}

std::optional<Transport> transport_from_name(std::string_view name) {
  for (const Transport transport :
       {Transport::Pipe, Transport::UnixSocket, Transport::ShmRing, Transport::InProcess, Transport::Ucx}) {
    if (transport_name(transport) == name) return transport;
  }
  return std::nullopt;
}

std::chrono::nanoseconds default_ring_spin() {
  // Spinning only pays when the peer can run at the same time, on another CPU.
  static const std::chrono::nanoseconds spin =
      std::thread::hardware_concurrency() > 1 ? std::chrono::microseconds(20) : std::chrono::nanoseconds::zero();
  return spin;
}

std::pair<std::unique_ptr<detail::FrameWriter>, std::unique_ptr<detail::FrameReader>> detail::make_transport(
    Transport transport, const FrameLimits& limits, std::size_t ring_capacity, const RingTiming& ring_timing) {
  switch (transport) {
    case Transport::Pipe: {
      auto [data_read, data_write] = make_pipe(0);
      // Non-blocking write end: timed sends must not block inside writev.
      if (::fcntl(data_write.get(), F_SETFL, O_NONBLOCK) != 0) throw_errno("fcntl(O_NONBLOCK) on a pipe");
      // Beside the pipe, a socket pair: acknowledgements come back on it, and segment fds
      // go out on it when peers may not take them from this process (SegmentFdChannel).
      int side[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, side) != 0) throw_errno("socketpair beside a pipe");
      detail::UniqueFd writer_side(side[0]);
      detail::UniqueFd reader_side(side[1]);
      return {std::make_unique<StreamFrameWriter>(std::move(data_write), std::move(writer_side), false),
              std::make_unique<StreamFrameReader>(std::move(data_read), std::move(reader_side), false, limits)};
    }
    case Transport::UnixSocket: {
      int ends[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) throw_errno("socketpair");
      detail::UniqueFd writer_end(ends[0]);
      detail::UniqueFd reader_end(ends[1]);
      return {std::make_unique<StreamFrameWriter>(std::move(writer_end), detail::UniqueFd(), true),
              std::make_unique<StreamFrameReader>(std::move(reader_end), detail::UniqueFd(), true, limits)};
    }
    case Transport::ShmRing: return make_ring_transport(ring_capacity, ring_timing, limits);
    case Transport::InProcess:
      throw Error("Transport::InProcess moves values, not frames: create it with ferry::channel<T>()");
    case Transport::Ucx:
      throw Error(
          "Transport::Ucx connects processes by address: use ferry::listen and ferry::connect_* with a "
          "ucx://HOST:PORT address (in a program that links ferry::ucx)");
  }
  throw Error("unknown transport " + std::to_string(static_cast<int>(transport)));
}

detail::DuplexTransport detail::make_duplex_transport(Transport transport, const FrameLimits& limits,
                                                      std::size_t ring_capacity, const RingTiming& ring_timing) {
  if (transport != Transport::UnixSocket) {
    auto [a_writer, b_reader] = detail::make_transport(transport, limits, ring_capacity, ring_timing);
    auto [b_writer, a_reader] = detail::make_transport(transport, limits, ring_capacity, ring_timing);
    return {std::move(a_writer), std::move(a_reader), std::move(b_writer), std::move(b_reader)};
  }
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) throw_errno("socketpair");
  detail::UniqueFd a_end(ends[0]);
  detail::UniqueFd b_end(ends[1]);
  // Each side's reader holds its own descriptor of the side's socket, so that either half
  // can be closed, detached or handed to another process on its own.
  detail::UniqueFd a_read_end = a_end.duplicate();
  detail::UniqueFd b_read_end = b_end.duplicate();
  return {std::make_unique<StreamFrameWriter>(std::move(a_end), detail::UniqueFd(), true, true),
          std::make_unique<StreamFrameReader>(std::move(a_read_end), detail::UniqueFd(), true, limits, true),
          std::make_unique<StreamFrameWriter>(std::move(b_end), detail::UniqueFd(), true, true),
          std::make_unique<StreamFrameReader>(std::move(b_read_end), detail::UniqueFd(), true, limits, true)};
}

std::unique_ptr<detail::FrameWriter> detail::writer_from_descriptors(
    Transport transport, std::vector<detail::UniqueFd> fds, const FrameLimits& /*limits*/,
    std::size_t /*ring_capacity*/, const RingTiming& ring_timing, bool shares_connection) {
  switch (transport) {
    case Transport::Pipe:  // data pipe's write end, the writer's side socket
      expect_descriptors(transport, fds, 2, "writer");
      return std::make_unique<StreamFrameWriter>(std::move(fds[0]), std::move(fds[1]), false);
    case Transport::UnixSocket:
      expect_descriptors(transport, fds, 1, "writer");
      return std::make_unique<StreamFrameWriter>(std::move(fds[0]), detail::UniqueFd(), true, shares_connection);
    case Transport::ShmRing: {  // the ring's memfd, this end's companion socket
      expect_descriptors(transport, fds, 2, "writer");
      auto segment = std::make_shared<const RingSegment>(RingSegment::attach(std::move(fds[0])));
      return std::make_unique<RingFrameWriter>(std::move(segment), std::move(fds[1]), ring_timing);
    }
    case Transport::InProcess:
    case Transport::Ucx: break;
  }
  throw_cannot_cross(transport);
}

std::unique_ptr<detail::FrameReader> detail::reader_from_descriptors(
    Transport transport, std::vector<detail::UniqueFd> fds, const FrameLimits& limits, std::size_t /*ring_capacity*/,
    const RingTiming& ring_timing, bool shares_connection) {
  switch (transport) {
    case Transport::Pipe:  // data pipe's read end, the reader's side socket
      expect_descriptors(transport, fds, 2, "reader");
      return std::make_unique<StreamFrameReader>(std::move(fds[0]), std::move(fds[1]), false, limits);
    case Transport::UnixSocket:
      expect_descriptors(transport, fds, 1, "reader");
      return std::make_unique<StreamFrameReader>(std::move(fds[0]), detail::UniqueFd(), true, limits,
                                                 shares_connection);
    case Transport::ShmRing: {  // the ring's memfd, this end's companion socket
      expect_descriptors(transport, fds, 2, "reader");
      auto segment = std::make_shared<const RingSegment>(RingSegment::attach(std::move(fds[0])));
      return std::make_unique<RingFrameReader>(std::move(segment), std::move(fds[1]), ring_timing, limits);
    }
    case Transport::InProcess:
    case Transport::Ucx: break;
  }
  throw_cannot_cross(transport);
}

}  // namespace ferry
