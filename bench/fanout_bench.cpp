// One producer, several consumers in forked processes, over a ring and a Unix socket:
//   fanout/distributor/<transport>/4/<bound>  Distributor to 4 consumers, 1 MiB tensors,
//                                        FanoutOptions::max_in_flight = bound
//   fanout/one_to_one/<transport>/4      baseline: four plain channels, sent to in turn, each
//                                        given all 64 tensors in turn (as any of the
//                                        Distributor's consumers may be)
//   fanout/send/distributor/<transport>/<bound>  Distributor with one consumer, 8-byte messages
//   fanout/send/plain/<transport>        baseline: a plain Sender, the same messages
// A plain Sender runs ahead of its consumer by what its transport holds (thousands of small
// frames); a Distributor by `bound` messages per consumer, so with consumers as fast as the
// producer the small-bound rows measure the wait for a place, the bound-256 rows the
// overhead (32 is FanoutOptions' default).
//   fanout/broadcast/<transport>/<bytes>/<consumers>  the same tensor to every consumer
// Consumers receive and drop. Time per message (per broadcast); compare medians of the
// rows of one run (--benchmark_repetitions).
#include <benchmark/benchmark.h>

#include <array>
#include <memory>
#include <vector>

#include "ferry/ferry.hpp"
#include "ferry/detail/live_ends.hpp"
#include "support/child_process.hpp"
#include "support/tensor_message.hpp"

namespace ferry::bench::fanout {
namespace {

constexpr std::array kTransports{Transport::ShmRing, Transport::UnixSocket};

// `n` consumer processes, each draining its own channel of T until the end of the stream.
template <class T>
struct Consumers {
  std::vector<Sender<T>> ends;
  std::vector<std::unique_ptr<ChildProcess>> children;
  Consumers(Transport transport, int n) {
    for (int i = 0; i < n; ++i) {
      auto [tx, rx] = channel<T>(transport);
      children.push_back(std::make_unique<ChildProcess>(
          [&rx = rx] {
            const detail::LiveEnd* keep[] = {&rx.core()};
            detail::abandon_live_ends_except(keep);
            while (rx.recv()) {
            }
          },
          Placement::Anywhere, std::chrono::seconds(10)));
      rx.detach();
      ends.push_back(std::move(tx));
    }
  }
};

std::vector<TensorMessage> tensors(int count, std::int64_t bytes) {
  std::vector<TensorMessage> out;
  for (int i = 0; i < count; ++i) out.push_back(TensorMessage{Tensor::zeros({bytes}, DType::UInt8)});
  return out;
}

FanoutOptions bounded(std::int64_t bound) {
  FanoutOptions options;
  options.max_in_flight = static_cast<std::size_t>(bound);
  return options;
}

void distributor(benchmark::State& state, Transport transport) {
  const auto messages = tensors(64, 1 << 20);
  Consumers<TensorMessage> consumers(transport, static_cast<int>(state.range(0)));
  {
    Distributor<TensorMessage> pool(bounded(state.range(1)));
    for (auto& end : consumers.ends) pool.add(std::move(end));
    std::size_t i = 0;
    for (auto _ : state) pool.send(messages[i++ % messages.size()]);
  }
  consumers.children.clear();
  state.SetItemsProcessed(state.iterations());
}

void one_to_one(benchmark::State& state, Transport transport) {
  const auto messages = tensors(64, 1 << 20);
  Consumers<TensorMessage> consumers(transport, static_cast<int>(state.range(0)));
  std::size_t i = 0;
  for (auto _ : state) {
    consumers.ends[i % consumers.ends.size()].send(messages[(i / consumers.ends.size()) % messages.size()]);
    ++i;
  }
  consumers.ends.clear();
  consumers.children.clear();
  state.SetItemsProcessed(state.iterations());
}

void send_distributor(benchmark::State& state, Transport transport) {
  Consumers<std::uint64_t> consumers(transport, 1);
  {
    Distributor<std::uint64_t> pool(bounded(state.range(0)));
    pool.add(std::move(consumers.ends[0]));
    std::uint64_t i = 0;
    for (auto _ : state) pool.send(i++);
  }
  consumers.children.clear();
}

void send_plain(benchmark::State& state, Transport transport) {
  Consumers<std::uint64_t> consumers(transport, 1);
  std::uint64_t i = 0;
  for (auto _ : state) consumers.ends[0].send(i++);
  consumers.ends.clear();
  consumers.children.clear();
}

void broadcast(benchmark::State& state, Transport transport) {
  const TensorMessage message{Tensor::zeros({state.range(0)}, DType::UInt8)};
  Consumers<TensorMessage> consumers(transport, static_cast<int>(state.range(1)));
  {
    Broadcast<TensorMessage> all;
    for (auto& end : consumers.ends) all.add(std::move(end));
    for (auto _ : state) all.send(message);
  }
  consumers.children.clear();
}

const bool registered = [] {
  for (const Transport transport : kTransports) {
    const std::string name(transport_name(transport));
    benchmark::RegisterBenchmark(("fanout/distributor/" + name).c_str(), distributor, transport)
        ->Args({4, 8})
        ->Args({4, 16})
        ->Args({4, 32})
        ->Args({4, 64})
        ->Args({4, 256})
        ->UseRealTime();
    benchmark::RegisterBenchmark(("fanout/one_to_one/" + name).c_str(), one_to_one, transport)->Arg(4)->UseRealTime();
    benchmark::RegisterBenchmark(("fanout/send/distributor/" + name).c_str(), send_distributor, transport)
        ->Arg(8)
        ->Arg(256)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("fanout/send/plain/" + name).c_str(), send_plain, transport)->UseRealTime();
    auto* rows = benchmark::RegisterBenchmark(("fanout/broadcast/" + name).c_str(), broadcast, transport);
    for (const std::int64_t bytes : {std::int64_t{1} << 20, std::int64_t{64} << 20}) {
      for (const std::int64_t n : {1, 2, 4, 8}) rows->Args({bytes, n});
    }
    rows->UseRealTime();
  }
  return true;
}();

}  // namespace
}  // namespace ferry::bench::fanout
