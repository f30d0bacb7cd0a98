// ucx:// endpoints against raw TCP on loopback, side by side (ferry_ucx_bench; run it with
// --benchmark_repetitions=5 and compare medians). The peer is a thread of this process on
// the other CPU (a fork child of a process that used UCX must not touch UCX), both for
// ferry and for the baselines. UCX_TLS defaults to tcp here (as across hosts without RDMA).
// Names:
//   ucx/raw_tcp/round_trip/64B           64 B ping-pong over a TCP socket (TCP_NODELAY), blocking reads
//   ucx/ferry/round_trip/64B             a 64 B message and back over a ucx:// duplex connection
//   ucx/raw_tcp/round_trip/{1MiB,64MiB}  N bytes each way over TCP, each side reading into its buffer
//   ucx/ferry/round_trip/{1MiB,64MiB}    a tensor of N bytes and back (the peer sends back what it got)
//   ucx/raw_tcp/stream/64MiB             64 MiB blocks one way, received straight into a memfd mapping
//   ucx/ferry/stream/64MiB               64 MiB tensors one way (the receiver drops each)
#include <benchmark/benchmark.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.hpp"

namespace ferry::bench::ucx {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t kMiB = std::size_t{1} << 20;

// UCX reads its environment when it starts: pick TCP before the first ucx:// end.
const bool kTcpChosen = [] { return ::setenv("UCX_TLS", "tcp", 0) == 0; }();

void pin_to(unsigned cpu) {
  const unsigned cpus = std::thread::hardware_concurrency();
  if (cpus < 2) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % cpus, &set);
  (void)::pthread_setaffinity_np(::pthread_self(), sizeof set, &set);
}
void unpin() {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (unsigned cpu = 0; cpu < std::thread::hardware_concurrency(); ++cpu) CPU_SET(cpu, &set);
  (void)::pthread_setaffinity_np(::pthread_self(), sizeof set, &set);
}
unsigned last_cpu() { return std::thread::hardware_concurrency() - 1; }

// ---- raw TCP -----------------------------------------------------------------------------

struct TcpPair {
  UniqueFd a;
  UniqueFd b;
};

void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string(what) + ": " + std::strerror(errno));
}

TcpPair tcp_pair() {
  UniqueFd listening(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  check(bool(listening), "socket");
  sockaddr_in where{};
  where.sin_family = AF_INET;
  where.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  check(::bind(listening.get(), reinterpret_cast<sockaddr*>(&where), sizeof where) == 0, "bind");
  check(::listen(listening.get(), 1) == 0, "listen");
  socklen_t length = sizeof where;
  check(::getsockname(listening.get(), reinterpret_cast<sockaddr*>(&where), &length) == 0, "getsockname");
  TcpPair pair;
  pair.a = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  check(::connect(pair.a.get(), reinterpret_cast<sockaddr*>(&where), sizeof where) == 0, "connect");
  pair.b = UniqueFd(::accept4(listening.get(), nullptr, nullptr, SOCK_CLOEXEC));
  check(bool(pair.b), "accept");
  const int on = 1;
  for (int fd : {pair.a.get(), pair.b.get()}) {
    check(::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on) == 0, "TCP_NODELAY");
  }
  return pair;
}

bool write_all(int fd, const std::byte* data, std::size_t bytes) {
  while (bytes > 0) {
    const ssize_t sent = ::send(fd, data, bytes, MSG_NOSIGNAL);
    if (sent <= 0) {
      if (sent < 0 && errno == EINTR) continue;
      return false;
    }
    data += sent;
    bytes -= static_cast<std::size_t>(sent);
  }
  return true;
}
bool read_all(int fd, std::byte* data, std::size_t bytes) {
  while (bytes > 0) {
    const ssize_t got = ::recv(fd, data, bytes, 0);
    if (got <= 0) {
      if (got < 0 && errno == EINTR) continue;
      return false;
    }
    data += got;
    bytes -= static_cast<std::size_t>(got);
  }
  return true;
}

void raw_round_trip(benchmark::State& state, std::size_t bytes) {
  TcpPair pair = tcp_pair();
  std::thread peer([&, fd = pair.b.get()] {
    pin_to(last_cpu());
    std::vector<std::byte> buffer(bytes);
    while (read_all(fd, buffer.data(), bytes) && write_all(fd, buffer.data(), bytes)) {
    }
  });
  pin_to(0);
  std::vector<std::byte> out(bytes, std::byte{1});
  std::vector<std::byte> in(bytes);
  for (auto _ : state) {
    if (!write_all(pair.a.get(), out.data(), bytes) || !read_all(pair.a.get(), in.data(), bytes)) {
      state.SkipWithError("raw TCP peer went away");
      break;
    }
  }
  ::shutdown(pair.a.get(), SHUT_RDWR);
  peer.join();
  unpin();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes * 2));
}

// 64 MiB blocks one way; the reader receives each straight into a memfd mapping.
void raw_stream(benchmark::State& state, std::size_t bytes) {
  TcpPair pair = tcp_pair();
  std::thread reader([&, fd = pair.b.get()] {
    pin_to(last_cpu());
    UniqueFd memfd(::memfd_create("ferry-ucx-bench", MFD_CLOEXEC));
    if (!memfd || ::ftruncate(memfd.get(), static_cast<off_t>(bytes)) != 0) return;
    void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0);
    if (mapped == MAP_FAILED) return;
    std::byte one{};
    while (read_all(fd, static_cast<std::byte*>(mapped), bytes)) {
      if (!write_all(fd, &one, 1)) break;  // one byte per block: the writer's iteration ends with its block
    }
    ::munmap(mapped, bytes);
  });
  pin_to(0);
  std::vector<std::byte> block(bytes, std::byte{3});
  std::byte ack{};
  for (auto _ : state) {
    if (!write_all(pair.a.get(), block.data(), bytes) || !read_all(pair.a.get(), &ack, 1)) {
      state.SkipWithError("raw TCP reader went away");
      break;
    }
  }
  ::shutdown(pair.a.get(), SHUT_RDWR);
  reader.join();
  unpin();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

// ---- ferry over ucx:// ---------------------------------------------------------------------

struct Bytes64 {
  std::array<std::uint8_t, 64> bytes{};
  template <class Archive>
  void serialize(Archive& ar) {
    ar(bytes);
  }
};
struct TensorMessage {
  Tensor tensor;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(tensor);
  }
};

EndpointOptions bench_options() {
  EndpointOptions options;
  options.secret = "ferry ucx bench";
  options.on_refusal = [](const std::string&) {};
  options.channel.close_linger = 5s;
  return options;
}

// A connected pair of duplex ends: `near` here, `far` for the peer thread.
template <class T>
struct UcxPair {
  Listener listener;
  DuplexEnd<T, T> near;
  DuplexEnd<T, T> far;
  UcxPair() {
    (void)kTcpChosen;
    listener = listen("ucx://127.0.0.1:0", bench_options());
    const std::string address = listener.address();
    std::thread client([&] { far = connect_duplex<T, T>(address, bench_options()); });
    auto accepted = listener.accept_duplex_for<T, T>(10s);
    client.join();
    if (!accepted) throw std::runtime_error("no ucx:// client");
    near = std::move(*accepted);
  }
};

template <class T>
void ferry_round_trip(benchmark::State& state, const T& message, std::size_t bytes) {
  UcxPair<T> pair;
  std::thread peer([&] {
    pin_to(last_cpu());
    try {
      while (auto got = pair.far.recv()) pair.far.send(*got);  // back what it got
    } catch (const Error&) {
    }
  });
  pin_to(0);
  for (auto _ : state) {
    pair.near.send(message);
    auto back = pair.near.recv();
    if (!back) {
      state.SkipWithError("the ucx:// peer went away");
      break;
    }
    benchmark::DoNotOptimize(back);
  }
  pair.near.close();
  peer.join();
  unpin();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes * 2));
}

void ferry_stream(benchmark::State& state, std::size_t bytes) {
  UcxPair<TensorMessage> pair;
  std::thread reader([&] {
    pin_to(last_cpu());
    try {
      while (auto got = pair.far.recv()) benchmark::DoNotOptimize(got->tensor.data_ptr());
    } catch (const Error&) {
    }
  });
  pin_to(0);
  const TensorMessage message{Tensor::zeros({static_cast<std::int64_t>(bytes)}, DType::UInt8, Device::SharedCpu)};
  for (auto _ : state) pair.near.send(message);  // returns once the reader took the tensor (rendezvous)
  pair.near.close();
  reader.join();
  unpin();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

TensorMessage tensor_of(std::size_t bytes) {
  return TensorMessage{Tensor::zeros({static_cast<std::int64_t>(bytes)}, DType::UInt8, Device::SharedCpu)};
}

void BM_raw_rt_64(benchmark::State& state) { raw_round_trip(state, 64); }
void BM_ferry_rt_64(benchmark::State& state) { ferry_round_trip(state, Bytes64{}, 64); }
void BM_raw_rt_1MiB(benchmark::State& state) { raw_round_trip(state, kMiB); }
void BM_ferry_rt_1MiB(benchmark::State& state) { ferry_round_trip(state, tensor_of(kMiB), kMiB); }
void BM_raw_rt_64MiB(benchmark::State& state) { raw_round_trip(state, 64 * kMiB); }
void BM_ferry_rt_64MiB(benchmark::State& state) { ferry_round_trip(state, tensor_of(64 * kMiB), 64 * kMiB); }
void BM_raw_stream_64MiB(benchmark::State& state) { raw_stream(state, 64 * kMiB); }
void BM_ferry_stream_64MiB(benchmark::State& state) { ferry_stream(state, 64 * kMiB); }

BENCHMARK(BM_raw_rt_64)->Name("ucx/raw_tcp/round_trip/64B")->UseRealTime();
BENCHMARK(BM_ferry_rt_64)->Name("ucx/ferry/round_trip/64B")->UseRealTime();
BENCHMARK(BM_raw_rt_1MiB)->Name("ucx/raw_tcp/round_trip/1MiB")->UseRealTime();
BENCHMARK(BM_ferry_rt_1MiB)->Name("ucx/ferry/round_trip/1MiB")->UseRealTime();
BENCHMARK(BM_raw_rt_64MiB)->Name("ucx/raw_tcp/round_trip/64MiB")->UseRealTime()->Iterations(20);
BENCHMARK(BM_ferry_rt_64MiB)->Name("ucx/ferry/round_trip/64MiB")->UseRealTime()->Iterations(20);
BENCHMARK(BM_raw_stream_64MiB)->Name("ucx/raw_tcp/stream/64MiB")->UseRealTime()->Iterations(20);
BENCHMARK(BM_ferry_stream_64MiB)->Name("ucx/ferry/stream/64MiB")->UseRealTime()->Iterations(20);

}  // namespace
}  // namespace ferry::bench::ucx
