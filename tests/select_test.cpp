// Waiting on many receivers at once: frames buffered in user space count as ready, mixed
// message types, and a collector fanning in from several workers (both start methods).
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <thread>

#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/transports.hpp"

namespace ferry {
namespace select_test {

using namespace std::chrono_literals;

struct Tagged {
  int rank = 0;
  int sequence = 0;
  template <class Archive>
  void serialize(Archive& ar) { ar(rank, sequence); }
};

constexpr int kMessagesPerWorker = 200;

void produce(WorkerContext& context, Sender<Tagged> out) {
  for (int i = 0; i < kMessagesPerWorker; ++i) out.send(Tagged{context.rank(), i});
}
FERRY_WORKER(produce);

// A collector stage: fans in from every producer with one Selector, then reports the
// number of messages and whether every stream arrived in order.
void collect(WorkerContext&, std::vector<Receiver<Tagged>> inputs, Sender<std::int64_t> report) {
  Selector selector;
  for (auto& input : inputs) selector.add(input);
  std::map<int, int> next;
  std::int64_t total = 0;
  bool in_order = true;
  while (!selector.empty()) {
    const std::size_t index = selector.wait();
    auto message = inputs[index].recv();
    if (!message) {
      selector.remove(index);
      continue;
    }
    in_order = in_order && message->sequence == next[message->rank]++;
    ++total;
  }
  report.send(total);
  report.send(in_order ? 1 : 0);
}
FERRY_WORKER(collect);

class SelectTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {};

INSTANTIATE_TEST_SUITE_P(Transports, SelectTest, ::testing::ValuesIn(test::interprocess_transports()),
                         test::transport_test_name);

TEST_P(SelectTest, FrameBufferedInUserSpaceIsReady) {
  auto [tx, rx] = channel<int>(GetParam());
  tx.send(1);
  tx.send(2);  // both frames now sit in the kernel; the first recv() reads both
  Selector selector;
  const std::size_t index = selector.add(rx);
  EXPECT_EQ(selector.try_wait(), index);
  EXPECT_EQ(rx.recv().value(), 1);
  // The second frame is in the receiver's buffer, not in the kernel: poll() cannot see it.
  EXPECT_EQ(selector.try_wait(), index);
  EXPECT_EQ(rx.try_recv().value(), 2);
  EXPECT_FALSE(selector.try_wait().has_value());
  EXPECT_FALSE(selector.wait_for(5ms).has_value());
  tx.close();
  EXPECT_EQ(selector.wait(), index);  // end of stream is ready too
  EXPECT_FALSE(rx.recv().has_value());
}

TEST_P(SelectTest, MixedMessageTypesRoundRobin) {
  auto [ints_tx, ints_rx] = channel<int>(GetParam());
  auto [words_tx, words_rx] = channel<std::string>(GetParam());
  Selector selector;
  const std::size_t ints = selector.add(ints_rx);
  const std::size_t words = selector.add(words_rx);
  for (int i = 0; i < 3; ++i) {
    ints_tx.send(i);
    words_tx.send("word " + std::to_string(i));
  }
  // Both are ready all along: they take turns.
  std::vector<std::size_t> order;
  for (int i = 0; i < 6; ++i) {
    const std::size_t index = selector.wait();
    order.push_back(index);
    if (index == ints) {
      EXPECT_TRUE(ints_rx.recv().has_value());
    } else {
      EXPECT_TRUE(words_rx.recv().has_value());
    }
  }
  EXPECT_EQ(order, (std::vector<std::size_t>{ints, words, ints, words, ints, words}));
  selector.remove(ints);
  EXPECT_FALSE(selector.contains(ints));
  EXPECT_EQ(selector.size(), 1u);
  EXPECT_FALSE(selector.try_wait().has_value());
}

// The sender stays alive and sends while the Selector already waits: the wait must end
// with the data, not only when the sender's process exits (the ring has no descriptor
// that wakes on data; its companion socket only reports a hang-up).
TEST_P(SelectTest, SenderThatStaysAliveWakesAWaitingSelector) {
  auto [tx, rx] = channel<int>(GetParam());
  auto [done_tx, done_rx] = channel<int>(Transport::Pipe);
  const pid_t child = test::fork_child([&tx = tx, &rx = rx, &done_tx = done_tx, &done_rx = done_rx] {
    rx.detach();
    done_tx.detach();
    std::this_thread::sleep_for(50ms);  // let the parent start waiting first
    tx.send(7);
    // Stay alive (and keep the channel open) until the parent has seen the value.
    CHILD_CHECK(done_rx.recv_for(10s).has_value());
  });
  tx.detach();
  done_rx.close();
  Selector selector;
  const std::size_t index = selector.add(rx);
  const auto ready = selector.wait_for(5s);
  done_tx.send(1);
  ASSERT_EQ(ready, index) << "the Selector did not see a value sent by a live sender";
  EXPECT_EQ(rx.try_recv().value(), 7);
  EXPECT_TRUE(test::child_succeeded(child));
  done_tx.close();
}

TEST(SelectorTest, EmptySelectorRefusesToWaitForEver) {
  Selector selector;
  EXPECT_THROW((void)selector.wait(), Error);
  EXPECT_FALSE(selector.try_wait().has_value());
}

class FanInTest : public test::LeakCheckedTest,
                  public ::testing::WithParamInterface<std::tuple<StartMethod, Transport>> {
 protected:
  SpawnOptions options() const {
    SpawnOptions result;
    result.start_method = std::get<0>(GetParam());
    return result;
  }
  Transport transport() const { return std::get<1>(GetParam()); }
  void TearDown() override {
    EXPECT_TRUE(test::has_no_children());
    LeakCheckedTest::TearDown();
  }
};

INSTANTIATE_TEST_SUITE_P(
    StartMethodsAndTransports, FanInTest,
    ::testing::Combine(::testing::Values(StartMethod::Fork, StartMethod::Spawn),
                       ::testing::ValuesIn(test::interprocess_transports())),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) == StartMethod::Fork ? "Fork" : "Spawn") + "_" +
             test::transport_test_name(::testing::TestParamInfo<Transport>(std::get<1>(info.param), info.index));
    });

TEST_P(FanInTest, ParentFansInFromFourWorkers) {
  std::vector<Sender<Tagged>> senders;
  std::vector<Receiver<Tagged>> receivers;
  for (int i = 0; i < 4; ++i) {
    auto [tx, rx] = channel<Tagged>(transport());
    senders.push_back(std::move(tx));
    receivers.push_back(std::move(rx));
  }
  auto workers = spawn(options(), 4, produce, per_rank(std::move(senders)));
  Selector selector;
  for (auto& receiver : receivers) selector.add(receiver);
  std::vector<int> next(4, 0);
  int total = 0;
  while (!selector.empty()) {
    const std::size_t index = selector.wait();
    auto message = receivers[index].recv();
    if (!message) {
      selector.remove(index);
      continue;
    }
    ASSERT_EQ(message->rank, static_cast<int>(index));
    ASSERT_EQ(message->sequence, next[index]++);
    ++total;
  }
  EXPECT_EQ(total, 4 * kMessagesPerWorker);
  workers.join();
}

TEST_P(FanInTest, CollectorWorkerFansInFromProducerWorkers) {
  std::vector<Sender<Tagged>> senders;
  std::vector<Receiver<Tagged>> receivers;
  for (int i = 0; i < 3; ++i) {
    auto [tx, rx] = channel<Tagged>(transport());
    senders.push_back(std::move(tx));
    receivers.push_back(std::move(rx));
  }
  auto [report_tx, report_rx] = channel<std::int64_t>(transport());
  // The collector starts first: with fork, the producers must not inherit its ends.
  auto collector = spawn(options(), 1, collect, std::move(receivers), std::move(report_tx));
  auto producers = spawn(options(), 3, produce, per_rank(std::move(senders)));
  EXPECT_EQ(report_rx.recv().value(), 3 * kMessagesPerWorker);
  EXPECT_EQ(report_rx.recv().value(), 1) << "a stream arrived out of order";
  producers.join();
  collector.join();
}

}  // namespace select_test
}  // namespace ferry
