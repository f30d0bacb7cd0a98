// Spawn-to-first-message latency of 4 workers per start method, and the throughput of a
// two-stage pipeline of shared tensor batches per transport and batch size.
//
//   build/release/bench/ferry_spawn_bench
//
// Its own main(): the spawn start method re-executes this binary, which must call
// ferry::init(argc, argv) before Google Benchmark parses the arguments.
#include <benchmark/benchmark.h>

#include <chrono>
#include <vector>

#include "ferry/ferry.hpp"

namespace {

using Clock = std::chrono::steady_clock;

void say_hello(ferry::WorkerContext& context, ferry::Sender<int> out) { out.send(context.rank()); }
FERRY_WORKER(say_hello);

// Time from spawn() to the first message of every one of 4 workers (join not included).
void BM_SpawnToFirstMessage(benchmark::State& state) {
  constexpr int kWorkers = 4;
  ferry::SpawnOptions options;
  options.start_method = static_cast<ferry::StartMethod>(state.range(0));
  state.SetLabel(std::string(ferry::start_method_name(options.start_method)));
  for (auto _ : state) {
    std::vector<ferry::Sender<int>> senders;
    std::vector<ferry::Receiver<int>> receivers;
    for (int i = 0; i < kWorkers; ++i) {
      auto [tx, rx] = ferry::channel<int>(ferry::Transport::Pipe);
      senders.push_back(std::move(tx));
      receivers.push_back(std::move(rx));
    }
    const auto start = Clock::now();
    auto workers = ferry::spawn(options, kWorkers, say_hello, ferry::per_rank(std::move(senders)));
    for (auto& receiver : receivers) benchmark::DoNotOptimize(receiver.recv());
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - start).count());
    workers.join();
  }
}
BENCHMARK(BM_SpawnToFirstMessage)
    ->Arg(static_cast<int>(ferry::StartMethod::Fork))
    ->Arg(static_cast<int>(ferry::StartMethod::Spawn))
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

struct Batch {
  std::int64_t step = 0;
  ferry::Tensor data;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(step, data);
  }
};

// The transform stage: stamps each batch in place (first element := step) and passes it on.
void stamp(ferry::WorkerContext&, ferry::Receiver<Batch> in, ferry::Sender<Batch> out) {
  while (auto batch = in.recv()) {
    batch->data.data<std::int64_t>()[0] = batch->step;
    out.send(*batch);
  }
}
FERRY_WORKER(stamp);

// loader/sink (this process) -> transform worker -> back, with a pool of 4 batches in
// flight. Each iteration moves one batch through both hops; bytes_per_second counts the
// batch's tensor bytes, none of which is copied.
void BM_PipelineThroughput(benchmark::State& state) {
  const auto transport = static_cast<ferry::Transport>(state.range(0));
  const std::int64_t batch_bytes = state.range(1) << 20;
  constexpr int kPool = 4;
  state.SetLabel(std::string(ferry::transport_name(transport)));
  std::pair<ferry::Sender<Batch>, ferry::Receiver<Batch>> to_worker;
  std::pair<ferry::Sender<Batch>, ferry::Receiver<Batch>> from_worker;
  try {
    to_worker = ferry::channel<Batch>(transport);
    from_worker = ferry::channel<Batch>(transport);
  } catch (const ferry::Error& error) {
    state.SkipWithError(error.what());  // a transport this build does not have
    for (auto _ : state) {
    }
    return;
  }
  auto workers = ferry::spawn(1, stamp, std::move(to_worker.second), std::move(from_worker.first));
  auto& out = to_worker.first;
  auto& in = from_worker.second;
  std::int64_t step = 0;
  for (int i = 0; i < kPool; ++i) {
    out.send(Batch{step++, ferry::Tensor::zeros({batch_bytes / 8}, ferry::DType::Int64, ferry::Device::SharedCpu)});
  }
  for (auto _ : state) {
    auto batch = in.recv();
    if (!batch || batch->data.data<std::int64_t>()[0] != batch->step) {
      state.SkipWithError("a batch came back wrong");
      break;
    }
    batch->step = step++;
    out.send(*batch);
  }
  out.close();
  while (in.recv()) {
  }
  workers.join();
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * batch_bytes);
}
BENCHMARK(BM_PipelineThroughput)
    ->ArgsProduct({{static_cast<int>(ferry::Transport::Pipe), static_cast<int>(ferry::Transport::UnixSocket),
                    static_cast<int>(ferry::Transport::ShmRing)},
                   {1, 64}})
    ->ArgNames({"transport", "MiB"})
    ->UseRealTime()  // rates per second of wall-clock time: the other process does half the work
    ->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  ferry::init(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
