// The caching shared-memory allocator, measured between two processes (the receiver is
// forked before timing; every step is a round trip: send, receiver touches, reply).
//
//   NewLargeTensor   a new 64 MiB shared tensor each step, written by the producer
//   NewLargeTensorUncached  the same with max_cached_bytes = 0 (a new segment every step)
//   ResendOneTensor  the same loop re-sending one tensor (the cache-hit baseline)
//   SmallTensors/N   N new 4 KiB tensors in one message
//   SmallTensorsResent/N  the same N tensors in every message
//   PingPong         a message without tensors: the transport's own round trip
//
// Run: build/release/bench/ferry_bench --benchmark_filter='Alloc'
// The receiver runs on the last CPU and the producer on the first (bench/support/child_process.hpp).
// Arguments: transport (0 = Pipe, 1 = UnixSocket, 2 = ShmRing with its default waiting),
// then the tensor count for SmallTensors. The per-tensor cost of a message is the ratio of
// SmallTensors/N to SmallTensors/1 of one transport (same run, medians).
#include <benchmark/benchmark.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>

#include "ferry/ferry.hpp"
#include "support/child_process.hpp"

namespace {

using ferry::Tensor;

constexpr std::size_t kLargeBytes = std::size_t{64} << 20;
constexpr std::int64_t kSmallElements = 1024;  // 4 KiB of float32
constexpr int kWarmupSteps = 5;

struct Message {
  std::vector<Tensor> tensors;
  template <class Archive>
  void serialize(Archive& ar) { ar(tensors); }
};

// The receiver's answer: what it read, and the CPU time it has used so far (so that the
// benchmark can report the receiver's CPU cost per message next to the sender's).
struct Reply {
  std::int64_t sum = 0;
  std::int64_t cpu_ns = 0;
  template <class Archive>
  void serialize(Archive& ar) { ar(sum, cpu_ns); }
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
    child_ = std::make_unique<ferry::bench::ChildProcess>([&tx = tx, &rx = rx, &reply_tx = reply_tx,
                                                           &reply_rx = reply_rx] {
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
  Tensor tensor = Tensor::empty({static_cast<std::int64_t>(kLargeBytes)}, ferry::DType::UInt8, ferry::Device::SharedCpu);
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

// Medians of 5 repetitions; real time, since the receiver's work is in another process.
BENCHMARK(AllocNewLargeTensor)->ArgName("transport")->Arg(0)->Arg(1)->Iterations(40)->Repetitions(5)
    ->ReportAggregatesOnly(true)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(AllocNewLargeTensorUncached)->ArgName("transport")->Arg(0)->Arg(1)->Iterations(40)->Repetitions(5)
    ->ReportAggregatesOnly(true)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(AllocResendOneTensor)->ArgName("transport")->Arg(0)->Arg(1)->Iterations(40)->Repetitions(5)
    ->ReportAggregatesOnly(true)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(AllocSmallTensors)->ArgNames({"transport", "tensors"})->ArgsProduct({{0, 1, 2}, {1, 10, 100}})
    ->Iterations(2000)->Repetitions(5)->ReportAggregatesOnly(true)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(AllocSmallTensorsResent)->ArgNames({"transport", "tensors"})->ArgsProduct({{0, 1, 2}, {1, 10, 100}})
    ->Iterations(2000)->Repetitions(5)->ReportAggregatesOnly(true)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(AllocPingPong)->ArgName("transport")->Arg(0)->Arg(1)->Arg(2)->Iterations(2000)->Repetitions(5)
    ->ReportAggregatesOnly(true)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
