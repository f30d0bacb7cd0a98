// Distributor<T> and Broadcast<T>: selection by messages in flight, flow control, consumers
// that close, die or join, messages handed back, and one storage shared by every consumer
// of a broadcast, over every transport (consumers in this process, in threads, and in
// forked worker processes).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/transports.hpp"

namespace ferry::fanout_test {
namespace {

using namespace std::chrono_literals;
using Ids = std::vector<std::uint64_t>;

std::vector<Transport> every_transport() {
  return {Transport::Pipe, Transport::UnixSocket, Transport::ShmRing, Transport::InProcess};
}

SpawnOptions forked() {
  SpawnOptions options;
  options.start_method = StartMethod::Fork;
  options.termination_grace = 2s;
  return options;
}

// Every id of `reports` (what consumers received) and `handed_back`, each exactly once, is
// 0 .. count-1: nothing lost, nothing delivered twice.
::testing::AssertionResult each_once(const std::vector<Ids>& reports, const Ids& handed_back, std::uint64_t count) {
  std::map<std::uint64_t, int> seen;
  for (const Ids& ids : reports) {
    for (const std::uint64_t id : ids) ++seen[id];
  }
  for (const std::uint64_t id : handed_back) ++seen[id];
  for (std::uint64_t id = 0; id < count; ++id) {
    const auto it = seen.find(id);
    if (it == seen.end()) return ::testing::AssertionFailure() << "message " << id << " was lost";
    if (it->second != 1)
      return ::testing::AssertionFailure() << "message " << id << " arrived " << it->second << " times";
  }
  if (seen.size() != count) return ::testing::AssertionFailure() << "ids outside 0.." << count - 1 << " arrived";
  return ::testing::AssertionSuccess();
}

// ---- consumers in this process (each transport) ------------------------------------------

class FanoutTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {
 protected:
  struct Ends {
    std::vector<Receiver<std::uint64_t>> receivers;
    std::vector<ConsumerId> ids;
  };
  template <class Fanout>
  Ends add_consumers(Fanout& fanout, int n) {
    Ends ends;
    for (int i = 0; i < n; ++i) {
      auto [tx, rx] = channel<std::uint64_t>(GetParam());
      ends.ids.push_back(fanout.add(std::move(tx)));
      ends.receivers.push_back(std::move(rx));
    }
    return ends;
  }
  template <class Fanout>
  static std::size_t in_flight(Fanout& fanout, ConsumerId id) {
    for (const ConsumerStats& entry : fanout.stats()) {
      if (entry.id == id) return entry.in_flight;
    }
    ADD_FAILURE() << "no consumer " << id;
    return 0;
  }
};

INSTANTIATE_TEST_SUITE_P(Transports, FanoutTest, ::testing::ValuesIn(every_transport()), test::transport_test_name);

TEST_P(FanoutTest, DistributorSendsToTheConsumerWithTheFewestInFlight) {
  FanoutOptions options;
  options.max_in_flight = 4;
  options.work_ahead = {};  // a fixed bound (no pace)
  Distributor<std::uint64_t> pool(options);
  Ends ends = add_consumers(pool, 3);
  for (std::uint64_t id = 0; id < 3; ++id) pool.send(id);
  for (const ConsumerId consumer : ends.ids) EXPECT_EQ(in_flight(pool, consumer), 1u);
  // Consumer 1 takes its message: it has the fewest in flight, so the next two go to it
  // (one, then it ties with the others and the turn moves on).
  ASSERT_EQ(ends.receivers[1].recv().value(), 1u);
  EXPECT_EQ(in_flight(pool, ends.ids[1]), 0u);
  pool.send(3);
  EXPECT_EQ(in_flight(pool, ends.ids[1]), 1u);
  EXPECT_EQ(ends.receivers[1].recv().value(), 3u);
  const auto stats = pool.stats();
  ASSERT_EQ(stats.size(), 3u);
  EXPECT_EQ(stats[1].sent, 2u);
  EXPECT_EQ(stats[1].delivered, 2u);
  EXPECT_EQ(stats[0].delivered, 0u);
  EXPECT_EQ(stats[0].in_flight, 1u);
}

TEST_P(FanoutTest, DistributorSendForGivesUpWhenEveryConsumerIsFull) {
  FanoutOptions options;
  options.max_in_flight = 2;
  options.work_ahead = {};  // a fixed bound (no pace)
  Distributor<std::uint64_t> pool(options);
  Ends ends = add_consumers(pool, 2);
  for (std::uint64_t id = 0; id < 4; ++id) ASSERT_TRUE(pool.send_for(id, 1s));
  const auto before = std::chrono::steady_clock::now();
  EXPECT_FALSE(pool.send_for(4, 20ms)) << "every consumer has 2 in flight, its bound";
  EXPECT_GE(std::chrono::steady_clock::now() - before, 20ms);
  // A consumer that stops reading stops receiving; the other goes on.
  std::set<std::uint64_t> got;
  for (int i = 0; i < 2; ++i) got.insert(ends.receivers[1].recv().value());
  EXPECT_TRUE(pool.send_for(4, 1s));
  EXPECT_TRUE(pool.send_for(5, 1s));
  EXPECT_FALSE(pool.send_for(6, 0ms));
  for (int i = 0; i < 2; ++i) got.insert(ends.receivers[1].recv().value());
  EXPECT_TRUE(got.count(4) && got.count(5)) << "the consumer with room took the new messages";
  EXPECT_EQ(in_flight(pool, ends.ids[0]), 2u);
}

// The default bound (FanoutOptions::max_in_flight, 128) holds for an end added without one.
TEST_P(FanoutTest, ADefaultDistributorPassesOverAConsumerWith128InFlight) {
  ASSERT_EQ(FanoutOptions{}.max_in_flight, 128u);
  Distributor<std::uint64_t> pool;
  Ends ends = add_consumers(pool, 1);
  for (std::uint64_t id = 0; id < 128; ++id) ASSERT_TRUE(pool.send_for(id, 1s)) << "message " << id;
  EXPECT_FALSE(pool.send_for(128, 0ms)) << "the consumer has 128 in flight, the default bound";
  EXPECT_EQ(in_flight(pool, ends.ids[0]), 128u);
  EXPECT_EQ(ends.receivers[0].recv().value(), 0u);
  EXPECT_TRUE(pool.send_for(128, 1s)) << "one delivered: room for one more";
}

TEST_P(FanoutTest, DistributorHandsBackWhatAClosedConsumerNeverReceived) {
  FanoutOptions options;
  options.max_in_flight = 8;
  options.work_ahead = {};  // a fixed bound (no pace)
  Distributor<std::uint64_t> pool(options);
  Ends ends = add_consumers(pool, 2);
  for (std::uint64_t id = 0; id < 6; ++id) pool.send(id);  // 0 2 4 to one, 1 3 5 to the other
  const std::uint64_t first = ends.receivers[0].recv().value();
  ends.receivers[0].close();
  Ids back = pool.take_undelivered();
  std::sort(back.begin(), back.end());
  EXPECT_EQ(back, (Ids{first + 2, first + 4})) << "what the closed consumer never received comes back, once";
  EXPECT_TRUE(pool.take_undelivered().empty());
  EXPECT_EQ(pool.size(), 1u);
  // The rest go to the consumer that is left; it receives everything else exactly once.
  for (const std::uint64_t id : back) pool.send(id);
  Ids rest;
  for (int i = 0; i < 5; ++i) rest.push_back(ends.receivers[1].recv().value());
  EXPECT_TRUE(each_once({Ids{first}, rest}, {}, 6));
}

// A message that counts its copies (moves are free), with a payload a channel's limits
// may refuse.
struct Counted {
  static inline int copies = 0;
  std::uint64_t id = 0;
  std::string payload;
  Counted() = default;
  Counted(std::uint64_t id_, std::string payload_) : id(id_), payload(std::move(payload_)) {}
  Counted(const Counted& other) : id(other.id), payload(other.payload) { ++copies; }
  Counted& operator=(const Counted& other) {
    id = other.id;
    payload = other.payload;
    ++copies;
    return *this;
  }
  Counted(Counted&&) noexcept = default;
  Counted& operator=(Counted&&) noexcept = default;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(id, payload);
  }
};

// send(T&&) keeps the message itself in flight (no copy but the one an InProcess queue
// makes), hands it back intact from a closed consumer, and leaves it with the caller when
// no consumer took it or the channel refused it.
TEST_P(FanoutTest, DistributorKeepsAnRvalueInFlightWithoutCopyingIt) {
  const int queue_copies = GetParam() == Transport::InProcess ? 1 : 0;
  ChannelOptions small;
  small.limits.max_body_bytes = 1024;
  FanoutOptions options;
  options.max_in_flight = 2;
  options.work_ahead = {};  // a fixed bound (no pace)
  Distributor<Counted> pool(options);
  auto [tx, rx] = channel<Counted>(GetParam(), small);
  pool.add(std::move(tx));

  Counted::copies = 0;
  pool.send(Counted{0, "zero"});
  EXPECT_EQ(Counted::copies, queue_copies) << "an rvalue is kept, not copied";
  const Counted one{1, "one"};
  pool.send(one);
  EXPECT_EQ(Counted::copies, 2 * queue_copies + 1) << "an lvalue is copied once to be kept";

  Counted two{2, "two"};
  EXPECT_FALSE(pool.send_for(std::move(two), 0ms)) << "the consumer is full";
  EXPECT_EQ(two.id, 2u);
  EXPECT_EQ(two.payload, "two") << "a message no consumer took stays with the caller";
  ASSERT_EQ(rx.recv()->payload, "zero");
  Counted big{3, std::string(4096, 'x')};
  if (GetParam() != Transport::InProcess) {  // an InProcess queue moves values: no body, no limit
    EXPECT_THROW(pool.send(std::move(big)), Error);
    EXPECT_EQ(big.payload.size(), 4096u) << "a message the channel refused stays with the caller";
    EXPECT_EQ(pool.size(), 1u) << "a refused message is no reason to drop the consumer";
  }
  EXPECT_TRUE(pool.send_for(std::move(two), 1s));

  rx.close();
  std::vector<Counted> back = pool.take_undelivered();
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].id, 1u);
  EXPECT_EQ(back[0].payload, "one");
  EXPECT_EQ(back[1].id, 2u);
  EXPECT_EQ(back[1].payload, "two") << "an rvalue sent is handed back as it was";
}

// An rvalue that a closed consumer refused (ChannelClosed) goes back into the send, which
// offers it to the next consumer: it arrives there intact, still not copied. (A ring may
// accept a send for a short while after its reader closed: then the message comes back
// from take_undelivered() instead.)
TEST_P(FanoutTest, DistributorOffersAnRvalueARemovedConsumerRefusedToTheNextOneIntact) {
  const int queue_copies = GetParam() == Transport::InProcess ? 2 : 0;  // an InProcess queue's, per try
  FanoutOptions options;
  options.max_in_flight = 2;                                // counts read at every send
  options.work_ahead = {};                                  // a fixed bound (no pace)
  options.liveness_check_interval = std::chrono::hours(1);  // only the send finds the closed one
  Distributor<Counted> pool(options);
  auto [first_tx, first_rx] = channel<Counted>(GetParam());
  auto [tx, rx] = channel<Counted>(GetParam());
  pool.add(std::move(first_tx));
  pool.add(std::move(tx));
  pool.send(Counted{0, "zero"});  // to the first
  pool.send(Counted{1, "one"});   // to the second
  ASSERT_EQ(first_rx.recv()->id, 0u);
  first_rx.close();  // the first now has the fewest in flight: the next send picks it
  Counted::copies = 0;
  pool.send(Counted{2, std::string(100, 'f')});
  EXPECT_EQ(Counted::copies, queue_copies);
  std::vector<Counted> got = pool.take_undelivered();
  ASSERT_EQ(rx.recv()->id, 1u);
  if (got.empty()) {
    RecvResult<Counted> next = rx.recv_for(1s);
    ASSERT_TRUE(next.has_value()) << "the second consumer did not get the message the first refused";
    got.push_back(std::move(next).value());
  }
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].id, 2u);
  EXPECT_EQ(got[0].payload, std::string(100, 'f'));
  EXPECT_FALSE(rx.try_recv().has_value()) << "delivered once";
}

// A consumer that closed while others keep room is never picked again; the sends' periodic
// liveness check (one send in eight looks at the clock) still removes it within eight sends
// once the interval has passed, and its messages come back.
TEST_P(FanoutTest, DistributorRemovesAClosedConsumerThatIsNeverPickedWithinEightSends) {
  FanoutOptions options;
  options.max_in_flight = 16;
  options.work_ahead = {};  // a fixed bound (no pace)
  options.liveness_check_interval = 1ms;
  Distributor<std::uint64_t> pool(options);
  auto [kept_tx, kept_rx] = channel<std::uint64_t>(GetParam());
  auto [closed_tx, closed_rx] = channel<std::uint64_t>(GetParam());
  pool.add(std::move(kept_tx));
  pool.add(std::move(closed_tx));
  for (std::uint64_t id = 0; id < 4; ++id) pool.send(id);  // two to each
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(kept_rx.recv().has_value());
  closed_rx.close();  // two in flight there, none here: the sends below all come here
  std::this_thread::sleep_for(5ms);
  std::uint64_t id = 4;
  for (unsigned send = 0; send < detail::LivenessSchedule::kCallStride && pool.size() == 2; ++send, ++id) {
    pool.send(id);
    ASSERT_EQ(kept_rx.recv().value(), id);
  }
  EXPECT_EQ(pool.size(), 1u) << "the closed consumer was not removed within eight sends";
  std::vector<std::uint64_t> back = pool.take_undelivered();
  std::sort(back.begin(), back.end());
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0] % 2, 1u);  // the second consumer's: 1 and 3
  EXPECT_EQ(back[1], back[0] + 2);
}

TEST_P(FanoutTest, DistributorWithoutConsumersRefusesToSend) {
  Distributor<std::uint64_t> pool;
  EXPECT_THROW(pool.send(1), ChannelClosed);
  Ends ends = add_consumers(pool, 1);
  ends.receivers[0].close();
  // The send to the closed consumer fails (or the consumer is found gone) and nobody is left.
  EXPECT_THROW(
      {
        pool.send(1);
        pool.send(2);
      },
      ChannelClosed);
  EXPECT_EQ(pool.size(), 0u);
  auto [closed_tx, closed_rx] = channel<std::uint64_t>(GetParam());
  closed_tx.close();
  EXPECT_THROW(pool.add(std::move(closed_tx)), ChannelClosed);
}

TEST_P(FanoutTest, BroadcastSendsEveryMessageToEveryConsumer) {
  FanoutOptions options;
  options.max_in_flight = 3;
  Broadcast<std::uint64_t> all(options);
  Ends ends = add_consumers(all, 3);
  for (std::uint64_t id = 0; id < 3; ++id) EXPECT_EQ(all.send(id), 3u);
  for (auto& rx : ends.receivers) {
    for (std::uint64_t id = 0; id < 3; ++id) EXPECT_EQ(rx.recv().value(), id);
  }
  for (const ConsumerStats& entry : all.stats()) {
    EXPECT_EQ(entry.sent, 3u);
    EXPECT_EQ(entry.delivered, 3u);
    EXPECT_EQ(entry.in_flight, 0u);
  }
}

TEST_P(FanoutTest, BroadcastSkipsAFullConsumerAfterItsTimeoutAndDropsAClosedOne) {
  FanoutOptions options;
  options.max_in_flight = 2;
  options.liveness_check_interval = 1ms;
  Broadcast<std::uint64_t> all(options);
  Ends ends = add_consumers(all, 3);
  for (std::uint64_t id = 0; id < 2; ++id) EXPECT_EQ(all.send(id), 3u);
  // Consumers 1 and 2 read, consumer 0 does not: it misses message 2.
  for (int c = 1; c < 3; ++c) {
    for (std::uint64_t id = 0; id < 2; ++id) EXPECT_EQ(ends.receivers[c].recv().value(), id);
  }
  EXPECT_EQ(all.send_for(2, 20ms), 2u);
  const auto stats = all.stats();
  EXPECT_EQ(stats[0].skipped, 1u);
  EXPECT_EQ(stats[0].in_flight, 2u);
  EXPECT_EQ(stats[1].skipped, 0u);
  // Consumer 2 leaves; the broadcast goes on to the rest. (A ring accepts a few sends after
  // its reader closed; the next liveness check, due after the sleep, finds it gone.)
  ends.receivers[2].close();
  std::this_thread::sleep_for(options.liveness_check_interval * 2);
  EXPECT_EQ(ends.receivers[0].recv().value(), 0u);
  EXPECT_EQ(all.send(3), 2u);
  EXPECT_EQ(all.size(), 2u);
  EXPECT_EQ(ends.receivers[0].recv().value(), 1u);
  EXPECT_EQ(ends.receivers[0].recv().value(), 3u);
  EXPECT_EQ(ends.receivers[1].recv().value(), 2u);
  EXPECT_EQ(ends.receivers[1].recv().value(), 3u);
}

TEST_P(FanoutTest, ConsumersJoinWhileASendWaits) {
  FanoutOptions options;
  options.max_in_flight = 1;
  options.work_ahead = {};  // a fixed bound (no pace)
  Distributor<std::uint64_t> pool(options);
  Ends first = add_consumers(pool, 1);
  pool.send(0);
  auto [tx, rx] = channel<std::uint64_t>(GetParam());
  std::thread joiner([&pool, &tx = tx] {
    std::this_thread::sleep_for(10ms);
    pool.add(std::move(tx));
  });
  pool.send(1);  // the only consumer is full: waits for the one that joins
  joiner.join();
  EXPECT_EQ(rx.recv().value(), 1u);
  EXPECT_EQ(first.receivers[0].recv().value(), 0u);
}

// A send that waits for room sleeps until a consumer's recv() wakes it (the board's
// doorbell), not until the next liveness check: with checks an hour apart, both waits below
// end as soon as the consumer reads. The first is woken when half the bound was taken; the
// second, by a consumer that takes one message of eight and stops, uses that room after a
// short wait instead of waiting for the half.
TEST_P(FanoutTest, AWaitingSendWakesWhenAConsumerReads) {
  using Clock = std::chrono::steady_clock;
  for (const std::size_t bound : {std::size_t{2}, std::size_t{8}}) {
    SCOPED_TRACE(bound);
    FanoutOptions options;
    options.max_in_flight = bound;
    options.work_ahead = {};  // a fixed bound (no pace)
    options.liveness_check_interval = std::chrono::hours(1);
    Distributor<std::uint64_t> pool(options);
    Ends ends = add_consumers(pool, 1);
    for (std::uint64_t id = 0; id < bound; ++id) pool.send(id);
    std::thread reader([&rx = ends.receivers[0]] {
      std::this_thread::sleep_for(20ms);
      EXPECT_EQ(rx.recv().value(), 0u);
    });
    const auto before = Clock::now();
    EXPECT_TRUE(pool.send_for(bound, 60s));
    EXPECT_LT(Clock::now() - before, 30s) << "the send slept until its deadline, not until the consumer read";
    reader.join();
    EXPECT_EQ(in_flight(pool, ends.ids[0]), bound);
  }
}

// Reads each receiver in a thread of its own until the end of its stream (a sender's close()
// over a pipe or ring waits for its receiver to take the return board the first message
// carried). `start` is awaited first; returns the ids each received.
class Readers {
 public:
  Readers(std::vector<Receiver<std::uint64_t>>& receivers, const std::atomic<bool>& start) : got_(receivers.size()) {
    for (std::size_t i = 0; i < receivers.size(); ++i) {
      threads_.emplace_back([this, i, &rx = receivers[i], &start] {
        while (!start) std::this_thread::sleep_for(1ms);
        while (auto id = rx.recv()) got_[i].push_back(*id);
        ended_again_ += rx.recv().has_value() ? 0 : 1;
      });
    }
  }
  std::vector<Ids> join() {
    for (auto& thread : threads_) thread.join();
    EXPECT_EQ(ended_again_, threads_.size()) << "a stream did not stay ended";
    return got_;
  }

 private:
  std::vector<Ids> got_;
  std::atomic<std::size_t> ended_again_{0};
  std::vector<std::thread> threads_;
};

// close() from a producer thread that does not own the fan-out: each consumer receives what
// it was sent, then end of stream; later sends and add() throw ChannelClosed.
template <class Fanout>
void expect_close_ends_every_stream(Fanout& fanout, std::vector<Receiver<std::uint64_t>>& receivers,
                                    Transport transport) {
  constexpr std::uint64_t kMessages = 6;
  const std::atomic<bool> now{true};
  Readers readers(receivers, now);
  std::thread producer([&fanout] {
    for (std::uint64_t id = 0; id < kMessages; ++id) fanout.send(id);
    fanout.close();
  });
  producer.join();
  const std::vector<Ids> got = readers.join();
  if constexpr (std::is_same_v<Fanout, Broadcast<std::uint64_t>>) {
    for (const Ids& ids : got) EXPECT_EQ(ids, (Ids{0, 1, 2, 3, 4, 5}));
  } else {
    EXPECT_TRUE(each_once(got, {}, kMessages));
  }
  EXPECT_THROW(fanout.send(kMessages), ChannelClosed);
  EXPECT_EQ(fanout.size(), 0u);
  auto [late_tx, late_rx] = channel<std::uint64_t>(transport);
  EXPECT_THROW(fanout.add(std::move(late_tx)), ChannelClosed);
  EXPECT_FALSE(late_rx.recv().has_value()) << "a consumer refused after close() keeps an open stream";
  EXPECT_NO_THROW(fanout.close()) << "close() is idempotent";
}

TEST_P(FanoutTest, DistributorCloseFromAnotherThreadEndsEveryConsumersStreamAfterItsMessages) {
  Distributor<std::uint64_t> pool;
  Ends ends = add_consumers(pool, 3);
  expect_close_ends_every_stream(pool, ends.receivers, GetParam());
}

TEST_P(FanoutTest, BroadcastCloseFromAnotherThreadEndsEveryConsumersStreamAfterItsMessages) {
  Broadcast<std::uint64_t> all;
  Ends ends = add_consumers(all, 3);
  expect_close_ends_every_stream(all, ends.receivers, GetParam());
}

// A send asleep because every consumer is full throws ChannelClosed when another thread
// closes the fan-out, at once (liveness checks an hour apart cannot be what wakes it), and
// the consumers, which read only once that send returned, receive what they were sent.
template <class Fanout>
void expect_close_ends_a_blocked_send(Fanout& fanout, std::vector<Receiver<std::uint64_t>>& receivers) {
  using Clock = std::chrono::steady_clock;
  fanout.send(0);  // bound 1: every consumer is full
  if constexpr (std::is_same_v<Fanout, Distributor<std::uint64_t>>) {
    for (std::uint64_t id = 1; id < receivers.size(); ++id) fanout.send(id);
  }
  std::atomic<bool> returned{false};
  Readers readers(receivers, returned);
  bool threw = false;
  Clock::time_point returned_at;
  std::thread sender([&] {
    try {
      fanout.send(99);
    } catch (const ChannelClosed&) {
      threw = true;
    }
    returned_at = Clock::now();
    returned = true;
  });
  std::this_thread::sleep_for(50ms);  // the send is asleep by now
  const auto closed_at = Clock::now();
  fanout.close();
  sender.join();
  EXPECT_TRUE(threw) << "a send blocked when close() came did not throw ChannelClosed";
  EXPECT_LT(returned_at - closed_at, 5s) << "the blocked send was not woken by close()";
  const std::vector<Ids> got = readers.join();
  std::uint64_t received = 0;
  for (const Ids& ids : got) {
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 99u), 0);
    received += ids.size();
  }
  EXPECT_EQ(received, receivers.size());
}

TEST_P(FanoutTest, DistributorCloseEndsASendBlockedOnFullConsumers) {
  FanoutOptions options;
  options.max_in_flight = 1;
  options.liveness_check_interval = std::chrono::hours(1);
  Distributor<std::uint64_t> pool(options);
  Ends ends = add_consumers(pool, 2);
  expect_close_ends_a_blocked_send(pool, ends.receivers);
}

TEST_P(FanoutTest, BroadcastCloseEndsASendBlockedOnFullConsumers) {
  FanoutOptions options;
  options.max_in_flight = 1;
  options.liveness_check_interval = std::chrono::hours(1);
  Broadcast<std::uint64_t> all(options);
  Ends ends = add_consumers(all, 2);
  expect_close_ends_a_blocked_send(all, ends.receivers);
}

// ---- consumers in threads (InProcess) ------------------------------------------------------

// Takes jobs until the end of the stream, `work` each; returns what it took.
Ids take_jobs(Receiver<std::uint64_t>& jobs, std::chrono::microseconds work) {
  Ids got;
  while (auto job = jobs.recv()) {
    got.push_back(*job);
    if (work.count() > 0) std::this_thread::sleep_for(work);
  }
  return got;
}

TEST(FanoutThreadsTest, UnevenWorkersInThreadsShareTheWorkOnce) {
  constexpr int kWorkers = 8;
  // Jobs of 1 ms (10 ms for the slow one): the producer, far faster, keeps every worker at
  // its bound, so the share of each is its speed's (a producer slower than the workers
  // would find them all empty and go round in turn).
  constexpr std::uint64_t kJobs = 400;
  std::vector<Ids> reports(kWorkers);
  std::vector<std::thread> threads;
  {
    FanoutOptions options;
    options.max_in_flight = 2;
    Distributor<std::uint64_t> pool(options);
    for (int w = 0; w < kWorkers; ++w) {
      auto [tx, rx] = channel<std::uint64_t>(Transport::InProcess);
      pool.add(std::move(tx));
      threads.emplace_back(
          [&reports, w, rx = std::move(rx)]() mutable { reports[w] = take_jobs(rx, w == kWorkers - 1 ? 10ms : 1ms); });
    }
    for (std::uint64_t id = 0; id < kJobs; ++id) pool.send(id);
  }  // closes every consumer's end
  for (auto& thread : threads) thread.join();
  EXPECT_TRUE(each_once(reports, {}, kJobs));
  std::size_t fast = 0;
  for (int w = 0; w < kWorkers - 1; ++w) fast += reports[w].size();
  EXPECT_LT(reports[kWorkers - 1].size() * 2, fast / (kWorkers - 1)) << "the slow worker took as much as a fast one";
}

// ---- consumers in worker processes ----------------------------------------------------------

class FanoutProcessTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {
 protected:
  void TearDown() override {
    EXPECT_TRUE(test::has_no_children()) << "a worker process (or zombie) was left behind";
    LeakCheckedTest::TearDown();
  }
};

INSTANTIATE_TEST_SUITE_P(Transports, FanoutProcessTest, ::testing::ValuesIn(test::interprocess_transports()),
                         test::transport_test_name);

// A pool worker: takes jobs until the end of the stream, `work_us` each, then reports them.
void pool_worker(WorkerContext&, Receiver<std::uint64_t> jobs, Sender<Ids> report, int work_us) {
  report.send(take_jobs(jobs, std::chrono::microseconds(work_us)));
}

TEST_P(FanoutProcessTest, UnevenWorkersShareTheWorkAndNothingIsDeliveredTwice) {
  constexpr int kWorkers = 8;
  // Jobs of 1 ms (10 ms for the slow one): the producer, far faster, keeps every worker at
  // its bound, so the share of each is its speed's (a producer slower than the workers
  // would find them all empty and go round in turn).
  constexpr std::uint64_t kJobs = 400;
  std::vector<Sender<std::uint64_t>> job_ends;
  std::vector<Receiver<std::uint64_t>> worker_jobs;
  std::vector<Sender<Ids>> worker_reports;
  std::vector<Receiver<Ids>> reports;
  std::vector<int> work_us;
  for (int w = 0; w < kWorkers; ++w) {
    auto [tx, rx] = channel<std::uint64_t>(GetParam());
    job_ends.push_back(std::move(tx));
    worker_jobs.push_back(std::move(rx));
    auto [report_tx, report_rx] = channel<Ids>(Transport::Pipe);
    worker_reports.push_back(std::move(report_tx));
    reports.push_back(std::move(report_rx));
    work_us.push_back(w == kWorkers - 1 ? 10'000 : 1'000);  // one worker ten times slower
  }
  WorkerGroup workers = spawn(forked(), kWorkers, pool_worker, per_rank(std::move(worker_jobs)),
                              per_rank(std::move(worker_reports)), per_rank(std::move(work_us)));
  {
    FanoutOptions options;
    options.max_in_flight = 2;
    Distributor<std::uint64_t> pool(options);
    for (auto& end : job_ends) pool.add(std::move(end));
    for (std::uint64_t id = 0; id < kJobs; ++id) pool.send(id);
    std::uint64_t sent = 0;
    for (const ConsumerStats& entry : pool.stats()) {
      sent += entry.sent;
      EXPECT_LE(entry.in_flight, 2u);
      EXPECT_EQ(entry.delivered + entry.in_flight, entry.sent);
    }
    EXPECT_EQ(sent, kJobs);
  }
  std::vector<Ids> received;
  for (auto& report : reports) received.push_back(report.recv().value());
  workers.join();
  EXPECT_TRUE(each_once(received, {}, kJobs));
  std::size_t fast = 0;
  for (int w = 0; w < kWorkers - 1; ++w) fast += received[w].size();
  EXPECT_LT(received[kWorkers - 1].size() * 2, fast / (kWorkers - 1)) << "the slow worker took as much as a fast one";
}

// Workers in other processes end when a producer thread that does not own the Distributor
// closes it: each reports what it took (every job once), and the Distributor outlives them.
TEST_P(FanoutProcessTest, WorkersEndWhenAProducerThreadClosesTheDistributor) {
  constexpr int kWorkers = 3;
  constexpr std::uint64_t kJobs = 60;
  std::vector<Receiver<std::uint64_t>> worker_jobs;
  std::vector<Sender<Ids>> worker_reports;
  std::vector<Receiver<Ids>> reports;
  Distributor<std::uint64_t> pool;
  for (int w = 0; w < kWorkers; ++w) {
    auto [tx, rx] = channel<std::uint64_t>(GetParam());
    pool.add(std::move(tx));
    worker_jobs.push_back(std::move(rx));
    auto [report_tx, report_rx] = channel<Ids>(Transport::Pipe);
    worker_reports.push_back(std::move(report_tx));
    reports.push_back(std::move(report_rx));
  }
  WorkerGroup workers = spawn(forked(), kWorkers, pool_worker, per_rank(std::move(worker_jobs)),
                              per_rank(std::move(worker_reports)), 100);
  std::thread producer([&pool] {
    for (std::uint64_t id = 0; id < kJobs; ++id) pool.send(id);
    pool.close();
  });
  producer.join();
  std::vector<Ids> received;
  for (auto& report : reports) received.push_back(report.recv().value());
  workers.join();
  EXPECT_TRUE(each_once(received, {}, kJobs));
  EXPECT_THROW(pool.send(kJobs), ChannelClosed);
}

// A pool worker that also reports how long its work took (microseconds, as measured).
void timed_pool_worker(WorkerContext&, Receiver<std::uint64_t> jobs, Sender<Ids> report, Sender<std::uint64_t> busy_us,
                       int work_us) {
  Ids got;
  std::chrono::steady_clock::duration busy{};
  while (auto job = jobs.recv()) {
    got.push_back(*job);
    const auto start = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::microseconds(work_us));
    busy += std::chrono::steady_clock::now() - start;
  }
  report.send(got);
  busy_us.send(static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(busy).count()));
}

// With default FanoutOptions, four workers, one ten times slower (5 ms a job against
// 0.5 ms), share a burst of 400 jobs by speed: the slow one gets at most 1.5 times its share
// by the speeds the workers measured (about 13 jobs), not a quarter of them, as "fewest in
// flight" with 128 places each gave.
TEST_P(FanoutProcessTest, ADefaultDistributorSharesABurstAmongUnevenWorkersBySpeed) {
  constexpr int kWorkers = 4;
  constexpr std::uint64_t kJobs = 400;
  std::vector<Receiver<std::uint64_t>> worker_jobs;
  std::vector<Sender<Ids>> worker_reports;
  std::vector<Receiver<Ids>> reports;
  std::vector<Sender<std::uint64_t>> worker_busy;
  std::vector<Receiver<std::uint64_t>> busy;
  std::vector<int> work_us;
  Distributor<std::uint64_t> pool;  // the defaults
  for (int w = 0; w < kWorkers; ++w) {
    auto [tx, rx] = channel<std::uint64_t>(GetParam());
    pool.add(std::move(tx));
    worker_jobs.push_back(std::move(rx));
    auto [report_tx, report_rx] = channel<Ids>(Transport::Pipe);
    worker_reports.push_back(std::move(report_tx));
    reports.push_back(std::move(report_rx));
    auto [busy_tx, busy_rx] = channel<std::uint64_t>(Transport::Pipe);
    worker_busy.push_back(std::move(busy_tx));
    busy.push_back(std::move(busy_rx));
    work_us.push_back(w == 0 ? 5'000 : 500);  // the first is ten times slower
  }
  WorkerGroup workers =
      spawn(forked(), kWorkers, timed_pool_worker, per_rank(std::move(worker_jobs)),
            per_rank(std::move(worker_reports)), per_rank(std::move(worker_busy)), per_rank(std::move(work_us)));
  for (std::uint64_t id = 0; id < kJobs; ++id) pool.send(id);
  const auto stats = pool.stats();
  pool.close();
  std::vector<Ids> received;
  double speed_sum = 0;
  double slow_speed = 0;
  for (int w = 0; w < kWorkers; ++w) {
    received.push_back(reports[w].recv().value());
    const double speed = static_cast<double>(received[w].size()) /
                         static_cast<double>(std::max<std::uint64_t>(1, busy[w].recv().value()));
    speed_sum += speed;
    if (w == 0) slow_speed = speed;
  }
  workers.join();
  EXPECT_TRUE(each_once(received, {}, kJobs));
  const double share = static_cast<double>(kJobs) * slow_speed / speed_sum;
  EXPECT_LE(static_cast<double>(received[0].size()), 1.5 * share)
      << "the slow worker took " << received[0].size() << " of " << kJobs << " jobs; its share by speed is " << share;
  EXPECT_LT(stats[0].window, stats[1].window) << "the slow worker's window is not below a fast one's";
}

// Consumers that do not read yet (the producer's own thread reads them after sending) do not
// hold a default Distributor's sends up for ever: a window that stays full with nothing
// delivered gets the consumer's bound back.
TEST_P(FanoutTest, ADefaultDistributorSendsToConsumersThatReadOnlyLater) {
  constexpr std::uint64_t kMessages = 40;
  Distributor<std::uint64_t> pool;
  Ends ends = add_consumers(pool, 2);
  for (std::uint64_t id = 0; id < kMessages; ++id) pool.send(id);
  std::vector<Ids> got(2);
  for (std::size_t c = 0; c < 2; ++c) {
    const std::size_t sent = pool.stats()[c].sent;
    for (std::size_t i = 0; i < sent; ++i) got[c].push_back(ends.receivers[c].recv().value());
  }
  EXPECT_TRUE(each_once(got, {}, kMessages));
}

// Reads one message late (after its sender closed), then the end of the stream.
void late_reader(WorkerContext&, Receiver<std::uint64_t> in) {
  std::this_thread::sleep_for(100ms);
  CHILD_CHECK(in.recv().value() == 42);
  CHILD_CHECK(!in.recv().has_value());
}

TEST_P(FanoutProcessTest, AClosedFanoutKeepsItsBoardUntilAConsumerThatReadsLateHasIt) {
  // The first tracked message carries the return board even without tensors; over a pipe
  // or a ring the receiver opens it by /proc path, so the sender's close must keep it open
  // until then (it waits for the acknowledgement).
  auto [tx, rx] = channel<std::uint64_t>(GetParam());
  WorkerGroup worker = spawn(forked(), 1, late_reader, std::move(rx));
  {
    Distributor<std::uint64_t> pool;
    pool.add(std::move(tx));
    pool.send(42);
  }  // closes the end before the worker reads
  EXPECT_NO_THROW(worker.join());
}

// Takes `count` jobs, reporting each as soon as it has it, then stops reading (it waits to
// be killed).
void stalling_worker(WorkerContext&, Receiver<std::uint64_t> jobs, Sender<std::uint64_t> taken, int count) {
  for (int i = 0; i < count; ++i) taken.send(jobs.recv().value());
  while (true) ::pause();
}

TEST_P(FanoutProcessTest, AWorkerKilledMidRunLosesNothingAndDuplicatesNothing) {
  constexpr int kWorkers = 4;  // the last one is killed
  constexpr std::uint64_t kJobs = 400;
  constexpr std::size_t kBound = 3;
  constexpr int kTakenByVictim = 5;
  FanoutOptions options;
  options.max_in_flight = kBound;
  options.liveness_check_interval = 2ms;
  std::optional<Distributor<std::uint64_t>> pool(std::in_place, options);
  std::vector<WorkerGroup> groups;
  std::vector<Receiver<Ids>> reports;
  for (int w = 0; w < kWorkers - 1; ++w) {
    auto [tx, rx] = channel<std::uint64_t>(GetParam());
    auto [report_tx, report_rx] = channel<Ids>(Transport::Pipe);
    groups.push_back(spawn(forked(), 1, pool_worker, std::move(rx), std::move(report_tx), 50));
    pool->add(std::move(tx));
    reports.push_back(std::move(report_rx));
  }
  auto [victim_tx, victim_rx] = channel<std::uint64_t>(GetParam());
  auto [taken_tx, taken_rx] = channel<std::uint64_t>(Transport::Pipe);
  WorkerGroup victim = spawn(forked(), 1, stalling_worker, std::move(victim_rx), std::move(taken_tx), kTakenByVictim);
  const ConsumerId victim_id = pool->add(std::move(victim_tx));

  // The victim is killed once it has stopped reading with its whole bound in flight (so
  // that the pool sends it nothing more before it notices the death). On a busy machine
  // that may take more than kJobs sends: the producer goes on sending until the kill.
  Ids victim_took;
  std::size_t in_flight_at_kill = 0;
  std::uint64_t sent = 0;
  for (; sent < kJobs || (in_flight_at_kill == 0 && sent < 100 * kJobs); ++sent) {
    pool->send(sent);
    if (in_flight_at_kill > 0) continue;
    while (victim_took.size() < kTakenByVictim) {
      auto taken = taken_rx.try_recv();
      if (!taken) break;
      victim_took.push_back(*taken);
    }
    if (victim_took.size() == kTakenByVictim) {
      const auto stats = pool->stats();
      const auto it = std::find_if(stats.begin(), stats.end(), [&](const auto& s) { return s.id == victim_id; });
      ASSERT_NE(it, stats.end());
      if (it->in_flight == kBound) {  // it stalled with a full bound in flight: kill it now
        ASSERT_EQ(::kill(victim.pid(0), SIGKILL), 0);
        in_flight_at_kill = it->in_flight;
      }
    }
  }
  ASSERT_EQ(in_flight_at_kill, kBound) << "the victim never stalled with its bound in flight";
  EXPECT_THROW(victim.join(), WorkerFailed);
  const Ids handed_back = pool->take_undelivered();
  EXPECT_EQ(handed_back.size(), in_flight_at_kill) << "what the dead worker had in flight comes back";
  EXPECT_EQ(pool->size(), static_cast<std::size_t>(kWorkers - 1));
  // Closing the pool ends the others' streams; they report what they received.
  std::vector<Ids> received{victim_took};
  pool.reset();
  for (auto& report : reports) received.push_back(report.recv().value());
  for (auto& group : groups) group.join();
  EXPECT_TRUE(each_once(received, handed_back, sent));
}

// Takes `count` jobs, 200 us each, then closes its end (leaves, with messages in flight)
// and reports what it took.
void leaving_worker(WorkerContext&, Receiver<std::uint64_t> jobs, Sender<Ids> report, int count) {
  Ids got;
  for (int i = 0; i < count; ++i) {
    const std::optional<std::uint64_t> job = jobs.recv();
    if (!job) break;  // (the producer's assertion on the pool's size then fails)
    got.push_back(*job);
    std::this_thread::sleep_for(200us);
  }
  jobs.close();
  report.send(got);
}

TEST_P(FanoutProcessTest, ConsumersJoinAndLeaveWhileTheProducerSends) {
  constexpr std::uint64_t kJobs = 600;
  FanoutOptions options;
  options.max_in_flight = 4;
  options.liveness_check_interval = 2ms;
  std::vector<WorkerGroup> groups;
  std::vector<Receiver<Ids>> reports;
  std::vector<Ids> received;
  Ids handed_back_total;
  std::uint64_t next = 0;  // the next job's id: how many were sent
  {
    Distributor<std::uint64_t> pool(options);
    auto start = [&](bool leaves) {
      auto [tx, rx] = channel<std::uint64_t>(GetParam());
      auto [report_tx, report_rx] = channel<Ids>(Transport::Pipe);
      if (leaves) {
        groups.push_back(spawn(forked(), 1, leaving_worker, std::move(rx), std::move(report_tx), 10));
      } else {
        groups.push_back(spawn(forked(), 1, pool_worker, std::move(rx), std::move(report_tx), 20));
      }
      pool.add(std::move(tx));
      reports.push_back(std::move(report_rx));
    };
    start(false);
    start(true);
    auto send_some = [&](std::uint64_t count, std::uint64_t up_to) {
      for (std::uint64_t i = 0; i < count && next < up_to; ++i) pool.send(next++);
      for (const std::uint64_t id : pool.take_undelivered()) {
        handed_back_total.push_back(id);
        pool.send(id);  // handed back: sent again, to a consumer that is still there
      }
    };
    send_some(150, kJobs);
    start(true);  // joins, then leaves after 10
    start(false);
    send_some(200, kJobs);
    start(false);
    send_some(kJobs, kJobs);
    // A leaver leaves only after its tenth job; on a loaded machine the balancing may have
    // given it fewer of the first kJobs, so keep feeding the pool until both have left.
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (pool.size() > 3 && std::chrono::steady_clock::now() < deadline) {
      send_some(1, next + 1);
      std::this_thread::sleep_for(1ms);
    }
    EXPECT_EQ(pool.size(), 3u) << "the two leavers are removed";
    send_some(0, kJobs);
  }
  for (auto& report : reports) received.push_back(report.recv().value());
  for (auto& group : groups) group.join();
  EXPECT_TRUE(each_once(received, {}, next)) << handed_back_total.size() << " were handed back and sent again";
  EXPECT_FALSE(handed_back_total.empty()) << "the leavers left with nothing in flight";
}

// ---- consumers that connected to a listener ---------------------------------------------

class FanoutEndpointTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {};

INSTANTIATE_TEST_SUITE_P(Transports, FanoutEndpointTest, ::testing::Values(Transport::UnixSocket, Transport::ShmRing),
                         test::transport_test_name);

TEST_P(FanoutEndpointTest, DistributorSharesWorkAmongUnrelatedProcessesThatConnected) {
  constexpr int kClients = 3;
  constexpr std::uint64_t kJobs = 300;
  const std::string address = "unix:@ferry-fanout-test-" + std::to_string(::getpid());
  EndpointOptions options;
  options.transport = GetParam();
  options.on_refusal = [](const std::string&) {};
  std::vector<std::unique_ptr<test::UnrelatedProcess>> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.push_back(std::make_unique<test::UnrelatedProcess>([&] {
      auto jobs = connect_receiver<std::uint64_t>(address, options);  // waits for the listener
      const Ids got = take_jobs(jobs, 20us);
      auto report = connect_sender<Ids>(address, options);
      report.send(got);
      report.close();
    }));
  }
  Listener listener = listen(address, options);
  listener.serve_sender<std::uint64_t>();
  listener.serve_receiver<Ids>();
  {
    FanoutOptions fanout;
    fanout.max_in_flight = 4;
    Distributor<std::uint64_t> pool(fanout);
    for (int c = 0; c < kClients; ++c) pool.add(listener.accept_sender<std::uint64_t>());
    for (std::uint64_t id = 0; id < kJobs; ++id) pool.send(id);
    for (const ConsumerStats& entry : pool.stats()) EXPECT_GT(entry.sent, 0u) << "a client got no work";
  }  // ends every client's stream
  std::vector<Ids> received;
  for (int c = 0; c < kClients; ++c) received.push_back(listener.accept_receiver<Ids>().recv().value());
  for (auto& client : clients) EXPECT_TRUE(client->succeeded());
  EXPECT_TRUE(each_once(received, {}, kJobs));
}

// ---- broadcast of one storage ---------------------------------------------------------------

struct Weights {
  std::int64_t version = 0;
  Tensor data;
  template <class Archive>
  void serialize(Archive& archive) {
    archive(version, data);
  }
};

// Where a consumer's tensor lives: the segment's file and the block's offset in it.
struct Placement {
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  std::uint64_t offset = 0;
  bool contents_ok = false;
  template <class Archive>
  void serialize(Archive& archive) {
    archive(device, inode, offset, contents_ok);
  }
};

constexpr std::int64_t kBroadcastBytes = std::int64_t{64} << 20;
constexpr std::int64_t kStampEvery = 1 << 20;

Placement placement_of(const Tensor& tensor) {
  const SharedBlock* block = tensor.storage()->shared_block();
  if (!block) return {};
  const detail::FileIdentity file = block->segment()->identity();
  return Placement{file.device, file.inode, block->offset(), false};
}

bool stamped(const Tensor& tensor) {
  if (tensor.numel() != kBroadcastBytes) return false;
  const auto* bytes = static_cast<const std::uint8_t*>(tensor.data_ptr());
  for (std::int64_t at = 0; at < kBroadcastBytes; at += kStampEvery) {
    if (bytes[at] != static_cast<std::uint8_t>(at / kStampEvery + 1)) return false;
  }
  return bytes[kBroadcastBytes - 1] == 0xee;
}

// Receives the weights, reports where they live, holds them until told to let go, then
// takes the next message (whose frame announces that the producer dropped the weights:
// the lease on the block ends there) and reports that it let go.
void weights_consumer(WorkerContext&, Receiver<Weights> in, Sender<Placement> report, Receiver<int> release) {
  std::optional<Weights> weights = in.recv();
  Placement seen = weights ? placement_of(weights->data) : Placement{};
  seen.contents_ok = weights && weights->version == 7 && stamped(weights->data);
  report.send(seen);
  (void)release.recv();
  weights.reset();
  const std::optional<Weights> next = in.recv();
  report.send(Placement{0, 0, 0, next && next->version == 8});
  (void)in.recv();  // the end of the stream
}

TEST_P(FanoutProcessTest, Broadcast64MiBReachesEightConsumersAsOneStorageRecycledAfterTheLast) {
  constexpr int kConsumers = 8;
  SharedAllocator pool;
  std::vector<Receiver<Weights>> worker_in;
  std::vector<Sender<Placement>> worker_report;
  std::vector<Receiver<int>> worker_release;
  std::vector<Receiver<Placement>> reports;
  std::vector<Sender<int>> releases;
  std::optional<Broadcast<Weights>> all(std::in_place);
  for (int c = 0; c < kConsumers; ++c) {
    auto [tx, rx] = channel<Weights>(GetParam());
    all->add(std::move(tx));
    worker_in.push_back(std::move(rx));
    auto [report_tx, report_rx] = channel<Placement>(Transport::Pipe);
    worker_report.push_back(std::move(report_tx));
    reports.push_back(std::move(report_rx));
    auto [release_tx, release_rx] = channel<int>(Transport::Pipe);
    releases.push_back(std::move(release_tx));
    worker_release.push_back(std::move(release_rx));
  }
  WorkerGroup workers = spawn(forked(), kConsumers, weights_consumer, per_rank(std::move(worker_in)),
                              per_rank(std::move(worker_report)), per_rank(std::move(worker_release)));
  Placement produced;
  {
    Tensor data = Tensor::empty({kBroadcastBytes}, DType::UInt8, pool);
    auto* bytes = static_cast<std::uint8_t*>(data.data_ptr());
    for (std::int64_t at = 0; at < kBroadcastBytes; at += kStampEvery) {
      bytes[at] = static_cast<std::uint8_t>(at / kStampEvery + 1);
    }
    bytes[kBroadcastBytes - 1] = 0xee;
    produced = placement_of(data);
    ASSERT_NE(produced.inode, 0u);
    EXPECT_EQ(all->send(Weights{7, data}), static_cast<std::size_t>(kConsumers));
  }  // the producer's own reference dies here
  for (auto& report : reports) {
    const Placement seen = report.recv().value();
    EXPECT_TRUE(seen.contents_ok);
    EXPECT_EQ(seen.device, produced.device);
    EXPECT_EQ(seen.inode, produced.inode) << "a consumer got a copy, not the producer's pages";
    EXPECT_EQ(seen.offset, produced.offset);
  }
  for (const ConsumerStats& entry : all->stats()) EXPECT_EQ(entry.delivered, 1u);
  EXPECT_EQ(pool.stats().blocks_in_use, 1u);
  // The next message (from another allocator) announces the release of the weights' slot.
  EXPECT_EQ(all->send(Weights{8, Tensor::zeros({16}, DType::UInt8)}), static_cast<std::size_t>(kConsumers));
  // Seven let go: the block stays in use, for the eighth.
  for (int c = 0; c < kConsumers - 1; ++c) {
    releases[c].send(1);
    EXPECT_TRUE(reports[c].recv().value().contents_ok);
  }
  pool.trim();
  EXPECT_EQ(pool.stats().blocks_in_use, 1u) << "the block was recycled while a consumer held it";
  releases[kConsumers - 1].send(1);
  EXPECT_TRUE(reports[kConsumers - 1].recv().value().contents_ok);
  for (int round = 0; round < 5000 && pool.stats().blocks_in_use != 0; ++round) {
    pool.trim();
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(pool.stats().blocks_in_use, 0u) << "the block did not come back after the last consumer let go";
  all.reset();  // ends the consumers' streams
  workers.join();
}

// The liveness schedule: due at the first call, then once per interval. 20 ms spans two
// ticks of the coarse clock wherever the kernel's tick is 10 ms or shorter, so due() reads
// that clock and may come one tick late; 1 ms does not, and reads the precise one.
TEST(LivenessScheduleTest, IsDueAtOnceAndThenOncePerIntervalOnEitherClock) {
  for (const auto interval : {20ms, 1ms}) {
    detail::LivenessSchedule schedule(interval);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_TRUE(schedule.due()) << interval.count() << " ms";
    const bool soon = std::chrono::steady_clock::now() - start < interval / 2;
    if (soon) {  // unless this thread was held up
      EXPECT_FALSE(schedule.due()) << interval.count() << " ms";
    }
    std::this_thread::sleep_for(interval + 12ms);  // one tick late at most
    EXPECT_TRUE(schedule.due()) << interval.count() << " ms";
    EXPECT_LE(schedule.next() - std::chrono::steady_clock::now(), interval) << interval.count() << " ms";
  }
}

}  // namespace
}  // namespace ferry::fanout_test
