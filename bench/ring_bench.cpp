// The shared-memory ring (and the in-process queue) against raw baselines written here:
// a plain shared-memory busy-poll ping-pong, a plain futex ping-pong, a plain Unix socket
// ping-pong, and single-thread memcpy bandwidth.
//
// Every cross-process benchmark forks its peer before the timing loop; times are wall
// clock (UseRealTime), the memcpy baseline's too, so that a stream and the bandwidth it is
// compared with lose the same share to other work on a shared machine. Where there are two
// CPUs or more, the benchmark process runs on the first CPU and its peer on the last one
// while a benchmark runs (as bench/support/child_process does), so that every ping-pong,
// ferry's and the raw baselines', crosses two cores; FERRY_BENCH_PIN=0 in the environment
// leaves both to the scheduler. Run, for medians of 5 repetitions:
//   build/release/bench/ferry_bench --benchmark_filter='Ring|Raw|InProcess'
#include <benchmark/benchmark.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ferry/detail/frame.hpp"
#include "ferry/detail/transport.hpp"
#include "ferry/ferry.hpp"
#include "ring/ring_end.hpp"
#include "support/round_trip_times.hpp"
#include "support/tensor_message.hpp"

namespace ferry {
namespace {

using bench::TensorMessage;

using namespace std::chrono_literals;
using Bytes = std::vector<std::uint8_t>;

constexpr int kRepetitions = 5;

// Ring ends that spin "forever" (1 s) before sleeping, or sleep at once. The ring holds
// at least four messages of `message_bytes` (1 MiB, the default capacity, at least).
ChannelOptions ring_options(bool spinning, std::size_t message_bytes = 0) {
  ChannelOptions options;
  options.ring_spin = spinning ? std::chrono::nanoseconds(1s) : std::chrono::nanoseconds::zero();
  options.ring_capacity = std::max(options.ring_capacity, 4 * message_bytes);
  return options;
}

bool pinning() {
  static const bool pin = [] {
    const char* value = std::getenv("FERRY_BENCH_PIN");
    if (value != nullptr && std::string(value) == "0") return false;
    return std::thread::hardware_concurrency() > 1;
  }();
  return pin;
}

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  (void)::sched_setaffinity(0, sizeof set, &set);  // best effort: a benchmark, not a test
}

// Unless FERRY_BENCH_PIN=0: this process on the first CPU until destroyed (the
// peer, forked meanwhile, moves itself to the last one).
class ScopedPin {
 public:
  ScopedPin() {
    if (!pinning()) return;
    (void)::sched_getaffinity(0, sizeof saved_, &saved_);
    pinned_ = true;
    pin_to(first_cpu());
  }
  ~ScopedPin() {
    if (pinned_) (void)::sched_setaffinity(0, sizeof saved_, &saved_);
  }
  ScopedPin(const ScopedPin&) = delete;
  ScopedPin& operator=(const ScopedPin&) = delete;
  static int first_cpu() { return 0; }
  static int last_cpu() { return static_cast<int>(std::thread::hardware_concurrency()) - 1; }

 private:
  cpu_set_t saved_{};
  bool pinned_ = false;
};

// Forks a child that runs `body` and exits without running this process's exit handlers.
template <class Body>
pid_t fork_peer(const Body& body) {
  const pid_t pid = ::fork();
  if (pid < 0) std::abort();
  if (pid == 0) {
    if (pinning()) pin_to(ScopedPin::last_cpu());
    int status = 0;
    try {
      body();
    } catch (const std::exception& error) {
      std::fprintf(stderr, "benchmark peer failed: %s\n", error.what());
      status = 1;
    }
    ::_exit(status);
  }
  return pid;
}

// Waits for the peer; returns the CPU time it used in all (user and system), in seconds.
double reap(pid_t pid, benchmark::State& state) {
  int status = 0;
  rusage usage{};
  ::wait4(pid, &status, 0, &usage);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) state.SkipWithError("the peer process failed");
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

using bench::RoundTripTimes;  // one round trip in 16 timed: bench/support/round_trip_times.hpp

// ---- ferry: ping-pong over a pair of channels ----------------------------------------------

constexpr int kWarmupRoundTrips = 4;

// Round trip of a message of T: the child echoes every message back. `make` returns the
// message to send (a reference to one kept by the caller, for plain bytes: sending does not
// copy the caller's vector, as the raw baselines copy from a buffer they keep).
// With `via_selector`, the parent waits for each echo in a Selector before it reads it.
template <class T, class Make>
void ping_pong(benchmark::State& state, Transport transport, const ChannelOptions& options, const Make& make,
               bool via_selector = false) {
  const ScopedPin pin;
  auto [to_child, child_in] = channel<T>(transport, options);
  auto [child_out, from_child] = channel<T>(transport, options);
  const pid_t child =
      fork_peer([&, &to_child = to_child, &child_in = child_in, &child_out = child_out, &from_child = from_child] {
        to_child.detach();
        from_child.close();
        child_out.adopt();
        // The echo holds each message until the next one arrives, as a worker holds its
        // current batch: a storage it sends back then stays the same Storage (a lease hit).
        std::optional<T> previous;
        while (auto message = child_in.recv()) {
          child_out.send(*message);
          previous = std::move(message);
        }
        child_out.close();
      });
  child_in.close();
  child_out.detach();
  // Warm-up: maps, the first type-name frame, and every block a steady loop keeps in flight
  // (a new storage each step: the one sent, the one the echo holds, the one coming back), so
  // that a row of large storages does not time the creation of its segments: one such
  // round trip can outlast the minimum time, and Google Benchmark would then time only it.
  for (int step = 0; step < kWarmupRoundTrips; ++step) {
    to_child.send(make());
    from_child.recv();
  }
  Selector selector;
  if (via_selector) selector.add(from_child);
  RoundTripTimes times(state);
  for (auto _ : state) {
    const auto sample = times.sample();
    to_child.send(make());
    if (via_selector) selector.wait();
    auto back = from_child.recv();
    benchmark::DoNotOptimize(back);
  }
  times.report(state);
  to_child.close();
  while (from_child.recv()) {
  }
  reap(child, state);
}

void BM_RingRoundTripBytes(benchmark::State& state) {
  const auto size = static_cast<std::size_t>(state.range(0));
  const Bytes message(size, 7);
  ping_pong<Bytes>(state, Transport::ShmRing, ring_options(state.range(1) != 0, size),
                   [&]() -> const Bytes& { return message; });
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * size * 2));
}
BENCHMARK(BM_RingRoundTripBytes)
    ->ArgNames({"bytes", "spinning"})
    ->Args({64, 1})
    ->Args({64, 0})
    ->Args({4096, 1})
    ->Args({64 << 10, 1})
    ->Args({1 << 20, 1})
    ->UseRealTime()
    ->Repetitions(kRepetitions)
    ->ReportAggregatesOnly(true);

// A 64 B message's frame (its header and a 72-byte body), written from and read into the
// same bytes, with what reading it needs kept from frame to frame.
class RingFrame {
 public:
  RingFrame() { header_.body_bytes = body_.size(); }
  void write(detail::FrameWriter& writer) {
    const std::array<iovec, 2> parts{iovec{&header_, sizeof header_}, iovec{body_.data(), body_.size()}};
    writer.write(parts, {}, detail::Deadline::never());
  }
  // Reads the next frame in place into the body; false at the end of the stream.
  bool read(detail::FrameReader& reader) {
    std::span<const std::byte> payload;
    detail::FrameHeader header;
    if (reader.read_view(header, payload, buffer_, fds_, detail::Deadline::never()) != ReadStatus::Frame) return false;
    std::memcpy(body_.data(), payload.data(), std::min(payload.size(), body_.size()));
    reader.release();
    return true;
  }

 private:
  detail::FrameHeader header_;
  std::array<std::byte, 72> body_{};
  std::vector<std::byte> buffer_;
  std::deque<detail::UniqueFd> fds_;
};

// The ring alone, without a channel's encoding and decoding: a RingFrame written with the
// writer and read in place with the reader of make_transport(), echoed back. The gap between
// this row and BM_RingRoundTripBytes/bytes:64/spinning:1 is the channel's own work; the gap
// between this row and BM_RawShmBusyPollRoundTrip is the ring's.
void BM_RingFrameRoundTrip(benchmark::State& state) {
  const ScopedPin pin;
  const RingTiming timing{.spin = std::chrono::seconds(1)};
  auto [to_child, child_in] =
      detail::make_transport(Transport::ShmRing, FrameLimits{}, ChannelOptions{}.ring_capacity, timing);
  auto [child_out, from_child] =
      detail::make_transport(Transport::ShmRing, FrameLimits{}, ChannelOptions{}.ring_capacity, timing);
  const pid_t child =
      fork_peer([&, &to_child = to_child, &child_in = child_in, &child_out = child_out, &from_child = from_child] {
        to_child->close();
        from_child->close();
        RingFrame echo;
        while (echo.read(*child_in)) echo.write(*child_out);
      });
  child_in->close();
  child_out->close();
  RingFrame frame;
  RoundTripTimes times(state);
  for (auto _ : state) {
    const auto sample = times.sample();
    frame.write(*to_child);
    frame.read(*from_child);
  }
  times.report(state);
  detail::FrameHeader close_header;
  close_header.kind = static_cast<std::uint8_t>(detail::FrameKind::Close);
  const std::array<iovec, 1> close_parts{iovec{&close_header, sizeof close_header}};
  to_child->write(close_parts, {}, detail::Deadline::never());
  to_child->close();
  reap(child, state);
}
BENCHMARK(BM_RingFrameRoundTrip)->UseRealTime()->Repetitions(kRepetitions)->ReportAggregatesOnly(true);

// The default options: adaptive spinning (20 us at most), then the futex.
void BM_RingRoundTripBytesDefaultSpin(benchmark::State& state) {
  const Bytes message(static_cast<std::size_t>(state.range(0)), 7);
  ping_pong<Bytes>(state, Transport::ShmRing, ChannelOptions{}, [&]() -> const Bytes& { return message; });
}
BENCHMARK(BM_RingRoundTripBytesDefaultSpin)
    ->ArgNames({"bytes"})
    ->Arg(64)
    ->UseRealTime()
    ->Repetitions(kRepetitions)
    ->ReportAggregatesOnly(true);

// The same 64 B round trip with both ends sleeping at once, the parent waiting for the echo
// in a Selector (as a collector fanning in from workers does): compare with
// BM_RingRoundTripBytes/bytes:64/spinning:0, where it waits in recv().
void BM_RingRoundTripViaSelector(benchmark::State& state) {
  const Bytes message(64, 7);
  ping_pong<Bytes>(
      state, Transport::ShmRing, ring_options(false, message.size()), [&]() -> const Bytes& { return message; }, true);
}
BENCHMARK(BM_RingRoundTripViaSelector)->UseRealTime()->Repetitions(kRepetitions)->ReportAggregatesOnly(true);

void BM_UnixSocketRoundTripBytes(benchmark::State& state) {
  const Bytes message(static_cast<std::size_t>(state.range(0)), 7);
  ping_pong<Bytes>(state, Transport::UnixSocket, ChannelOptions{}, [&]() -> const Bytes& { return message; });
}
BENCHMARK(BM_UnixSocketRoundTripBytes)
    ->ArgNames({"bytes"})
    ->Arg(64)
    ->UseRealTime()
    ->Repetitions(kRepetitions)
    ->ReportAggregatesOnly(true);

// One shared tensor per message, echoed back: a new storage each time (the receiver maps
// it, the sender allocates and reserves it), or the same storage (a lease: no fd, no mmap).
void BM_RingRoundTripSharedTensor(benchmark::State& state) {
  const auto size = state.range(0);
  const bool same = state.range(1) != 0;
  const Tensor fixed = Tensor::empty({size}, DType::UInt8, Device::SharedCpu);
  ping_pong<TensorMessage>(state, Transport::ShmRing, ring_options(true), [&] {
    return TensorMessage{same ? fixed : Tensor::empty({size}, DType::UInt8, Device::SharedCpu)};
  });
}
BENCHMARK(BM_RingRoundTripSharedTensor)
    ->ArgNames({"bytes", "same_storage"})
    ->ArgsProduct({{4 << 10, 1 << 20, 64 << 20, 256 << 20, 1 << 30}, {0, 1}})
    ->UseRealTime()
    ->Repetitions(kRepetitions)
    ->ReportAggregatesOnly(true);

// One-way stream: batches of messages, each batch acknowledged by the receiver, so that
// the time includes draining the ring. The ring holds four messages (1 MiB at least).
void BM_RingStreamBytes(benchmark::State& state) {
  const auto size = static_cast<std::size_t>(state.range(0));
  const int batch = size <= 4096 ? 4096 : 64;
  const ScopedPin pin;
  const Bytes message(size, 7);
  // spinning:0 is the default waiting (adaptive spin, then the futex).
  ChannelOptions options = state.range(1) != 0 ? ring_options(true, size) : ChannelOptions{};
  options.ring_capacity = std::max(options.ring_capacity, 4 * size);
  auto [to_child, child_in] = channel<Bytes>(Transport::ShmRing, options);
  auto [child_out, from_child] = channel<int>(Transport::ShmRing, options);
  const pid_t child =
      fork_peer([&, &to_child = to_child, &child_in = child_in, &child_out = child_out, &from_child = from_child] {
        to_child.detach();
        from_child.close();
        child_out.adopt();
        int received = 0;
        while (auto got = child_in.recv()) {
          benchmark::DoNotOptimize(got->data());
          if (++received % batch == 0) child_out.send(received);
        }
        child_out.close();
      });
  child_in.close();
  child_out.detach();
  for (auto _ : state) {
    for (int i = 0; i < batch; ++i) to_child.send(message);
    from_child.recv();
  }
  to_child.close();
  while (from_child.recv()) {
  }
  // The receiver's CPU time per iteration, next to the sender's (cpu_time): on a machine
  // shared with other work, the wall-clock rate also counts the time either waited for a CPU.
  const double receiver_cpu = reap(child, state);
  state.counters["receiver_cpu_ns"] = receiver_cpu * 1e9 / static_cast<double>(state.iterations());
  state.SetItemsProcessed(state.iterations() * batch);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * batch * size));
}
BENCHMARK(BM_RingStreamBytes)
    ->ArgNames({"bytes", "spinning"})
    ->ArgsProduct({{64, 1 << 20}, {0, 1}})
    ->UseRealTime()
    ->Repetitions(kRepetitions)
    ->ReportAggregatesOnly(true);

// Send and receive a message in one thread: the software cost of a ring message without
// cross-core traffic or scheduling (robust on a loaded machine).
void BM_RingSendRecvOneThread(benchmark::State& state) {
  const Bytes message(static_cast<std::size_t>(state.range(0)), 7);
  auto [tx, rx] = channel<Bytes>(Transport::ShmRing);
  for (auto _ : state) {
    tx.send(message);
    auto back = rx.recv();
    benchmark::DoNotOptimize(back);
  }
}
BENCHMARK(BM_RingSendRecvOneThread)
    ->ArgNames({"bytes"})
    ->Arg(64)
    ->Repetitions(kRepetitions)
    ->ReportAggregatesOnly(true);

// The same with one shared tensor (the same storage every time: a lease hit).
void BM_RingSendRecvOneThreadSharedTensor(benchmark::State& state) {
  const Tensor fixed = Tensor::empty({state.range(0)}, DType::UInt8, Device::SharedCpu);
  auto [tx, rx] = channel<TensorMessage>(Transport::ShmRing);
  for (auto _ : state) {
    tx.send(TensorMessage{fixed});
    auto back = rx.recv();
    benchmark::DoNotOptimize(back);
  }
}
BENCHMARK(BM_RingSendRecvOneThreadSharedTensor)
    ->ArgNames({"bytes"})
    ->Arg(4 << 10)
    ->Arg(256 << 20)
    ->Repetitions(kRepetitions)
    ->ReportAggregatesOnly(true);

// ---- in-process queue: ping-pong between two threads -----------------------------------------

void BM_InProcessRoundTripBytes(benchmark::State& state) {
  const Bytes message(static_cast<std::size_t>(state.range(0)), 7);
  auto [to_echo, echo_in] = channel<Bytes>(Transport::InProcess);
  auto [echo_out, from_echo] = channel<Bytes>(Transport::InProcess);
  std::thread echo([&echo_in = echo_in, &echo_out = echo_out] {
    while (auto got = echo_in.recv()) echo_out.send(std::move(*got));
    echo_out.close();
  });
  for (auto _ : state) {
    to_echo.send(message);
    auto back = from_echo.recv();
    benchmark::DoNotOptimize(back);
  }
  to_echo.close();
  while (from_echo.recv()) {
  }
  echo.join();
}
BENCHMARK(BM_InProcessRoundTripBytes)
    ->ArgNames({"bytes"})
    ->Arg(64)
    ->UseRealTime()
    ->Repetitions(kRepetitions)
    ->ReportAggregatesOnly(true);

// ---- raw baselines ---------------------------------------------------------------------------

// Shared anonymous memory for two processes, unmapped when the benchmark ends.
class SharedPage {
 public:
  SharedPage() : data_(::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0)) {
    if (data_ == MAP_FAILED) std::abort();
  }
  ~SharedPage() { ::munmap(data_, kSize); }
  SharedPage(const SharedPage&) = delete;
  SharedPage& operator=(const SharedPage&) = delete;
  template <class T>
  T* at(std::size_t offset) const {
    return reinterpret_cast<T*>(static_cast<char*>(data_) + offset);
  }

 private:
  static constexpr std::size_t kSize = 4096;
  void* data_;
};

// Two flags on separate lines plus a 64-byte payload copied each way; both sides spin.
void BM_RawShmBusyPollRoundTrip(benchmark::State& state) {
  const ScopedPin pin;
  SharedPage page;
  auto* ping = new (page.at<void>(0)) std::atomic<std::uint64_t>(0);
  auto* pong = new (page.at<void>(128)) std::atomic<std::uint64_t>(0);
  auto* ping_data = page.at<char>(256);
  auto* pong_data = page.at<char>(384);
  const pid_t child = fork_peer([&] {
    char local[64];
    for (std::uint64_t seen = 0;;) {
      std::uint64_t now;
      while ((now = ping->load(std::memory_order_acquire)) == seen) detail::cpu_relax();
      if (now == ~std::uint64_t{0}) return;
      seen = now;
      std::memcpy(local, ping_data, sizeof local);
      std::memcpy(pong_data, local, sizeof local);
      pong->store(now, std::memory_order_release);
    }
  });
  char message[64] = {1};
  char back[64];
  std::uint64_t round = 0;
  RoundTripTimes times(state);
  for (auto _ : state) {
    const auto sample = times.sample();
    ++round;
    std::memcpy(ping_data, message, sizeof message);
    ping->store(round, std::memory_order_release);
    while (pong->load(std::memory_order_acquire) != round) detail::cpu_relax();
    std::memcpy(back, pong_data, sizeof back);
    benchmark::DoNotOptimize(back);
  }
  times.report(state);
  ping->store(~std::uint64_t{0}, std::memory_order_release);
  reap(child, state);
}
BENCHMARK(BM_RawShmBusyPollRoundTrip)->UseRealTime()->Repetitions(kRepetitions)->ReportAggregatesOnly(true);

long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value) {
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, nullptr, nullptr, 0);
}

// Two futex words; each side sleeps on its word until the other bumps it and wakes it.
void BM_RawFutexRoundTrip(benchmark::State& state) {
  const ScopedPin pin;
  SharedPage page;
  auto* ping = new (page.at<void>(0)) std::atomic<std::uint32_t>(0);
  auto* pong = new (page.at<void>(128)) std::atomic<std::uint32_t>(0);
  auto wait_for = [](std::atomic<std::uint32_t>* word, std::uint32_t old) {
    std::uint32_t now;
    while ((now = word->load(std::memory_order_acquire)) == old) futex(word, FUTEX_WAIT, old);
    return now;
  };
  const pid_t child = fork_peer([&] {
    for (std::uint32_t seen = 0;;) {
      seen = wait_for(ping, seen);
      if (seen == ~std::uint32_t{0}) return;
      pong->store(seen, std::memory_order_release);
      futex(pong, FUTEX_WAKE, 1);
    }
  });
  std::uint32_t round = 0;
  RoundTripTimes times(state);
  for (auto _ : state) {
    const auto sample = times.sample();
    ping->store(++round, std::memory_order_release);
    futex(ping, FUTEX_WAKE, 1);
    wait_for(pong, round - 1);
  }
  times.report(state);
  ping->store(~std::uint32_t{0}, std::memory_order_release);
  futex(ping, FUTEX_WAKE, 1);
  reap(child, state);
}
BENCHMARK(BM_RawFutexRoundTrip)->UseRealTime()->Repetitions(kRepetitions)->ReportAggregatesOnly(true);

// 64 bytes each way over a Unix stream socket pair.
void BM_RawUnixSocketRoundTrip(benchmark::State& state) {
  const ScopedPin pin;
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) std::abort();
  detail::UniqueFd parent_end(ends[0]);
  detail::UniqueFd child_end(ends[1]);
  auto exchange = [](int fd, char* buffer, bool send_first) {
    auto read_all = [&] {
      for (std::size_t got = 0; got < 64;) {
        const ssize_t n = ::read(fd, buffer + got, 64 - got);
        if (n <= 0) return false;
        got += static_cast<std::size_t>(n);
      }
      return true;
    };
    if (!send_first) return read_all() && ::write(fd, buffer, 64) == 64;
    return ::write(fd, buffer, 64) == 64 && read_all();
  };
  const pid_t child = fork_peer([&] {
    parent_end.reset();
    char buffer[64];
    while (exchange(child_end.get(), buffer, false)) {
    }
  });
  child_end.reset();
  char buffer[64] = {1};
  RoundTripTimes times(state);
  for (auto _ : state) {
    const auto sample = times.sample();
    if (!exchange(parent_end.get(), buffer, true)) state.SkipWithError("socket ping-pong failed");
  }
  times.report(state);
  parent_end.reset();
  reap(child, state);
}
BENCHMARK(BM_RawUnixSocketRoundTrip)->UseRealTime()->Repetitions(kRepetitions)->ReportAggregatesOnly(true);

// Single-thread memcpy bandwidth between two buffers of `bytes`, in wall-clock time like the
// streams it is the baseline of.
void BM_RawMemcpy(benchmark::State& state) {
  const auto size = static_cast<std::size_t>(state.range(0));
  std::vector<std::uint8_t> from(size, 1), to(size, 0);
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), size);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * size));
}
BENCHMARK(BM_RawMemcpy)
    ->ArgNames({"bytes"})
    ->Arg(1 << 20)
    ->Arg(64 << 20)
    ->UseRealTime()
    ->Repetitions(kRepetitions)
    ->ReportAggregatesOnly(true);

}  // namespace
}  // namespace ferry
