// Transport::InProcess: channels between threads of one process, on moodycamel's
// BlockingConcurrentQueue. Values are moved, never serialized.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ferry/detail/frame_channel.hpp"
#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;

class InProcessTest : public test::LeakCheckedTest {};

// Counts its copies, to show that a moved value is never copied or serialized.
struct Tracked {
  static inline std::atomic<int> copies{0};
  int value = 0;
  Tensor tensor;
  Tracked() = default;
  Tracked(int v, Tensor t) : value(v), tensor(std::move(t)) {}
  Tracked(const Tracked& other) : value(other.value), tensor(other.tensor) { ++copies; }
  Tracked& operator=(const Tracked& other) {
    value = other.value;
    tensor = other.tensor;
    ++copies;
    return *this;
  }
  Tracked(Tracked&&) noexcept = default;
  Tracked& operator=(Tracked&&) noexcept = default;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(value, tensor);
  }
};

ChannelOptions queue_of(std::size_t capacity) {
  ChannelOptions options;
  options.queue_capacity = capacity;
  return options;
}

TEST_F(InProcessTest, ValuesArriveInOrderThenEndOfStream) {
  auto [tx, rx] = channel<std::string>(Transport::InProcess);
  EXPECT_EQ(tx.transport(), Transport::InProcess);
  EXPECT_EQ(rx.transport(), Transport::InProcess);
  std::thread producer([&tx = tx] {
    for (int i = 0; i < 10'000; ++i) tx.send("message " + std::to_string(i));
    tx.close();
  });
  for (int i = 0; i < 10'000; ++i) {
    auto value = rx.recv();
    ASSERT_TRUE(value.has_value());
    ASSERT_EQ(*value, "message " + std::to_string(i));
  }
  EXPECT_FALSE(rx.recv().has_value());
  EXPECT_FALSE(rx.recv().has_value());  // stays at end of stream
  EXPECT_TRUE(rx.try_recv().closed());
  producer.join();
  EXPECT_THROW(tx.send("late"), ChannelClosed);
}

TEST_F(InProcessTest, ValuesAreMovedNotCopiedAndTensorsAreTheSameObjects) {
  auto [tx, rx] = channel<Tracked>(Transport::InProcess);
  Tensor heap = Tensor::zeros({16}, DType::Float32);  // private heap memory: not moved to shared memory
  const void* data = heap.data_ptr();
  Tracked::copies = 0;
  tx.send(Tracked{7, heap});
  auto got = rx.recv();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(Tracked::copies.load(), 0);
  EXPECT_EQ(got->value, 7);
  EXPECT_EQ(got->tensor.data_ptr(), data);
  EXPECT_TRUE(got->tensor.shares_storage_with(heap));
  EXPECT_EQ(got->tensor.device(), Device::Cpu);
  // A const value is copied once, into the queue.
  const Tracked original{8, heap};
  tx.send(original);
  EXPECT_EQ(Tracked::copies.load(), 1);
  EXPECT_EQ(rx.recv()->value, 8);
}

TEST_F(InProcessTest, RecvForTimesOutAndTryRecvDoesNotBlock) {
  auto [tx, rx] = channel<int>(Transport::InProcess);
  const auto start = std::chrono::steady_clock::now();
  auto result = rx.recv_for(50ms);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 45ms);
  EXPECT_TRUE(result.timed_out());
  EXPECT_TRUE(rx.try_recv().timed_out());
  tx.send(5);
  auto ready = rx.try_recv();
  ASSERT_TRUE(ready);
  EXPECT_EQ(*ready, 5);
  tx.close();
  EXPECT_TRUE(rx.recv_for(1s).closed());
  EXPECT_FALSE(tx.is_open());
}

// A received value can be read through a const RecvResult (value(), *, ->).
TEST_F(InProcessTest, ConstRecvResultGivesReadAccessToItsValue) {
  auto [tx, rx] = channel<std::vector<int>>(Transport::InProcess);
  tx.send(std::vector<int>{1, 2, 3});
  const RecvResult<std::vector<int>> result = rx.try_recv();
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result.value(), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ((*result)[1], 2);
  EXPECT_EQ(result->size(), 3u);
  const RecvResult<std::vector<int>> nothing = rx.try_recv();
  EXPECT_THROW(static_cast<void>(nothing.value()), std::bad_optional_access);
}

TEST_F(InProcessTest, SendForTimesOutOnAFullQueue) {
  auto [tx, rx] = channel<int>(Transport::InProcess, queue_of(4));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(tx.send_for(i, 1s));
  int value = 4;
  EXPECT_FALSE(tx.send_for(std::move(value), 20ms));
  EXPECT_EQ(rx.recv().value(), 0);
  EXPECT_TRUE(tx.send_for(4, 1s));
  for (int i = 1; i <= 4; ++i) EXPECT_EQ(rx.recv().value(), i);
  EXPECT_TRUE(tx.flush(1s));
}

TEST_F(InProcessTest, FullQueueBlocksTheSenderUntilTheReceiverTakesOne) {
  auto [tx, rx] = channel<int>(Transport::InProcess, queue_of(2));
  std::atomic<int> sent{0};
  std::thread producer([&tx = tx, &sent] {
    for (int i = 0; i < 100; ++i) {
      tx.send(i);
      sent = i + 1;
    }
    tx.close();
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_LE(sent.load(), 2);  // never more than the capacity ahead
  for (int i = 0; i < 100; ++i) ASSERT_EQ(rx.recv().value(), i);
  EXPECT_FALSE(rx.recv().has_value());
  producer.join();
}

TEST_F(InProcessTest, ClosedReceiverMakesSendFailAndWakesABlockedSender) {
  auto [tx, rx] = channel<int>(Transport::InProcess, queue_of(1));
  tx.send(1);
  std::thread blocked([&tx = tx] { EXPECT_THROW(tx.send(2), ChannelClosed); });
  std::this_thread::sleep_for(20ms);
  rx.close();
  blocked.join();
  EXPECT_THROW(tx.send(3), ChannelClosed);
  EXPECT_FALSE(tx.is_open());
  EXPECT_FALSE(rx.is_open());
  EXPECT_TRUE(rx.try_recv().closed());
}

TEST_F(InProcessTest, EndOfStreamWaitsForValuesFromEveryThread) {
  auto [tx, rx] = channel<int>(Transport::InProcess, queue_of(64));
  constexpr int kThreads = 4;
  constexpr int kEach = 5'000;
  std::vector<std::thread> producers;
  for (int t = 0; t < kThreads; ++t) {
    producers.emplace_back([&tx = tx, t] {
      for (int i = 0; i < kEach; ++i) tx.send(t * kEach + i);
    });
  }
  std::thread closer([&producers, &tx = tx] {
    for (auto& producer : producers) producer.join();
    tx.close();
  });
  std::vector<int> last(kThreads, -1);
  int received = 0;
  Receiver<int>& receiver = rx;
  while (auto value = receiver.recv()) {
    const int thread = *value / kEach;
    EXPECT_LT(last[thread], *value % kEach);  // in order per sending thread
    last[thread] = *value % kEach;
    ++received;
  }
  closer.join();
  EXPECT_EQ(received, kThreads * kEach);
}

TEST_F(InProcessTest, ValuesSentFromSeveralThreadsInTurnArriveInTheOrderTheyWereSent) {
  // Two threads send in strict turns (0 from one, 1 from the other, ...) into a queue large
  // enough for all; the receiver reads them afterwards: the n-th value taken is the n-th
  // sent (what Sender::delivered() counts on), whichever thread sent it.
  constexpr int kValues = 2000;
  auto [tx, rx] = channel<int>(Transport::InProcess, queue_of(kValues));
  std::atomic<int> turn{0};
  auto send_every_other = [&tx = tx, &turn](int parity) {
    for (int v = parity; v < kValues; v += 2) {
      while (turn.load(std::memory_order_acquire) != v) std::this_thread::yield();
      tx.send(v);
      turn.store(v + 1, std::memory_order_release);
    }
  };
  std::thread even(send_every_other, 0);
  std::thread odd(send_every_other, 1);
  even.join();
  odd.join();
  EXPECT_EQ(tx.last_sequence(), static_cast<std::uint64_t>(kValues));
  for (int v = 0; v < kValues; ++v) {
    const auto got = rx.try_recv();
    ASSERT_TRUE(got.has_value());
    ASSERT_EQ(*got, v) << "a value overtook one sent before it from another thread";
  }
  EXPECT_EQ(tx.delivered(), static_cast<std::uint64_t>(kValues));
}

TEST_F(InProcessTest, DestroyingTheSenderEndsTheStreamAndDestroyingTheReceiverDropsQueuedValues) {
  auto [tx, rx] = channel<Tensor>(Transport::InProcess);
  Tensor t = Tensor::zeros({4}, DType::Int32);
  tx.send(t);
  {
    Sender<Tensor> moved = std::move(tx);
    moved.send(t);
  }
  EXPECT_TRUE(rx.recv().has_value());
  EXPECT_TRUE(rx.recv().has_value());
  EXPECT_FALSE(rx.recv().has_value());

  auto [tx2, rx2] = channel<Tensor>(Transport::InProcess);
  tx2.send(t);
  EXPECT_EQ(t.storage().use_count(), 2);  // t and the queued copy
  { Receiver<Tensor> gone = std::move(rx2); }
  EXPECT_EQ(t.storage().use_count(), 1);
  EXPECT_THROW(tx2.send(t), ChannelClosed);
}

TEST_F(InProcessTest, ASenderDestroyedByAnExceptionIsPeerDiedNotEndOfStream) {
  // A producer thread that fails must not look like one that finished: as on a pipe, the
  // receiver gets what was sent, then PeerDied (again on every later call).
  auto [tx, rx] = channel<int>(Transport::InProcess);
  std::thread producer([&tx = tx] {
    try {
      Sender<int> local = std::move(tx);
      local.send(1);
      throw std::runtime_error("the producer failed");
    } catch (const std::runtime_error&) {
    }
  });
  producer.join();
  EXPECT_EQ(rx.recv().value(), 1);
  EXPECT_THROW((void)rx.recv(), PeerDied);
  EXPECT_THROW((void)rx.try_recv(), PeerDied);
  // A Sender closed on purpose while an exception unwinds still ends the stream cleanly.
  auto [tx2, rx2] = channel<int>(Transport::InProcess);
  try {
    Sender<int> local = std::move(tx2);
    local.send(2);
    local.close();
    throw std::runtime_error("after close");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(rx2.recv().value(), 2);
  EXPECT_FALSE(rx2.recv().has_value());
}

TEST_F(InProcessTest, ADuplexEndDestroyedByAnExceptionIsPeerDiedForTheOtherEnd) {
  auto [a, b] = duplex<int, int>(Transport::InProcess);
  std::thread server([&b = b] {
    try {
      DuplexEnd<int, int> local = std::move(b);
      local.send(local.recv().value() + 1);
      throw std::runtime_error("the server failed");
    } catch (const std::runtime_error&) {
    }
  });
  EXPECT_EQ(a.call(41).value(), 42);
  server.join();
  EXPECT_THROW((void)a.recv(), PeerDied);
  EXPECT_THROW(a.send(1), ChannelClosed);  // the failed end's receiving half is gone too
}

TEST_F(InProcessTest, EmptyEndsSayWhatIsWrong) {
  Sender<int> empty;
  EXPECT_FALSE(empty.is_open());
  EXPECT_THROW(empty.send(1), ChannelClosed);
  EXPECT_THROW(detail::make_transport(Transport::InProcess, FrameLimits{}, 4096), Error);
}

// Assigning over an end ends what it held, as destroying it would: the old stream ends
// after its values, and a receiving end assigned over is closed for its sender.
TEST_F(InProcessTest, AssigningOverAnEndEndsWhatItHeld) {
  auto [tx, rx] = channel<int>(Transport::InProcess);
  auto [tx2, rx2] = channel<int>(Transport::InProcess);
  tx.send(1);
  tx = std::move(tx2);
  EXPECT_EQ(rx.recv(), 1);
  EXPECT_EQ(rx.recv(), std::nullopt);
  tx.send(2);
  EXPECT_EQ(rx2.recv(), 2);

  auto [tx3, rx3] = channel<int>(Transport::InProcess);
  rx3 = std::move(rx2);
  EXPECT_THROW(tx3.send(3), ChannelClosed);
  tx.send(4);
  EXPECT_EQ(rx3.recv(), 4);
}

// A default-constructed (or moved-from) end has no transport: asking for one says so, and
// closing it does nothing.
TEST_F(InProcessTest, EmptyEndsHaveNoTransport) {
  Sender<int> sender;
  Receiver<int> receiver;
  EXPECT_FALSE(receiver.is_open());
  EXPECT_THROW((void)receiver.recv(), ChannelClosed);
  const auto expect_empty = [](auto&& ask, const char* message) {
    try {
      (void)ask();
      ADD_FAILURE() << "an empty end named a transport";
    } catch (const ChannelClosed& error) {
      EXPECT_STREQ(error.what(), message);
    }
  };
  expect_empty([&] { return sender.transport(); }, "this Sender is empty (moved from or default-constructed)");
  expect_empty([&] { return receiver.transport(); }, "this Receiver is empty (moved from or default-constructed)");
  sender.close();
  receiver.close();
  auto ends = channel<int>(Transport::InProcess);  // not a structured binding: clang 14 cannot capture one
  Sender<int> moved = std::move(ends.first);
  EXPECT_EQ(moved.transport(), Transport::InProcess);
  expect_empty([&] { return ends.first.transport(); },  // NOLINT(bugprone-use-after-move)
               "this Sender is empty (moved from or default-constructed)");
}

// Asking an open in-process end for what only a framed end has is a misuse, not a closed
// channel: the error says what was asked, and the end keeps working.
template <class F>
void expect_misuse(F&& misuse, const std::string& named) {
  try {
    misuse();
    ADD_FAILURE() << "the misuse was accepted";
  } catch (const ChannelClosed& error) {
    ADD_FAILURE() << "ChannelClosed for an open end: " << error.what();
  } catch (const Error& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find(named), std::string::npos) << what;
    EXPECT_NE(what.find("InProcess"), std::string::npos) << what;
  }
}

TEST_F(InProcessTest, MisusesOfAnInProcessEndAreNamedNotReportedAsClosed) {
  auto [tx, rx] = channel<int>(Transport::InProcess);
  expect_misuse([&tx = tx] { (void)detail::EndAccess::core(tx); }, "frame core");
  expect_misuse([&rx = rx] { (void)detail::EndAccess::core(rx); }, "frame core");
  expect_misuse([&tx = tx] { (void)describe_end(tx); }, "cannot describe an InProcess Sender<int> for another process");
  expect_misuse([&rx = rx] { (void)describe_end(rx); },
                "cannot describe an InProcess Receiver<int> for another process");
  EXPECT_TRUE(tx.is_open());
  EXPECT_TRUE(rx.is_open());
  tx.send(3);
  EXPECT_EQ(rx.recv().value(), 3);
}

}  // namespace
}  // namespace ferry
