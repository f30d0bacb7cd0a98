// Waiting on many receivers at once: frames buffered in user space count as ready, mixed
// message types, and a collector fanning in from several workers (both start methods).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ferry/detail/frame_channel.hpp"
#include "ferry/ferry.hpp"
#include "ring/futex.hpp"
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
  void serialize(Archive& ar) {
    ar(rank, sequence);
  }
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
  std::thread closer([&tx = tx] {
    std::this_thread::sleep_for(20ms);
    tx.close();
  });
  // A timeout too long for nanoseconds waits (it wrapped to "do not wait" before).
  EXPECT_EQ(selector.wait_for(std::chrono::milliseconds::max()), index);  // end of stream is ready too
  closer.join();
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

class SelectorRingTest : public test::LeakCheckedTest {};

// Wake-ups of this thread that it asked for (sleeps that ended), so far.
long voluntary_switches() {
  rusage usage{};
  EXPECT_EQ(::getrusage(RUSAGE_THREAD, &usage), 0);
  return usage.ru_nvcsw;
}

// Only rings wait: the Selector sleeps on their futex words (no re-check every 200 us), and
// wakes up only to look for a dead writer now and then.
TEST_F(SelectorRingTest, ASelectorWaitingOnlyOnRingsSleeps) {
  auto [a_tx, a_rx] = channel<int>(Transport::ShmRing);
  auto [b_tx, b_rx] = channel<int>(Transport::ShmRing);
  Selector selector;
  selector.add(a_rx);
  selector.add(b_rx);
  const long before = voluntary_switches();
  EXPECT_FALSE(selector.wait_for(500ms).has_value());
  const long sleeps = voluntary_switches() - before;
  // Re-checking every 200 us would take about 2,500 sleeps; looking for a dead writer every
  // 100 ms takes about 5 (more when the thread is preempted, which counts as involuntary).
  EXPECT_LE(sleeps, 50) << "the Selector woke " << sleeps << " times in 500 ms";
}

// Three rings, written by a live process in turn: each write wakes the sleeping Selector
// with the right index.
TEST_F(SelectorRingTest, EachRingWakesASleepingSelectorWithItsIndex) {
  std::vector<Sender<int>> senders;
  std::vector<Receiver<int>> receivers;
  for (int i = 0; i < 3; ++i) {
    auto [tx, rx] = channel<int>(Transport::ShmRing);
    senders.push_back(std::move(tx));
    receivers.push_back(std::move(rx));
  }
  auto [go_tx, go_rx] = channel<int>(Transport::Pipe);
  // Structured bindings are named explicitly: clang 14 cannot capture them implicitly.
  const pid_t child = test::fork_child([&, &go_tx = go_tx, &go_rx = go_rx] {
    for (auto& rx : receivers) rx.detach();
    go_tx.detach();
    // The parent asks for one ring at a time, once it waits.
    while (auto which = go_rx.recv()) {
      std::this_thread::sleep_for(20ms);  // let the parent's Selector fall asleep
      senders[static_cast<std::size_t>(*which)].send(*which * 10);
    }
  });
  for (auto& tx : senders) tx.detach();
  go_rx.close();
  Selector selector;
  for (auto& rx : receivers) selector.add(rx);
  for (const int which : {2, 0, 1, 2}) {
    go_tx.send(which);
    const auto ready = selector.wait_for(10s);
    ASSERT_EQ(ready, static_cast<std::size_t>(which));
    EXPECT_EQ(receivers[static_cast<std::size_t>(which)].try_recv().value(), which * 10);
  }
  go_tx.close();
  EXPECT_TRUE(test::child_succeeded(child));
  // The writers exited: every ring reports its end.
  for (std::size_t i = 0; i < receivers.size(); ++i) {
    ASSERT_TRUE(selector.wait_for(10s).has_value());
    EXPECT_THROW((void)receivers[i].recv_for(5s), PeerDied);
  }
}

// More rings than one futex_waitv takes (128): the Selector re-checks them every 200 us
// instead, and still finds the ring that was written, and one whose writer closed.
TEST_F(SelectorRingTest, MoreRingsThanOneFutexWaitTakesAreRecheckedInstead) {
  ChannelOptions options;
  options.ring_capacity = 4096;
  std::vector<Sender<int>> senders;
  std::vector<Receiver<int>> receivers;
  Selector selector;
  for (std::size_t i = 0; i <= kMaxFutexWaitWords; ++i) {
    auto [tx, rx] = channel<int>(Transport::ShmRing, options);
    senders.push_back(std::move(tx));
    receivers.push_back(std::move(rx));
  }
  for (auto& rx : receivers) selector.add(rx);
  EXPECT_FALSE(selector.wait_for(20ms).has_value());
  std::thread writer([&senders] {
    std::this_thread::sleep_for(20ms);  // the Selector waits by now
    senders.back().send(128);
  });
  const auto ready = selector.wait_for(10s);
  writer.join();
  ASSERT_EQ(ready, kMaxFutexWaitWords);
  EXPECT_EQ(receivers.back().try_recv().value(), 128);
  senders.front().close();
  ASSERT_EQ(selector.wait_for(10s), std::size_t{0});
  EXPECT_TRUE(receivers.front().try_recv().closed());
}

// A writer killed while the Selector sleeps on its ring: the Selector wakes (it looks at
// the companion sockets every 100 ms) and recv() reports the death.
TEST_F(SelectorRingTest, AWriterKilledWhileTheSelectorSleepsWakesIt) {
  auto [tx, rx] = channel<int>(Transport::ShmRing);
  auto [other_tx, other_rx] = channel<int>(Transport::ShmRing);
  const pid_t child = test::fork_child([&tx = tx, &rx = rx] {
    rx.detach();
    tx.send(1);
    ::pause();  // until killed
  });
  tx.detach();
  Selector selector;
  const std::size_t index = selector.add(rx);
  selector.add(other_rx);
  ASSERT_EQ(selector.wait_for(10s), index);
  EXPECT_EQ(rx.recv().value(), 1);
  std::thread killer([child] {
    std::this_thread::sleep_for(50ms);  // the Selector sleeps by now
    ::kill(child, SIGKILL);
  });
  const auto ready = selector.wait_for(10s);
  killer.join();
  ASSERT_EQ(ready, index);
  EXPECT_THROW((void)rx.recv(), PeerDied);
  const test::ChildExit exit = test::wait_child(child);
  EXPECT_EQ(exit.signal, SIGKILL) << exit.describe();
  other_tx.close();
}

// A ring next to a pipe in one set: the ring is re-checked at short intervals (futexes
// cannot wait together with descriptors), and a value sent on it still wakes the Selector.
TEST_F(SelectorRingTest, ARingNextToAPipeStillWakesTheSelector) {
  auto [ring_tx, ring_rx] = channel<int>(Transport::ShmRing);
  auto [pipe_tx, pipe_rx] = channel<int>(Transport::Pipe);
  const pid_t child = test::fork_child([&ring_tx = ring_tx, &ring_rx = ring_rx] {
    ring_rx.detach();
    std::this_thread::sleep_for(50ms);
    ring_tx.send(5);
    ring_tx.close();
  });
  ring_tx.detach();
  Selector selector;
  const std::size_t ring = selector.add(ring_rx);
  selector.add(pipe_rx);
  ASSERT_EQ(selector.wait_for(10s), ring);
  EXPECT_EQ(ring_rx.recv().value(), 5);
  EXPECT_TRUE(test::child_succeeded(child));
  pipe_tx.close();
}

// A reader whose readiness descriptor is a hint that stays quiet (an eventfd nobody
// writes), as a UCX wake-up fd may for a frame that did arrive (UCX before 1.14); it holds
// a frame once `arrived` is set.
class QuietHintReader final : public detail::FrameReader {
 public:
  explicit QuietHintReader(std::shared_ptr<std::atomic<bool>> arrived)
      : QuietHintReader(std::move(arrived), detail::UniqueFd(::eventfd(0, EFD_CLOEXEC))) {}
  ReadStatus read(detail::FrameHeader&, std::vector<std::byte>&, std::deque<detail::UniqueFd>&,
                  const detail::Deadline&) override {
    return ReadStatus::Closed;
  }
  bool has_buffered_frame() const override { return arrived_->load(); }
  void close() noexcept override {}

 private:
  QuietHintReader(std::shared_ptr<std::atomic<bool>> arrived, detail::UniqueFd fd)
      : FrameReader(hinting(fd.get())), arrived_(std::move(arrived)), fd_(std::move(fd)) {}
  static detail::TransportCapabilities hinting(int fd) noexcept {
    detail::TransportCapabilities capabilities;
    capabilities.readiness_fd = fd;
    capabilities.readiness_fd_is_a_hint = true;
    return capabilities;
  }

  std::shared_ptr<std::atomic<bool>> arrived_;
  detail::UniqueFd fd_;
};

// A Selector looks at such a receiver now and then without a wake-up, so a frame whose
// wake-up never came is found long before the wait's deadline.
TEST(SelectorTest, AReceiverWhoseHintStaysQuietIsStillFoundReady) {
  auto arrived = std::make_shared<std::atomic<bool>>(false);
  Receiver<int> rx = detail::receiver_over<int>(std::make_unique<QuietHintReader>(arrived), Transport::Ucx, {});
  Selector selector;
  selector.add(rx);
  EXPECT_FALSE(selector.wait_for(std::chrono::milliseconds(120)).has_value()) << "nothing arrived yet";
  std::thread arrival([&arrived] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    arrived->store(true);
  });
  const auto start = std::chrono::steady_clock::now();
  const std::optional<std::size_t> index = selector.wait_for(std::chrono::seconds(20));
  arrival.join();
  ASSERT_TRUE(index.has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10))
      << "found only at the deadline: the Selector trusted the quiet descriptor";
}

TEST(SelectorTest, EmptySelectorRefusesToWaitForEver) {
  Selector selector;
  EXPECT_THROW((void)selector.wait(), Error);
  EXPECT_FALSE(selector.try_wait().has_value());
}

class SelectorInProcessTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {
 protected:
  void TearDown() override {
    EXPECT_TRUE(test::has_no_children());
    LeakCheckedTest::TearDown();
  }
};

INSTANTIATE_TEST_SUITE_P(Transports, SelectorInProcessTest, ::testing::ValuesIn(test::interprocess_transports()),
                         test::transport_test_name);

TEST_P(SelectorInProcessTest, AThreadAndAProcessFanInTogether) {
  auto [thread_tx, thread_rx] = channel<Tagged>(Transport::InProcess);
  auto [process_tx, process_rx] = channel<Tagged>(GetParam());
  std::vector<Receiver<Tagged>> receivers;
  receivers.push_back(std::move(thread_rx));
  receivers.push_back(std::move(process_rx));
  Selector selector;
  for (auto& receiver : receivers) selector.add(receiver);  // an InProcess receiver is welcome
  // Nothing sent yet: neither is ready.
  EXPECT_FALSE(selector.try_wait().has_value());
  EXPECT_FALSE(selector.wait_for(2ms).has_value());
  auto workers = spawn(1, produce, std::move(process_tx));
  std::thread thread([&tx = thread_tx] {
    for (int i = 0; i < kMessagesPerWorker; ++i) tx.send(Tagged{7, i});
    tx.close();
  });
  std::vector<int> next(2, 0);
  while (!selector.empty()) {
    const std::size_t index = selector.wait();
    // A ready in-process receiver never waits; a process's frame may still be arriving.
    auto message = index == 0 ? receivers[0].try_recv() : receivers[1].recv_for(10s);
    if (message.closed()) {
      selector.remove(index);
      continue;
    }
    ASSERT_TRUE(message.has_value()) << "receiver " << index << " was reported ready but had nothing";
    ASSERT_EQ(message->rank, index == 0 ? 7 : 0);
    ASSERT_EQ(message->sequence, next[index]++);
  }
  EXPECT_EQ(next[0], kMessagesPerWorker);
  EXPECT_EQ(next[1], kMessagesPerWorker);
  thread.join();
  workers.join();
}

TEST(SelectorTest, AnInProcessReceiverWhoseSenderFailedIsReadyAndReportsPeerDied) {
  auto [tx, rx] = channel<int>(Transport::InProcess);
  Selector selector;
  const std::size_t index = selector.add(rx);
  std::thread([&tx = tx] {
    try {
      Sender<int> local = std::move(tx);
      throw std::runtime_error("the producer failed");
    } catch (const std::runtime_error&) {
    }
  }).join();
  ASSERT_EQ(selector.wait_for(10s), index);
  EXPECT_THROW((void)rx.try_recv(), PeerDied);
  // A receiver closed here is ready too (its recv() returns at once).
  auto [tx2, rx2] = channel<int>(Transport::InProcess);
  selector.remove(index);
  const std::size_t second = selector.add(rx2);
  EXPECT_FALSE(selector.try_wait().has_value());
  rx2.close();
  EXPECT_EQ(selector.try_wait(), second);
}

TEST(SelectorTest, AnEmptyReceiverIsRefusedWithAnErrorThatSaysSo) {
  Selector selector;
  Receiver<int> empty;
  try {
    selector.add(empty);
    FAIL() << "an empty Receiver was added";
  } catch (const ChannelClosed& error) {
    FAIL() << "ChannelClosed for a receiver that was never a channel's: " << error.what();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("empty"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(selector.empty());
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

INSTANTIATE_TEST_SUITE_P(StartMethodsAndTransports, FanInTest,
                         ::testing::Combine(::testing::Values(StartMethod::Fork, StartMethod::Spawn),
                                            ::testing::ValuesIn(test::interprocess_transports())),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == StartMethod::Fork ? "Fork" : "Spawn") + "_" +
                                  test::transport_test_name(
                                      ::testing::TestParamInfo<Transport>(std::get<1>(info.param), info.index));
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
