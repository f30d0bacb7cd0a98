// The caching shared-memory allocator, measured between two processes (the receiver is
// forked before timing; every step is a round trip: send, receiver touches, reply).
//
//   NewLargeTensor   a new 64 MiB shared tensor each step, written by the producer
//   NewLargeTensorUncached  the same with max_cached_bytes = 0 (a new segment every step)
//   ResendOneTensor  the same loop re-sending one tensor (the cache-hit baseline)
//   SmallTensors/N   N new 4 KiB tensors in one message
//   SmallTensorsOneStorage/N  N 4 KiB views of one new storage (Tensor::unbind) in one message
//   SmallTensorsResent/N  the same N tensors in every message
//   PingPong         a message without tensors: the transport's own round trip
//   SmallBlocksRaw/N the raw baseline of SmallTensors/N, written here without ferry: the
//                    same N blocks' worth of traffic over a plain pipe, socket or spinning
//                    shared-memory ping-pong (see its comment)
//
// Run: build/release/bench/ferry_bench --benchmark_filter='Alloc'
// The receiver runs on the last CPU and the producer on the first (bench/support/child_process.hpp).
// Arguments: transport (0 = Pipe, 1 = UnixSocket, 2 = ShmRing with its default waiting),
// then the tensor count for SmallTensors. The per-tensor cost of a message is the ratio of
// SmallTensors/N to SmallTensors/1 of one transport (same run, medians).
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <stdexcept>

#include "ferry/detail/unique_fd.hpp"
#include "ferry/ferry.hpp"
#include "ring/ring_end.hpp"
#include "support/child_process.hpp"

namespace {

using ferry::Tensor;

constexpr std::size_t kLargeBytes = std::size_t{64} << 20;
constexpr std::int64_t kSmallElements = 1024;  // 4 KiB of float32
constexpr int kWarmupSteps = 5;

struct Message {
  std::vector<Tensor> tensors;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(tensors);
  }
};

// The receiver's answer: what it read, and the CPU time it has used so far (so that the
// benchmark can report the receiver's CPU cost per message next to the sender's).
struct Reply {
  std::int64_t sum = 0;
  std::int64_t cpu_ns = 0;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(sum, cpu_ns);
  }
};

std::int64_t thread_cpu_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return std::int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
}

ferry::Transport transport_of(const benchmark::State& state) {
  switch (state.range(0)) {
    case 0: return ferry::Transport::Pipe;
    case 1: return ferry::Transport::UnixSocket;
    default: return ferry::Transport::ShmRing;
  }
}

// Reads one byte of every page of every tensor: what a consumer of the data would fault in.
std::int64_t touch(const Message& message) {
  std::int64_t sum = 0;
  for (const Tensor& tensor : message.tensors) {
    const auto* bytes = static_cast<const unsigned char*>(tensor.data_ptr());
    for (std::size_t i = 0; i < tensor.nbytes(); i += 4096) sum += bytes[i];
  }
  return sum;
}

// A producer connected to a forked receiver that touches every message, drops it and replies
// (so a round trip holds the whole cost of a message on both sides). The receiver runs on the
// last CPU and the producer on the first, as in every ping-pong of ferry_bench.
class Pair {
 public:
  explicit Pair(ferry::Transport transport) {
    auto [tx, rx] = ferry::channel<Message>(transport);
    auto [reply_tx, reply_rx] = ferry::channel<Reply>(transport);
    // Structured bindings are named explicitly: clang 14 cannot capture them implicitly.
    child_ =
        std::make_unique<ferry::bench::ChildProcess>([&tx = tx, &rx = rx, &reply_tx = reply_tx, &reply_rx = reply_rx] {
          ::prctl(PR_SET_NAME, "alloc-receiver");  // tells the processes apart in profiles (perf --comm)
          tx.detach();
          reply_rx.close();
          reply_tx.adopt();
          while (auto message = rx.recv()) {
            const std::int64_t sum = touch(*message);
            message.reset();  // the receiver's whole cost of the message, before the reply
            reply_tx.send(Reply{sum, thread_cpu_ns()});
          }
          reply_tx.close();
        });
    rx.close();
    reply_tx.detach();
    tx_ = std::move(tx);
    reply_rx_ = std::move(reply_rx);
  }
  ~Pair() {
    tx_.close();  // ends the receiver's loop; child_ then waits for it to exit
  }
  Pair(const Pair&) = delete;
  Pair& operator=(const Pair&) = delete;

  std::int64_t round_trip(const Message& message) {
    tx_.send(message);
    const Reply reply = reply_rx_.recv().value();
    peer_cpu_ns_ = reply.cpu_ns;
    return reply.sum;
  }
  // Call after the warm-up: from then on the receiver's CPU time per iteration is counted
  // as the "peer_cpu_us" counter (sender: Google Benchmark's CPU column).
  void start_counting() { counted_from_ = peer_cpu_ns_; }
  void report(benchmark::State& state) const {
    state.counters["peer_cpu_us"] =
        benchmark::Counter(static_cast<double>(peer_cpu_ns_ - counted_from_) / 1e3, benchmark::Counter::kAvgIterations);
  }

 private:
  std::unique_ptr<ferry::bench::ChildProcess> child_;  // declared first: waited for last
  ferry::Sender<Message> tx_;
  ferry::Receiver<Reply> reply_rx_;
  std::int64_t peer_cpu_ns_ = 0;
  std::int64_t counted_from_ = 0;
};

Tensor new_large_tensor(int step) {
  Tensor tensor =
      Tensor::empty({static_cast<std::int64_t>(kLargeBytes)}, ferry::DType::UInt8, ferry::Device::SharedCpu);
  std::memset(tensor.data_ptr(), step & 0xff, kLargeBytes);  // written by the producer
  return tensor;
}

void AllocNewLargeTensor(benchmark::State& state) {
  Pair pair(transport_of(state));
  int step = 0;
  for (; step < kWarmupSteps; ++step) pair.round_trip(Message{{new_large_tensor(step)}});
  pair.start_counting();
  for (auto _ : state) {
    benchmark::DoNotOptimize(pair.round_trip(Message{{new_large_tensor(step++)}}));
  }
  pair.report(state);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kLargeBytes));
}

// The same loop with the cache switched off: every step creates, faults in and maps a new
// segment (what a memfd-per-storage design pays).
void AllocNewLargeTensorUncached(benchmark::State& state) {
  const ferry::SharedAllocatorSettings saved = ferry::SharedAllocator::global().settings();
  ferry::configure_shared_memory(ferry::SharedAllocatorSettings{saved.segment_bytes, 0});
  AllocNewLargeTensor(state);
  ferry::configure_shared_memory(saved);
}

void AllocResendOneTensor(benchmark::State& state) {
  Pair pair(transport_of(state));
  Tensor tensor = new_large_tensor(0);
  int step = 0;
  for (; step < kWarmupSteps; ++step) pair.round_trip(Message{{tensor}});
  pair.start_counting();
  for (auto _ : state) {
    std::memset(tensor.data_ptr(), step++ & 0xff, kLargeBytes);  // the same write as above
    benchmark::DoNotOptimize(pair.round_trip(Message{{tensor}}));
  }
  pair.report(state);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * kLargeBytes));
}

Message new_small_tensors(std::int64_t count, int step) {
  Message message;
  message.tensors.reserve(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    Tensor tensor = Tensor::empty({kSmallElements}, ferry::DType::Float32, ferry::Device::SharedCpu);
    *tensor.data<float>() = static_cast<float>(step);
    message.tensors.push_back(std::move(tensor));
  }
  return message;
}

// N small tensors that live and die together, made as views of one new storage (the way to
// make many small tensors cheap: one block to allocate, send and give back per message).
Message new_small_tensors_in_one_storage(std::int64_t count, int step) {
  Message message;
  message.tensors = Tensor::empty({count, kSmallElements}, ferry::DType::Float32, ferry::Device::SharedCpu).unbind();
  for (Tensor& tensor : message.tensors) *tensor.data<float>() = static_cast<float>(step);
  return message;
}

void AllocSmallTensors(benchmark::State& state) {
  Pair pair(transport_of(state));
  const std::int64_t count = state.range(1);
  int step = 0;
  for (; step < kWarmupSteps; ++step) pair.round_trip(new_small_tensors(count, step));
  pair.start_counting();
  for (auto _ : state) {
    benchmark::DoNotOptimize(pair.round_trip(new_small_tensors(count, step++)));
  }
  pair.report(state);
  state.SetItemsProcessed(state.iterations() * count);
}

void AllocSmallTensorsOneStorage(benchmark::State& state) {
  Pair pair(transport_of(state));
  const std::int64_t count = state.range(1);
  int step = 0;
  for (; step < kWarmupSteps; ++step) pair.round_trip(new_small_tensors_in_one_storage(count, step));
  pair.start_counting();
  for (auto _ : state) {
    benchmark::DoNotOptimize(pair.round_trip(new_small_tensors_in_one_storage(count, step++)));
  }
  pair.report(state);
  state.SetItemsProcessed(state.iterations() * count);
}

void AllocSmallTensorsResent(benchmark::State& state) {
  Pair pair(transport_of(state));
  const Message message = new_small_tensors(state.range(1), 0);
  for (int step = 0; step < kWarmupSteps; ++step) pair.round_trip(message);
  pair.start_counting();
  for (auto _ : state) benchmark::DoNotOptimize(pair.round_trip(message));
  pair.report(state);
  state.SetItemsProcessed(state.iterations() * state.range(1));
}

void AllocPingPong(benchmark::State& state) {
  Pair pair(transport_of(state));
  for (int step = 0; step < kWarmupSteps; ++step) pair.round_trip(Message{});
  pair.start_counting();
  for (auto _ : state) benchmark::DoNotOptimize(pair.round_trip(Message{}));
  pair.report(state);
}

// ---- raw baseline of SmallTensors ------------------------------------------------------------
//
// What any design that passes no fd and maps nothing per tensor still pays for N new small
// tensors: the message (4 bytes per block) and the blocks' cache lines crossing between the
// two CPUs. The blocks lie in a shared mapping both processes have before timing; each step the
// producer takes the next N of a pool of 1,024 (as an allocator recycles blocks), writes the first
// float of each (as new_small_tensors does) and sends their indices; the receiver reads one byte
// of every page of every block (as touch() does) and replies with the sum. Pipe: a pipe each way;
// socket: a socketpair each way (ferry's Pair is two channels); ring: two flags in shared memory,
// both sides spinning. No allocation, no serialization, no lifetime tracking: the ratio of
// SmallTensors/N to this row is what ferry adds.

constexpr std::size_t kRawPoolBlocks = 1024;
constexpr std::size_t kRawMaxBlocks = 128;
constexpr std::size_t kBlockBytes = kSmallElements * sizeof(float);

// Anonymous shared memory of `bytes` bytes, mapped before the receiver is forked.
class SharedAnonymous {
 public:
  explicit SharedAnonymous(std::size_t bytes)
      : bytes_(bytes), data_(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0)) {
    if (data_ == MAP_FAILED) throw std::runtime_error("mmap of the raw baseline's blocks failed");
    std::memset(data_, 0, bytes);  // faulted in before timing, as ferry's warm segments are
  }
  ~SharedAnonymous() { ::munmap(data_, bytes_); }
  SharedAnonymous(const SharedAnonymous&) = delete;
  SharedAnonymous& operator=(const SharedAnonymous&) = delete;
  std::byte* data() const { return static_cast<std::byte*>(data_); }

 private:
  std::size_t bytes_;
  void* data_;
};

// The raw message: how many blocks, and which.
struct RawBlocks {
  std::uint32_t count = 0;
  std::array<std::uint32_t, kRawMaxBlocks> index{};
  std::size_t bytes() const { return sizeof count + count * sizeof(std::uint32_t); }
};

// The spinning ring's shared state: a flag each way on its own cache line, the message, the reply.
struct RawRing {
  alignas(64) std::atomic<std::uint64_t> ping{0};
  alignas(64) std::atomic<std::uint64_t> pong{0};
  alignas(64) RawBlocks message;
  alignas(64) std::int64_t sum = 0;
};

std::int64_t touch_blocks(const std::byte* blocks, const RawBlocks& message) {
  std::int64_t sum = 0;
  for (std::uint32_t i = 0; i < message.count; ++i) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(blocks + std::size_t{message.index[i]} * kBlockBytes);
    for (std::size_t at = 0; at < kBlockBytes; at += 4096) sum += bytes[at];
  }
  return sum;
}

void write_all(int fd, const void* data, std::size_t size) {
  const auto* at = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t done = ::write(fd, at, size);
    if (done < 0 && errno == EINTR) continue;
    if (done <= 0) throw std::runtime_error("raw baseline: write failed");
    at += done;
    size -= static_cast<std::size_t>(done);
  }
}

// False at end of stream.
bool read_all(int fd, void* data, std::size_t size) {
  auto* at = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t done = ::read(fd, at, size);
    if (done < 0 && errno == EINTR) continue;
    if (done < 0) throw std::runtime_error("raw baseline: read failed");
    if (done == 0) return false;
    at += done;
    size -= static_cast<std::size_t>(done);
  }
  return true;
}

// A pair of connected fds (pipe: [0] reads, [1] writes; socket: either end both).
std::array<ferry::detail::UniqueFd, 2> raw_link(bool socket) {
  int fds[2];
  const int rc = socket ? ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) : ::pipe2(fds, O_CLOEXEC);
  if (rc != 0) throw std::runtime_error("raw baseline: pipe2/socketpair failed");
  return {ferry::detail::UniqueFd(fds[0]), ferry::detail::UniqueFd(fds[1])};
}

void AllocSmallBlocksRaw(benchmark::State& state) {
  const auto count = static_cast<std::uint32_t>(state.range(1));
  const bool ring = state.range(0) == 2;
  const bool socket = state.range(0) == 1;
  SharedAnonymous blocks(kRawPoolBlocks * kBlockBytes);
  SharedAnonymous shared(sizeof(RawRing));
  auto* raw_ring = new (shared.data()) RawRing;
  auto to_receiver = raw_link(socket);
  auto to_producer = raw_link(socket);
  std::int64_t sum = 0;
  {
    ferry::bench::ChildProcess child([&] {
      ::prctl(PR_SET_NAME, "raw-receiver");
      to_receiver[1].reset();
      to_producer[0].reset();
      if (ring) {
        for (std::uint64_t seen = 0;;) {
          std::uint64_t now;
          while ((now = raw_ring->ping.load(std::memory_order_acquire)) == seen) ferry::detail::cpu_relax();
          if (now == UINT64_MAX) return;
          seen = now;
          raw_ring->sum = touch_blocks(blocks.data(), raw_ring->message);
          raw_ring->pong.store(now, std::memory_order_release);
        }
      }
      RawBlocks message;
      while (read_all(to_receiver[0].get(), &message.count, sizeof message.count)) {
        if (message.count > kRawMaxBlocks ||
            !read_all(to_receiver[0].get(), message.index.data(), message.count * sizeof(std::uint32_t))) {
          return;
        }
        const std::int64_t reply = touch_blocks(blocks.data(), message);
        write_all(to_producer[1].get(), &reply, sizeof reply);
      }
    });
    to_receiver[0].reset();
    to_producer[1].reset();
    std::uint64_t step = 0;
    std::size_t next = 0;
    RawBlocks& message = raw_ring->message;  // the ring's receiver reads it in place
    for (auto _ : state) {
      ++step;
      message.count = count;
      for (std::uint32_t i = 0; i < count; ++i) {
        const std::size_t block = next++ % kRawPoolBlocks;
        *reinterpret_cast<float*>(blocks.data() + block * kBlockBytes) = static_cast<float>(step);
        message.index[i] = static_cast<std::uint32_t>(block);
      }
      if (ring) {
        raw_ring->ping.store(step, std::memory_order_release);
        while (raw_ring->pong.load(std::memory_order_acquire) != step) ferry::detail::cpu_relax();
        sum += raw_ring->sum;
      } else {
        write_all(to_receiver[1].get(), &message, message.bytes());
        std::int64_t reply = 0;
        if (!read_all(to_producer[0].get(), &reply, sizeof reply)) throw std::runtime_error("raw receiver gone");
        sum += reply;
      }
    }
    raw_ring->ping.store(UINT64_MAX, std::memory_order_release);
    to_receiver[1].reset();  // ends the pipe or socket receiver's loop; child then waits for it
  }
  benchmark::DoNotOptimize(sum);
  state.SetItemsProcessed(state.iterations() * count);
}

// Medians of 5 repetitions; real time, since the receiver's work is in another process.
BENCHMARK(AllocNewLargeTensor)
    ->ArgName("transport")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(40)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(AllocNewLargeTensorUncached)
    ->ArgName("transport")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(40)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(AllocResendOneTensor)
    ->ArgName("transport")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(40)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(AllocSmallTensors)
    ->ArgNames({"transport", "tensors"})
    ->ArgsProduct({{0, 1, 2}, {1, 10, 100}})
    ->Iterations(2000)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(AllocSmallTensorsOneStorage)
    ->ArgNames({"transport", "tensors"})
    ->ArgsProduct({{0, 1, 2}, {1, 10, 100}})
    ->Iterations(2000)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(AllocSmallTensorsResent)
    ->ArgNames({"transport", "tensors"})
    ->ArgsProduct({{0, 1, 2}, {1, 10, 100}})
    ->Iterations(2000)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(AllocSmallBlocksRaw)
    ->ArgNames({"transport", "blocks"})
    ->ArgsProduct({{0, 1, 2}, {1, 10, 100}})
    ->Iterations(2000)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(AllocPingPong)
    ->ArgName("transport")
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Iterations(2000)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
