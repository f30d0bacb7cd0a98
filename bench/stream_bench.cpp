// Round-trip latency over the pipe and Unix socket transports, next to raw baselines
// written here: a plain pipe / socket ping-pong of the same size, and a plain "pass one
// memfd with SCM_RIGHTS, mmap it, munmap it" round trip. Names:
//   roundtrip/raw/<transport>/bytes/<n>       plain write/read of n bytes and back (a socket:
//                                             one socketpair used both ways), the streams
//                                             sized to hold a message, as ferry sizes them
//   roundtrip/raw/unix_socket_pair_per_direction/bytes/<n>  the same over one socketpair per
//                                             direction, the shape of a ping-pong over two
//                                             ferry channels (the baseline of the two-channel
//                                             socket rows of 64 KiB and 1 MiB, see below)
//   roundtrip/raw/unix_socket/fd_mmap/<n>     memfd of n bytes passed, mapped, unmapped
//   roundtrip/raw/unix_socket/fd_mmap_new/<n> the same with a different memfd each time, all
//                                             made before the loop as tensor_new's storages
//                                             are (same number of live pages in the system)
//   roundtrip/raw/unix_socket/fd_mmap_new_pair_per_direction/<n>  the same with one socketpair
//                                             per direction, the shape of a ping-pong over two
//                                             ferry channels (not a goal's baseline: it tells
//                                             how much of a difference is the link's shape)
//   roundtrip/ferry/<transport>/bytes/<n>     Sender<std::vector<uint8_t>> of n bytes, echoed
//   roundtrip/ferry/<transport>/tensor_new/<n>   a new shared tensor each time, 1-byte reply
//   roundtrip/ferry/<transport>/tensor_same/<n>  the same shared tensor each time, 1-byte reply
// Ferry rows ping over one channel and pong over another (two socketpairs over a Unix
// socket); the unix_socket_duplex rows do the same over one ferry::duplex connection, one
// socketpair both ways, the shape of the raw socket baselines (bytes rows of 64 B, 64 KiB
// and 1 MiB: how much of a difference to the raw socket is the link's shape).
// Rows that pass a storage also report the median time of the parent's send alone
// (send_p50_ns): on a VM, waking a peer whose virtual CPU went idle makes the send itself
// slow (about 13 us against 1.3 us), and whether it does depends on the link's shape.
// A socket used both ways wakes the side waiting for the reply early: the peer's read of the
// request frees its buffers, and the kernel then wakes whoever sleeps on the sending socket
// (unix_write_space), which is that side, waiting in recv on the same socket. It finds
// nothing, sleeps again, and the reply meets a CPU still awake. With one socketpair per
// direction nobody sleeps on the sending socket, and the reply wakes an idle CPU: on a VM,
// whose idle virtual CPUs wake slowly, that costs a 64 KiB round trip up to twice as much.
// So two-channel rows are compared with the per-direction raw rows, duplex rows with the
// one-socketpair raw rows.
// Every row also reports its median single round trip (counter rtt_p50_ns, see
// support/round_trip_times.hpp): rows that pass a new storage each time time every round
// trip (they run only 10 to 40 iterations at 64 MiB and more, whose mean one scheduler
// tick inflates), the others one in 16.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "ferry/detail/mapping.hpp"
#include "ferry/ferry.hpp"
#include "support/child_process.hpp"
#include "support/round_trip_times.hpp"

namespace ferry::bench {
namespace {

// ---- raw baselines ---------------------------------------------------------------

void write_all(int fd, const void* data, std::size_t size) {
  const auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, bytes, size);
    if (n <= 0) throw std::runtime_error("raw write failed");
    bytes += n;
    size -= static_cast<std::size_t>(n);
  }
}

// Returns false at EOF before the first byte.
bool read_all(int fd, void* data, std::size_t size) {
  auto* bytes = static_cast<char*>(data);
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, bytes + done, size - done);
    if (n == 0 && done == 0) return false;
    if (n <= 0) throw std::runtime_error("raw read failed");
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// Two one-way pipes, one socketpair used both ways, or one socketpair per direction (the
// shape of a ferry ping-pong, which is two channels), as (parent end, child end) for each
// direction.
struct RawLink {
  detail::UniqueFd parent_out, parent_in, child_in, child_out;
};

enum class RawShape { Pipes, Socketpair, SocketpairPerDirection };

void make_socketpair(detail::UniqueFd& a, detail::UniqueFd& b) {
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) throw std::runtime_error("socketpair");
  a.reset(ends[0]);
  b.reset(ends[1]);
}

RawLink make_raw_link(RawShape shape) {
  RawLink link;
  switch (shape) {
    case RawShape::Socketpair:
      make_socketpair(link.parent_out, link.child_in);
      link.parent_in = link.parent_out.duplicate();
      link.child_out = link.child_in.duplicate();
      break;
    case RawShape::SocketpairPerDirection:
      make_socketpair(link.parent_out, link.child_in);
      make_socketpair(link.child_out, link.parent_in);
      break;
    case RawShape::Pipes: {
      int down[2], up[2];
      if (::pipe2(down, O_CLOEXEC) != 0 || ::pipe2(up, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
      link.child_in.reset(down[0]);
      link.parent_out.reset(down[1]);
      link.parent_in.reset(up[0]);
      link.child_out.reset(up[1]);
      break;
    }
  }
  return link;
}

// Lets a pipe or a socket's send buffer hold a message of `size` bytes, as ferry's writer
// does for a frame larger than the stream holds (a pipe: F_SETPIPE_SZ; a socket: SO_SNDBUF,
// which the kernel doubles); a stream that holds it already keeps its size. A program that
// sends large messages sizes its streams so; without it a 1 MiB message goes out in pieces,
// each a wake-up of both sides. Best effort, as ferry's: a refused size is kept.
void hold_message(int fd, bool socket, std::size_t size) {
  const int wanted = static_cast<int>(size);
  if (!socket) {
    const int capacity = ::fcntl(fd, F_GETPIPE_SZ);
    if (capacity < 0) throw std::runtime_error("F_GETPIPE_SZ");
    if (capacity < wanted && ::fcntl(fd, F_SETPIPE_SZ, wanted) < 0 && errno != EPERM) {
      throw std::runtime_error("F_SETPIPE_SZ");
    }
    return;
  }
  int doubled = 0;
  socklen_t length = sizeof doubled;
  if (::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &doubled, &length) != 0) throw std::runtime_error("SO_SNDBUF");
  if (doubled / 2 < wanted && ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &wanted, sizeof wanted) != 0) {
    throw std::runtime_error("SO_SNDBUF");
  }
}

void raw_bytes_round_trip(benchmark::State& state, RawShape shape, std::size_t size) {
  RawLink link = make_raw_link(shape);
  hold_message(link.parent_out.get(), shape != RawShape::Pipes, size);
  hold_message(link.child_out.get(), shape != RawShape::Pipes, size);
  std::vector<char> buffer(size, 'x');
  {
    RoundTripTimes times(state);
    ChildProcess child([&] {
      link.parent_out.reset();
      link.parent_in.reset();
      std::vector<char> echo(size);
      while (read_all(link.child_in.get(), echo.data(), size)) write_all(link.child_out.get(), echo.data(), size);
    });
    link.child_in.reset();
    link.child_out.reset();
    for (auto _ : state) {
      const auto sample = times.sample();
      write_all(link.parent_out.get(), buffer.data(), size);
      read_all(link.parent_in.get(), buffer.data(), size);
    }
    // EOF ends the child: a socketpair used both ways is shut down for writing, since the
    // parent's other descriptor of it (parent_in) would keep it open.
    if (shape == RawShape::Socketpair) ::shutdown(link.parent_out.get(), SHUT_WR);
    link.parent_out.reset();
    times.report(state);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * size * 2));
}

void send_fd(int socket, int fd) {
  char byte = 'f';
  iovec part{&byte, 1};
  alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int))> control{};
  msghdr message{};
  message.msg_iov = &part;
  message.msg_iovlen = 1;
  message.msg_control = control.data();
  message.msg_controllen = control.size();
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(header), &fd, sizeof fd);
  if (::sendmsg(socket, &message, MSG_NOSIGNAL) != 1) throw std::runtime_error("sendmsg");
}

detail::UniqueFd receive_fd(int socket) {
  char byte = 0;
  iovec part{&byte, 1};
  alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int))> control{};
  msghdr message{};
  message.msg_iov = &part;
  message.msg_iovlen = 1;
  message.msg_control = control.data();
  message.msg_controllen = control.size();
  if (::recvmsg(socket, &message, MSG_CMSG_CLOEXEC) <= 0) return detail::UniqueFd();
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&message)), sizeof fd);
  return detail::UniqueFd(fd);
}

void raw_fd_mmap_round_trip(benchmark::State& state, std::size_t size, bool fresh, RawShape shape) {
  std::vector<detail::SharedMemory> segments;
  // One more than the loop uses: the untimed warm-up round trip takes the first.
  const auto count = fresh ? static_cast<std::size_t>(state.max_iterations) + 1 : 1;
  for (std::size_t i = 0; i < count; ++i) segments.push_back(detail::SharedMemory::create(size));
  std::size_t next = 0;
  RawLink link = make_raw_link(shape);
  {
    ChildProcess child([&] {
      link.parent_out.reset();
      link.parent_in.reset();
      while (detail::UniqueFd fd = receive_fd(link.child_in.get())) {
        detail::Mapping mapping = detail::Mapping::map_shared(fd.get(), size);
        benchmark::DoNotOptimize(mapping.data());
        mapping.reset();
        fd.reset();
        const char ack = 'a';
        write_all(link.child_out.get(), &ack, 1);
      }
    });
    link.child_in.reset();
    link.child_out.reset();
    char ack = 0;
    // Untimed warm-up, as in ferry_tensor_round_trip.
    send_fd(link.parent_out.get(), segments[next].fd());
    read_all(link.parent_in.get(), &ack, 1);
    if (fresh) ++next;
    RoundTripTimes times(state, fresh ? 1 : 16);
    RoundTripTimes send_times(state, fresh ? 1 : 16, "send_p50_ns");
    for (auto _ : state) {
      const auto sample = times.sample();
      {
        const auto send_sample = send_times.sample();
        send_fd(link.parent_out.get(), segments[next].fd());
      }
      read_all(link.parent_in.get(), &ack, 1);
      if (fresh) ++next;
    }
    link.parent_out.reset();
    times.report(state);
    send_times.report(state);
  }
}

// ---- ferry -----------------------------------------------------------------------

struct TensorMessage {
  Tensor tensor;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(tensor);
  }
};

// The two ends of a ping-pong: the parent's (sends Out, receives In) and the child's. Two
// channels, or one duplex connection (`one_connection`).
template <class Out, class In>
std::pair<DuplexEnd<Out, In>, DuplexEnd<In, Out>> make_link(Transport transport, bool one_connection) {
  if (one_connection) return duplex<Out, In>(transport);
  auto [ping_tx, ping_rx] = channel<Out>(transport);
  auto [pong_tx, pong_rx] = channel<In>(transport);
  return {DuplexEnd<Out, In>(std::move(ping_tx), std::move(pong_rx)),
          DuplexEnd<In, Out>(std::move(pong_tx), std::move(ping_rx))};
}

void ferry_bytes_round_trip(benchmark::State& state, Transport transport, bool one_connection, std::size_t size) {
  using Bytes = std::vector<std::uint8_t>;
  auto [parent, child_end] = make_link<Bytes, Bytes>(transport, one_connection);
  {
    // Structured bindings are named explicitly: clang 14 cannot capture them implicitly.
    ChildProcess child([&, &parent = parent, &child_end = child_end] {
      parent.detach();
      child_end.adopt();
      while (auto message = child_end.recv()) child_end.send(*message);
      child_end.close();
    });
    child_end.detach();
    Bytes message(size, 1);
    RoundTripTimes times(state);
    for (auto _ : state) {
      const auto sample = times.sample();
      message = *parent.call(message);
    }
    parent.close();
    times.report(state);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * size * 2));
}

void ferry_tensor_round_trip(benchmark::State& state, Transport transport, bool one_connection, bool new_storage,
                             std::int64_t size) {
  auto [parent, child_end] = make_link<TensorMessage, std::uint8_t>(transport, one_connection);
  {
    // Structured bindings are named explicitly: clang 14 cannot capture them implicitly.
    ChildProcess child([&, &parent = parent, &child_end = child_end] {
      parent.detach();
      child_end.adopt();
      while (auto message = child_end.recv()) child_end.send(static_cast<std::uint8_t>(message->tensor.numel() & 1));
      child_end.close();
    });
    child_end.detach();
    // Creating a segment (memfd_create, fallocate, seal, mmap) and giving its pages back
    // to the kernel are the allocator's costs, not the transport's: the new storages are
    // made before the timed loop and freed after it. Making them inside the loop would
    // also leave the peer idle for milliseconds, and a VM's idle vCPU wakes up slowly.
    std::vector<Tensor> tensors;
    const auto count = new_storage ? static_cast<std::size_t>(state.max_iterations) + 1 : 1;
    for (std::size_t i = 0; i < count; ++i) tensors.push_back(Tensor::empty({size}, DType::UInt8, Device::SharedCpu));
    std::size_t next = 0;
    // One untimed round trip first (with a storage of its own): the first frame of a
    // connection also carries its return board, and the peer, idle while the storages
    // were made, wakes up slowly. Rows of large storages run only 10 to 40 iterations,
    // over which that one-off cost (hundreds of microseconds) would be spread.
    benchmark::DoNotOptimize(parent.call(TensorMessage{tensors[next]}));
    if (new_storage) ++next;
    RoundTripTimes times(state, new_storage ? 1 : 16);
    RoundTripTimes send_times(state, new_storage ? 1 : 16, "send_p50_ns");
    for (auto _ : state) {
      const auto sample = times.sample();
      {
        const auto send_sample = send_times.sample();
        parent.send(TensorMessage{tensors[next]});
      }
      benchmark::DoNotOptimize(parent.recv());
      if (new_storage) ++next;
    }
    parent.close();
    times.report(state);
    send_times.report(state);
  }
}

// ---- registration ----------------------------------------------------------------

std::string transport_label(Transport transport) { return std::string(transport_name(transport)); }

// Each kept storage holds an fd in both processes: allow as many as the hard limit.
void raise_fd_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

// Rows that pass a new storage each time make all of them before the loop and keep them
// alive until it ends; segments of 64 MiB and more take milliseconds to create, so these
// rows run a fixed, smaller number of iterations.
std::int64_t new_storage_iterations(std::int64_t size) {
  return size >= (256 << 20) ? 10 : size >= (64 << 20) ? 40 : size >= (1 << 20) ? 300 : 1000;
}

const bool registered = [] {
  raise_fd_limit();
  const std::pair<RawShape, const char*> raw_links[] = {
      {RawShape::Pipes, "pipe"},
      {RawShape::Socketpair, "unix_socket"},
      {RawShape::SocketpairPerDirection, "unix_socket_pair_per_direction"}};
  for (const auto& [shape, name] : raw_links) {
    for (const std::int64_t size : {64, 4096, 65536, 1 << 20}) {
      if (shape == RawShape::SocketpairPerDirection && size == 4096) continue;
      benchmark::RegisterBenchmark(("roundtrip/raw/" + std::string(name) + "/bytes/" + std::to_string(size)).c_str(),
                                   raw_bytes_round_trip, shape, static_cast<std::size_t>(size));
    }
  }
  for (const std::int64_t size : {4096, 1 << 20, 64 << 20, 256 << 20}) {
    benchmark::RegisterBenchmark(("roundtrip/raw/unix_socket/fd_mmap/" + std::to_string(size)).c_str(),
                                 raw_fd_mmap_round_trip, static_cast<std::size_t>(size), false, RawShape::Socketpair);
    benchmark::RegisterBenchmark(("roundtrip/raw/unix_socket/fd_mmap_new/" + std::to_string(size)).c_str(),
                                 raw_fd_mmap_round_trip, static_cast<std::size_t>(size), true, RawShape::Socketpair)
        ->Iterations(new_storage_iterations(size));
    // Not a goal's baseline: the same with a socketpair per direction, to tell how much of a
    // difference to ferry (two channels) is the link's shape.
    benchmark::RegisterBenchmark(
        ("roundtrip/raw/unix_socket/fd_mmap_new_pair_per_direction/" + std::to_string(size)).c_str(),
        raw_fd_mmap_round_trip, static_cast<std::size_t>(size), true, RawShape::SocketpairPerDirection)
        ->Iterations(new_storage_iterations(size));
  }
  // Ping and pong over two channels (pipe, unix_socket), or over one duplex connection
  // (unix_socket_duplex: one socketpair both ways, as the raw socket baselines).
  const std::pair<Transport, bool> links[] = {
      {Transport::Pipe, false}, {Transport::UnixSocket, false}, {Transport::UnixSocket, true}};
  for (const auto& [transport, one_connection] : links) {
    const std::string name = transport_label(transport) + (one_connection ? "_duplex" : "");
    for (const std::int64_t size : {64, 4096, 65536, 1 << 20}) {
      if (one_connection && size == 4096) continue;
      benchmark::RegisterBenchmark(("roundtrip/ferry/" + name + "/bytes/" + std::to_string(size)).c_str(),
                                   ferry_bytes_round_trip, transport, one_connection, static_cast<std::size_t>(size));
    }
    for (const std::int64_t size : {4096, 1 << 20, 64 << 20, 256 << 20}) {
      benchmark::RegisterBenchmark(("roundtrip/ferry/" + name + "/tensor_new/" + std::to_string(size)).c_str(),
                                   ferry_tensor_round_trip, transport, one_connection, true, size)
          ->Iterations(new_storage_iterations(size));
      benchmark::RegisterBenchmark(("roundtrip/ferry/" + name + "/tensor_same/" + std::to_string(size)).c_str(),
                                   ferry_tensor_round_trip, transport, one_connection, false, size);
    }
  }
  return true;
}();

}  // namespace
}  // namespace ferry::bench
