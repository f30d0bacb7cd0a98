#include "ferry/transport.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "ferry/error.hpp"
#include "ferry/ring_transport.hpp"
#include "ferry/stream_transport.hpp"

namespace ferry {
namespace {

std::pair<UniqueFd, UniqueFd> make_pipe(int flags) {
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC | flags) != 0) throw_errno("pipe2");
  return {UniqueFd(ends[0]), UniqueFd(ends[1])};
}

}  // namespace

std::string_view transport_name(Transport transport) {
  switch (transport) {
    case Transport::Pipe: return "pipe";
    case Transport::UnixSocket: return "unix_socket";
    case Transport::ShmRing: return "shm_ring";
    case Transport::InProcess: return "in_process";
  }
  return "invalid";
}

std::chrono::nanoseconds default_ring_spin() {
  // Spinning only pays when the peer can run at the same time, on another CPU.
  static const std::chrono::nanoseconds spin =
      std::thread::hardware_concurrency() > 1 ? std::chrono::microseconds(20) : std::chrono::nanoseconds::zero();
  return spin;
}

std::pair<std::unique_ptr<FrameWriter>, std::unique_ptr<FrameReader>> make_transport(
    Transport transport, const FrameLimits& limits, std::size_t ring_capacity, const RingTiming& ring_timing) {
  switch (transport) {
    case Transport::Pipe: {
      ignore_sigpipe();
      auto [data_read, data_write] = make_pipe(0);
      // Non-blocking write end: timed sends must not block inside writev.
      if (::fcntl(data_write.get(), F_SETFL, O_NONBLOCK) != 0) throw_errno("fcntl(O_NONBLOCK) on a pipe");
      auto [ack_read, ack_write] = make_pipe(O_NONBLOCK);
      return {std::make_unique<StreamFrameWriter>(std::move(data_write), std::move(ack_read), false),
              std::make_unique<StreamFrameReader>(std::move(data_read), std::move(ack_write), false, limits)};
    }
    case Transport::UnixSocket: {
      int ends[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) throw_errno("socketpair");
      UniqueFd writer_end(ends[0]);
      UniqueFd reader_end(ends[1]);
      return {std::make_unique<StreamFrameWriter>(std::move(writer_end), UniqueFd(), true),
              std::make_unique<StreamFrameReader>(std::move(reader_end), UniqueFd(), true, limits)};
    }
    case Transport::ShmRing: return make_ring_transport(ring_capacity, ring_timing, limits);
    case Transport::InProcess:
      throw Error("Transport::InProcess moves values, not frames: create it with ferry::channel<T>()");
  }
  throw Error("unknown transport " + std::to_string(static_cast<int>(transport)));
}

}  // namespace ferry
