// Closing a sender whose receiver has not read yet: close() returns at once when the
// receiver belongs to this process (a single-threaded program closes before it reads),
// and the receiver still gets every message, then end of stream; a forked receiver that
// reads late, or that took the end over and is slow, gets its data too. Plain Senders,
// Distributors and Broadcasts, over every inter-process transport; nothing leaks. Also: a
// sender that dies while a large body is being read leaves the receiving end marked dead
// at once (its state, introspection's "peer_died").
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ferry/ferry.hpp"
#include "ferry/introspection.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/transports.hpp"

namespace ferry::close_linger_test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Well within ChannelOptions::close_linger (10 s), generous for a loaded machine.
constexpr auto kPrompt = 2s;

struct Numbered {
  std::int64_t index = 0;
  Tensor data;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(index, data);
  }
};

Tensor shared_tensor(std::int64_t index) {
  Tensor tensor = Tensor::zeros({1024}, DType::Int64, Device::SharedCpu);
  tensor.fill<std::int64_t>(index * 7 + 1);
  return tensor;
}

// Runs `close` and returns how long it took.
template <class Close>
Clock::duration timed(Close&& close) {
  const auto start = Clock::now();
  close();
  return Clock::now() - start;
}

// Receives `count` Numbered messages 0..count-1 (each tensor filled with index * 7 + 1), then
// end of stream.
::testing::AssertionResult receives_numbered(Receiver<Numbered>& rx, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    std::optional<Numbered> got = rx.recv();
    if (!got) return ::testing::AssertionFailure() << "end of stream after " << i << " messages";
    if (got->index != i) return ::testing::AssertionFailure() << "message " << got->index << " instead of " << i;
    const std::vector<std::int64_t> values = got->data.to_vector<std::int64_t>();
    if (values.size() != 1024 || std::any_of(values.begin(), values.end(), [i](auto v) { return v != i * 7 + 1; })) {
      return ::testing::AssertionFailure() << "message " << i << " carries other contents";
    }
  }
  if (rx.recv()) return ::testing::AssertionFailure() << "more than " << count << " messages";
  return ::testing::AssertionSuccess();
}

class CloseBeforeReadTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {};

INSTANTIATE_TEST_SUITE_P(Transports, CloseBeforeReadTest, ::testing::ValuesIn(test::interprocess_transports()),
                         test::transport_test_name);

TEST_P(CloseBeforeReadTest, PlainSenderOfSharedTensorsClosesAtOnce) {
  auto [tx, rx] = channel<Numbered>(GetParam());
  for (std::int64_t i = 0; i < 3; ++i) tx.send(Numbered{i, shared_tensor(i)});
  EXPECT_LT(timed([&tx = tx] { tx.close(); }), kPrompt);
  EXPECT_TRUE(receives_numbered(rx, 3));
}

TEST_P(CloseBeforeReadTest, SenderDestroyedBeforeTheReceiverReadsClosesAtOnce) {
  auto [tx, rx] = channel<Numbered>(GetParam());
  const auto took = timed([&tx = tx] {
    Sender<Numbered> sender = std::move(tx);
    sender.send(Numbered{0, shared_tensor(0)});
  });
  EXPECT_LT(took, kPrompt);
  EXPECT_TRUE(receives_numbered(rx, 1));
}

TEST_P(CloseBeforeReadTest, ReceiverClosedUnreadLetsTheKeptSegmentsGo) {
  auto [tx, rx] = channel<Numbered>(GetParam());
  tx.send(Numbered{0, shared_tensor(0)});
  EXPECT_LT(timed([&tx = tx] { tx.close(); }), kPrompt);
  rx.close();  // never read: what the sender kept for it goes (the fixture counts fds)
}

TEST_P(CloseBeforeReadTest, DistributorClosesAtOnceAndItsConsumersReadEverything) {
  std::vector<Receiver<std::uint64_t>> receivers;
  Distributor<std::uint64_t> pool;
  for (int i = 0; i < 2; ++i) {
    auto [tx, rx] = channel<std::uint64_t>(GetParam());
    pool.add(std::move(tx));
    receivers.push_back(std::move(rx));
  }
  for (std::uint64_t i = 0; i < 4; ++i) pool.send(i);
  EXPECT_LT(timed([&pool] { pool.close(); }), kPrompt);
  std::vector<std::uint64_t> seen;
  for (Receiver<std::uint64_t>& rx : receivers) {
    while (std::optional<std::uint64_t> value = rx.recv()) seen.push_back(*value);
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::uint64_t>{0, 1, 2, 3}));
}

TEST_P(CloseBeforeReadTest, BroadcastClosesAtOnceAndEveryConsumerReadsEverything) {
  std::vector<Receiver<Numbered>> receivers;
  Broadcast<Numbered> all;
  for (int i = 0; i < 2; ++i) {
    auto [tx, rx] = channel<Numbered>(GetParam());
    all.add(std::move(tx));
    receivers.push_back(std::move(rx));
  }
  for (std::int64_t i = 0; i < 2; ++i) all.send(Numbered{i, shared_tensor(i)});
  EXPECT_LT(timed([&all] { all.close(); }), kPrompt);
  for (Receiver<Numbered>& rx : receivers) EXPECT_TRUE(receives_numbered(rx, 2));
}

// The receiver's process is a forked child that takes the end over only when it reads, after
// the close returned: this process still has what it must open.
TEST_P(CloseBeforeReadTest, ForkedReceiverThatReadsLateGetsEverything) {
  auto [tx, rx] = channel<Numbered>(GetParam());
  const pid_t child = test::fork_child([&, &rx = rx, &tx = tx] {
    tx.detach();
    std::this_thread::sleep_for(300ms);
    CHILD_CHECK(receives_numbered(rx, 2));
  });
  for (std::int64_t i = 0; i < 2; ++i) tx.send(Numbered{i, shared_tensor(i)});
  EXPECT_LT(timed([&tx = tx] { tx.close(); }), kPrompt);
  EXPECT_TRUE(test::child_succeeded(child));
  rx.detach();  // the child's
}

// A forked child that took the end over before the close and reads slowly: the close waits
// for it, as long as ChannelOptions::close_linger at most, so this process may exit at once.
TEST_P(CloseBeforeReadTest, ForkedReceiverThatIsSlowGetsEverything) {
  auto [tx, rx] = channel<Numbered>(GetParam());
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = test::fork_child([&, &rx = rx, &tx = tx] {
    tx.detach();
    rx.adopt();
    const char byte = 'r';
    CHILD_CHECK(::write(ready[1], &byte, 1) == 1);
    std::this_thread::sleep_for(300ms);
    CHILD_CHECK(receives_numbered(rx, 2));
  });
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  rx.detach();
  for (std::int64_t i = 0; i < 2; ++i) tx.send(Numbered{i, shared_tensor(i)});
  EXPECT_LT(timed([&tx = tx] { tx.close(); }), 9s);  // waits for the child (the linger is 10 s)
  EXPECT_TRUE(test::child_succeeded(child));
}

// ---- a sender that dies while a large body is read ----------------------------------------

class DeathMidBodyTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {};

// Stream transports read a large byte message's body as the decoder gets to it; a pipe is
// the one that holds less than such a body (a Unix socket's send buffer grows to the frame).
INSTANTIATE_TEST_SUITE_P(Transports, DeathMidBodyTest, ::testing::Values(Transport::Pipe), test::transport_test_name);

std::optional<EndSnapshot> receiving_end_named(const std::string& label) {
  for (const EndSnapshot& end : snapshot().ends) {
    if (!end.sends && end.label == label) return end;
  }
  return std::nullopt;
}

TEST_P(DeathMidBodyTest, TheEndIsDeadAsSoonAsTheReceiveThrows) {
  ChannelOptions options;
  options.name = "death-mid-body";
  auto [tx, rx] = channel<std::vector<std::uint8_t>>(GetParam(), options);
  const pid_t child = test::fork_child([&, &rx = rx, &tx = tx] {
    rx.close();
    tx.adopt();
    tx.send(std::vector<std::uint8_t>(1 << 20, 5));  // read as it comes (pending); blocks when full
  });
  tx.detach();
  std::this_thread::sleep_for(200ms);  // the child fills the transport
  ASSERT_EQ(::kill(child, SIGSTOP), 0);
  std::thread killer([child] {
    std::this_thread::sleep_for(300ms);  // the receive below is in the body by then
    ::kill(child, SIGKILL);
  });
  EXPECT_THROW(rx.recv(), PeerDied);
  killer.join();
  const std::optional<EndSnapshot> end = receiving_end_named("death-mid-body");
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->state, "peer_died");
  EXPECT_THROW(rx.recv(), PeerDied);  // stays dead
  EXPECT_EQ(test::wait_child(child).signal, SIGKILL);
}

}  // namespace
}  // namespace ferry::close_linger_test
