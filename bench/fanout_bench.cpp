// One producer, several consumers in forked processes, over a ring and a Unix socket:
//   fanout/distributor/<transport>/4/<bound>  Distributor to 4 consumers, 1 MiB tensors,
//                                        FanoutOptions::max_in_flight = bound
//   fanout/distributor_fixed/<transport>/4/128  the same without pace (work_ahead 0)
//   fanout/one_to_one/<transport>/4      baseline: four plain channels, sent to in turn, each
//                                        given all 64 tensors in turn (as any of the
//                                        Distributor's consumers may be)
//   fanout/send/distributor/<transport>/<bound>  Distributor with one consumer, 8-byte messages
//   fanout/send/plain/<transport>        baseline: a plain Sender, the same messages
//   fanout/send_only/distributor/<bound>  the sends alone: in one thread, 16 8-byte messages
//                                        sent through a Distributor of one ring consumer
//                                        (timed), then received (not timed)
//   fanout/send_only/plain               baseline: the same with a plain ring Sender
//   fanout/send_only/distributor_tensor/<bound>  the same with the throughput rows' messages,
//                                        each made anew for its send (a message of one of 64
//                                        tensors of 1 MiB in turn, whose storage the consumer
//                                        already holds: a slot number) and handed over as an
//                                        rvalue (send(T&&) keeps it in flight, not a copy)
//   fanout/send_only/plain_tensor        baseline: the same with a plain ring Sender
//   fanout/send_only/paired/<bound>, paired_tensor/<bound>  the Distributor's and the plain
//                                        Sender's batches of the rows above alternated in
//                                        every iteration (which goes first alternates too);
//                                        counters: each one's median time per message over
//                                        the iterations, and `ratio`, Distributor / plain of
//                                        those medians. A machine whose pace drifts between
//                                        rows (a VM whose neighbours come and go) moves both
//                                        halves of a pair alike, so the ratio is read here.
// In the send rows the consumer's pace and its wake-ups set the time as much as the send
// does (a plain send that fills the ring waits for it like a full Distributor); the
// send_only rows time the sender's own work, with no other process to wait for.
// A plain Sender runs ahead of its consumer by what its transport holds (thousands of small
// frames); a Distributor by `bound` messages per consumer, so with consumers as fast as the
// producer the small-bound rows measure the wait for a place, the bound-256 rows the
// overhead (128 is FanoutOptions' default).
//   fanout/broadcast/<transport>/<bytes>/<consumers>  the same tensor to every consumer
// Consumers receive and drop. Time per message (per broadcast); compare medians of the
// rows of one run (--benchmark_repetitions, with --benchmark_enable_random_interleaving
// so that the rows share the machine's swings).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <vector>

#include "ferry/detail/live_ends.hpp"
#include "ferry/ferry.hpp"
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
            const detail::LiveEnd* keep[] = {&detail::EndAccess::core(rx)};
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

// distributor() without pace (FanoutOptions::work_ahead 0): the window is the bound.
void distributor_fixed(benchmark::State& state, Transport transport) {
  const auto messages = tensors(64, 1 << 20);
  Consumers<TensorMessage> consumers(transport, static_cast<int>(state.range(0)));
  {
    FanoutOptions options = bounded(state.range(1));
    options.work_ahead = {};
    Distributor<TensorMessage> pool(options);
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

// The messages of the send_only rows, made for each send: the n-th 8-byte message is n;
// the n-th tensor message views the (n mod 64)-th of 64 tensors of 1 MiB.
struct Counted {
  using Message = std::uint64_t;
  Message make(std::uint64_t n) const { return n; }
  bool matches(const Message& got, std::uint64_t n) const { return got == n; }
};
struct Tensors {
  using Message = TensorMessage;
  std::vector<TensorMessage> all = tensors(64, 1 << 20);
  Message make(std::uint64_t n) const { return all[n % all.size()]; }
  bool matches(const Message& got, std::uint64_t n) const {
    return got.tensor.numel() == all[n % all.size()].tensor.numel();
  }
};

constexpr int kBatch = 16;

// Sends `kBatch` messages from `value` on with `send` (timed), then receives them from `rx`
// (not timed); returns the seconds per message sent.
template <class Messages, class Send>
double timed_batch(benchmark::State& state, const Messages& messages, Send& send,
                   Receiver<typename Messages::Message>& rx, std::uint64_t& value) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kBatch; ++i) send(messages.make(value + static_cast<std::uint64_t>(i)));
  const auto stop = std::chrono::steady_clock::now();
  for (int i = 0; i < kBatch; ++i, ++value) {
    const auto got = rx.recv();
    if (!got || !messages.matches(*got, value)) state.SkipWithError("a message came back wrong");
  }
  return std::chrono::duration<double>(stop - start).count() / kBatch;
}

template <class Messages, class Send>
void timed_sends(benchmark::State& state, const Messages& messages, Send send,
                 Receiver<typename Messages::Message>& rx) {
  std::uint64_t value = 0;
  for (auto _ : state) state.SetIterationTime(timed_batch(state, messages, send, rx, value));
}

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

template <class Messages>
void send_only_distributor(benchmark::State& state) {
  const Messages messages;
  using Message = typename Messages::Message;
  auto [tx, rx] = channel<Message>(Transport::ShmRing);
  Distributor<Message> pool(bounded(state.range(0)));
  pool.add(std::move(tx));
  timed_sends(
      state, messages, [&pool](Message&& message) { pool.send(std::move(message)); }, rx);
}

template <class Messages>
void send_only_plain(benchmark::State& state) {
  const Messages messages;
  using Message = typename Messages::Message;
  auto [tx, rx] = channel<Message>(Transport::ShmRing);
  timed_sends(
      state, messages, [&tx = tx](const Message& message) { tx.send(message); }, rx);
}

// A Distributor's batch and a plain Sender's batch in every iteration, in alternating order.
template <class Messages>
void send_only_paired(benchmark::State& state) {
  const Messages messages;
  using Message = typename Messages::Message;
  auto [pool_tx, pool_rx] = channel<Message>(Transport::ShmRing);
  Distributor<Message> pool(bounded(state.range(0)));
  pool.add(std::move(pool_tx));
  auto [tx, rx] = channel<Message>(Transport::ShmRing);
  auto pool_send = [&pool](Message&& message) { pool.send(std::move(message)); };
  auto plain_send = [&tx = tx](const Message& message) { tx.send(message); };
  std::uint64_t pool_value = 0;
  std::uint64_t plain_value = 0;
  std::vector<double> pool_seconds;
  std::vector<double> plain_seconds;
  bool pool_first = true;
  for (auto _ : state) {
    double pool_time = 0;
    double plain_time = 0;
    if (pool_first) {
      pool_time = timed_batch(state, messages, pool_send, pool_rx, pool_value);
      plain_time = timed_batch(state, messages, plain_send, rx, plain_value);
    } else {
      plain_time = timed_batch(state, messages, plain_send, rx, plain_value);
      pool_time = timed_batch(state, messages, pool_send, pool_rx, pool_value);
    }
    pool_first = !pool_first;
    pool_seconds.push_back(pool_time);
    plain_seconds.push_back(plain_time);
    state.SetIterationTime(pool_time);
  }
  const double pool_median = median_of(std::move(pool_seconds));
  const double plain_median = median_of(std::move(plain_seconds));
  state.counters["distributor_ns"] = pool_median * 1e9;
  state.counters["plain_ns"] = plain_median * 1e9;
  state.counters["ratio"] = plain_median > 0 ? pool_median / plain_median : 0;
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
        ->Args({4, 128})
        ->Args({4, 256})
        ->UseRealTime();
    benchmark::RegisterBenchmark(("fanout/distributor_fixed/" + name).c_str(), distributor_fixed, transport)
        ->Args({4, 128})
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
  benchmark::RegisterBenchmark("fanout/send_only/distributor", send_only_distributor<Counted>)
      ->Arg(32)
      ->Arg(128)
      ->Arg(256)
      ->UseManualTime()
      ->MinTime(0.05);
  benchmark::RegisterBenchmark("fanout/send_only/plain", send_only_plain<Counted>)->UseManualTime()->MinTime(0.05);
  benchmark::RegisterBenchmark("fanout/send_only/distributor_tensor", send_only_distributor<Tensors>)
      ->Arg(128)
      ->UseManualTime()
      ->MinTime(0.05);
  benchmark::RegisterBenchmark("fanout/send_only/plain_tensor", send_only_plain<Tensors>)
      ->UseManualTime()
      ->MinTime(0.05);
  benchmark::RegisterBenchmark("fanout/send_only/paired", send_only_paired<Counted>)
      ->Arg(128)
      ->UseManualTime()
      ->MinTime(0.1);
  benchmark::RegisterBenchmark("fanout/send_only/paired_tensor", send_only_paired<Tensors>)
      ->Arg(128)
      ->UseManualTime()
      ->MinTime(0.1);
  return true;
}();

}  // namespace
}  // namespace ferry::bench::fanout
