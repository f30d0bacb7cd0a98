// Round trips of a message holding one CUDA tensor between two processes on one GPU:
//   roundtrip/ferry/<transport>/cuda_same/<n>  the same device tensor of n bytes each time: a
//                                              cache hit (no cudaIpcOpenMemHandle, no fd; one
//                                              event record/wait and a counter), so the time
//                                              should not depend on n
//   roundtrip/ferry/<transport>/cuda_new/<n>   a new device tensor each time (allocated before the
//                                              timing, from the caching allocator's blocks): a
//                                              new lease, its block usually already open
// The reply is a 1-byte message. Compiled only in builds with CUDA (bench/CMakeLists.txt).
//
// CUDA does not survive fork(), so the benchmark process never touches CUDA: it forks a
// producer and a consumer once per transport (kept for every size), asks the producer for
// one timed round trip per iteration and reports the producer's clock as manual time.
// Without a usable GPU each benchmark is skipped with the reason.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "ferry/cuda.hpp"
#include "ferry/ferry.hpp"
#include "support/child_process.hpp"
#include "support/tensor_message.hpp"

namespace ferry::bench {
namespace {

// What the benchmark process asks the producer: one round trip of `bytes`.
struct Command {
  std::int64_t bytes = 0;
  bool new_tensor = false;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(bytes, new_tensor);
  }
};

// The producer's answer: the round trip's duration, or why it could not run.
struct Report {
  std::int64_t nanoseconds = 0;
  std::string error;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(nanoseconds, error);
  }
};

// The producer: answers commands until the command channel closes.
void produce(Receiver<Command>& commands, Sender<Report>& reports, Sender<TensorMessage>& ping,
             Receiver<std::uint8_t>& pong) {
  const std::string unavailable = cuda_unavailable_reason();
  std::map<std::int64_t, Tensor> same;  // by size
  auto round_trip = [&](const Tensor& tensor) {
    const auto start = std::chrono::steady_clock::now();
    ping.send(TensorMessage{tensor});
    if (!pong.recv()) throw Error("the consumer left");
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  };
  while (auto command = commands.recv()) {
    Report report;
    if (!unavailable.empty()) {
      report.error = "no usable CUDA device: " + unavailable;
      reports.send(report);
      continue;
    }
    try {
      if (command->new_tensor) {
        const Tensor tensor = Tensor::empty({command->bytes}, DType::UInt8, Device::Cuda(0));
        report.nanoseconds = round_trip(tensor);
      } else {
        auto it = same.find(command->bytes);
        if (it == same.end()) {
          it = same.emplace(command->bytes, Tensor::zeros({command->bytes}, DType::UInt8, Device::Cuda(0))).first;
          for (int i = 0; i < 5; ++i) round_trip(it->second);  // first send: export, event, IPC open
        }
        report.nanoseconds = round_trip(it->second);
      }
    } catch (const std::exception& error) {
      report.error = error.what();
    }
    reports.send(report);
  }
  ping.close();
}

void consume(Receiver<TensorMessage>& ping, Sender<std::uint8_t>& pong) {
  while (auto message = ping.recv()) pong.send(static_cast<std::uint8_t>(message->tensor.numel() & 1));
  pong.close();
}

// A producer and a consumer on one transport, started on first use and kept for every size.
class CudaPair {
 public:
  explicit CudaPair(Transport transport) {
    auto [command_tx, command_rx] = channel<Command>(Transport::Pipe);
    auto [report_tx, report_rx] = channel<Report>(Transport::Pipe);
    auto [ping_tx, ping_rx] = channel<TensorMessage>(transport);
    auto [pong_tx, pong_rx] = channel<std::uint8_t>(transport);
    producer_.emplace(
        [&, &command_tx = command_tx, &command_rx = command_rx, &report_tx = report_tx, &report_rx = report_rx,
         &ping_tx = ping_tx, &ping_rx = ping_rx, &pong_tx = pong_tx, &pong_rx = pong_rx] {
          command_tx.detach();
          report_rx.close();
          report_tx.adopt();
          ping_rx.close();
          pong_tx.detach();
          ping_tx.adopt();
          produce(command_rx, report_tx, ping_tx, pong_rx);
        },
        Placement::FirstCpu, kGrace);
    consumer_.emplace(
        [&, &command_tx = command_tx, &command_rx = command_rx, &report_tx = report_tx, &report_rx = report_rx,
         &ping_tx = ping_tx, &ping_rx = ping_rx, &pong_tx = pong_tx, &pong_rx = pong_rx] {
          command_tx.detach();
          command_rx.close();
          report_tx.detach();
          report_rx.close();
          ping_tx.detach();
          pong_rx.close();
          pong_tx.adopt();
          consume(ping_rx, pong_tx);
        },
        Placement::LastCpu, kGrace);
    command_rx.close();
    report_tx.detach();
    ping_tx.detach();
    ping_rx.close();
    pong_tx.detach();
    pong_rx.close();
    commands_ = std::move(command_tx);
    reports_ = std::move(report_rx);
  }

  ~CudaPair() {
    commands_.close();  // the producer closes the ping channel, the consumer follows; then
    reports_.close();   // the ChildProcess members wait for both
  }

  Report run(const Command& command) {
    commands_.send(command);
    auto report = reports_.recv();
    if (!report) return Report{0, "the producer process ended"};
    return *report;
  }

 private:
  static constexpr std::chrono::milliseconds kGrace{10'000};
  std::optional<ChildProcess> producer_;
  std::optional<ChildProcess> consumer_;
  Sender<Command> commands_;
  Receiver<Report> reports_;
};

CudaPair& pair_for(Transport transport) {
  static std::map<Transport, std::unique_ptr<CudaPair>> pairs;  // stopped at exit
  auto& pair = pairs[transport];
  if (!pair) pair = std::make_unique<CudaPair>(transport);
  return *pair;
}

void cuda_round_trip(benchmark::State& state, Transport transport, bool new_tensor, std::int64_t bytes) {
  CudaPair& pair = pair_for(transport);
  for (auto _ : state) {
    const Report report = pair.run(Command{bytes, new_tensor});
    if (!report.error.empty()) {
      state.SkipWithError(report.error.c_str());
      break;
    }
    state.SetIterationTime(static_cast<double>(report.nanoseconds) * 1e-9);
  }
}

const bool registered = [] {
  for (const Transport transport : {Transport::UnixSocket, Transport::Pipe}) {
    const std::string name(transport_name(transport));
    for (const std::int64_t bytes : {std::int64_t{4096}, std::int64_t{64} << 20, std::int64_t{1} << 30}) {
      benchmark::RegisterBenchmark(("roundtrip/ferry/" + name + "/cuda_same/" + std::to_string(bytes)).c_str(),
                                   cuda_round_trip, transport, false, bytes)
          ->UseManualTime();
    }
    benchmark::RegisterBenchmark(("roundtrip/ferry/" + name + "/cuda_new/4096").c_str(), cuda_round_trip, transport,
                                 true, std::int64_t{4096})
        ->UseManualTime()
        ->Iterations(2000);
  }
  return true;
}();

}  // namespace
}  // namespace ferry::bench
