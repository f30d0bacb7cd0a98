// The crash matrix: for every transport, SIGKILL the sender or the receiver at random
// points of a long stream of messages with tensors (new, repeated, heap, released, views),
// many times over. The survivor must report a closed channel (PeerDied / ChannelClosed,
// never a ProtocolError, a clean end of stream or a hang) within a bounded time, and the
// fds and /dev/shm entries of this process must return to their starting values after
// every round, once the caching shared-memory allocator gave its cached segments back (a
// cache is not a leak; trimming also reclaims what a killed receiver held).
//
// The third column does the same to a worker started by ferry::spawn, whose WorkerGroup must
// also report the death (WorkerFailed, naming SIGKILL).
//
// Seeded: set FERRY_CRASH_SEED to replay a run (the seed is printed). Bounded in time:
// each column runs rounds for kColumnBudget, whatever the build's speed.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/transports.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::count_dev_shm_entries;
using test::count_open_fds;
using test::fork_child;
using test::wait_child;

constexpr auto kColumnBudget = 1500ms;  // rounds per column stop starting after this
constexpr int kMaxRounds = 100;
constexpr auto kDetectionBound = 10s;  // generous: a dead peer is seen in well under 1 s

struct Item {
  std::int64_t sequence = 0;
  std::string note;
  Tensor main;
  std::vector<Tensor> views;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(sequence, note, main, views);
  }
};

std::uint64_t base_seed() {
  static const std::uint64_t seed = [] {
    if (const char* text = std::getenv("FERRY_CRASH_SEED"))
      return static_cast<std::uint64_t>(std::strtoull(text, nullptr, 10));
    return static_cast<std::uint64_t>(Clock::now().time_since_epoch().count());
  }();
  return seed;
}

// A stream as a real producer writes it: new shared tensors of random sizes, tensors sent
// again (leases), heap tensors (moved to shared memory when sent), views of earlier ones,
// and tensors dropped (their leases released in later frames).
class ItemSource {
 public:
  explicit ItemSource(std::uint64_t seed) : rng_(seed) {}

  Item next(std::int64_t sequence) {
    Item item;
    item.sequence = sequence;
    item.note = std::string(rng_() % 64, 'n');
    const std::int64_t elements = 1 + static_cast<std::int64_t>(rng_() % 16384);
    switch (rng_() % 4) {
      case 0: item.main = Tensor::zeros({elements}, DType::Float32, Device::SharedCpu); break;
      case 1: item.main = pool_.empty() ? Tensor() : pool_[rng_() % pool_.size()]; break;
      case 2: item.main = Tensor::zeros({elements}, DType::UInt8); break;
      default: break;
    }
    if (item.main.defined()) pool_.push_back(item.main);
    for (std::uint64_t v = rng_() % 3; v > 0 && !pool_.empty(); --v) {
      const Tensor& base = pool_[rng_() % pool_.size()];
      item.views.push_back(base.slice(0, 0, std::max<std::int64_t>(1, base.size(0) / 2)));
    }
    if (pool_.size() > 8) pool_.erase(pool_.begin() + static_cast<std::ptrdiff_t>(rng_() % pool_.size()));
    return item;
  }

 private:
  std::mt19937_64 rng_;
  std::vector<Tensor> pool_;
};

[[noreturn]] void produce_forever(Sender<Item>& tx, std::uint64_t seed) {
  ItemSource source(seed);
  for (std::int64_t i = 0;; ++i) tx.send(source.next(i));
}

// The worker of the spawned-worker column: sends every item back, keeps some of the
// tensors it received for a while (mapped when it dies), and now and then adds a tensor
// of its own. Registered, so that the spawn start method can run it too.
void echo_items(WorkerContext&, Receiver<Item> in, Sender<Item> out, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Tensor> held;
  while (auto item = in.recv()) {
    if (item->main.defined() && rng() % 4 == 0) held.push_back(item->main);
    if (held.size() > 16) held.erase(held.begin());
    if (rng() % 8 == 0) {
      item->views.push_back(
          Tensor::zeros({1 + static_cast<std::int64_t>(rng() % 4096)}, DType::Int32, Device::SharedCpu));
    }
    out.send(*item);
  }
}
FERRY_WORKER(echo_items);

class CrashMatrixTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {
 protected:
  // Runs `round` with a fresh seed until the column's time budget is spent; checks after
  // every round that fds and /dev/shm entries are back where they started.
  template <class Round>
  void run_column(const char* column, Round round) {
    const std::size_t fds = count_open_fds();
    const std::size_t shm = count_dev_shm_entries();
    const auto start = Clock::now();
    int rounds = 0;
    for (; rounds < kMaxRounds && Clock::now() - start < kColumnBudget; ++rounds) {
      const std::uint64_t seed = base_seed() + static_cast<std::uint64_t>(rounds);
      SCOPED_TRACE(std::string(column) + " round " + std::to_string(rounds) +
                   ", FERRY_CRASH_SEED=" + std::to_string(base_seed()));
      round(seed);
      release_cached_shared_memory();
      ASSERT_EQ(count_open_fds(), fds) << "fds leaked in round " << rounds << " (seed " << seed << ")";
      ASSERT_EQ(count_dev_shm_entries(), shm) << "/dev/shm entries leaked in round " << rounds;
      if (HasFatalFailure()) return;
    }
    std::fprintf(stderr, "%s over %s: %d rounds (FERRY_CRASH_SEED=%llu)\n", column,
                 std::string(transport_name(GetParam())).c_str(), rounds, static_cast<unsigned long long>(base_seed()));
    EXPECT_GE(rounds, 3) << "too few rounds to mean anything";
  }
};

INSTANTIATE_TEST_SUITE_P(Transports, CrashMatrixTest, ::testing::ValuesIn(test::interprocess_transports()),
                         test::transport_test_name);

TEST_P(CrashMatrixTest, SenderKilledAtRandomPoints) {
  run_column("sender killed", [&](std::uint64_t seed) {
    std::mt19937_64 rng(seed ^ 0x5eed);
    auto [tx, rx] = channel<Item>(GetParam());
    const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
      rx.close();
      tx.adopt();
      produce_forever(tx, seed);
    });
    tx.detach();
    const auto to_receive = static_cast<std::int64_t>(rng() % 300);
    std::int64_t received = 0;
    for (; received < to_receive; ++received) {
      auto item = rx.recv();
      ASSERT_TRUE(item.has_value());
      ASSERT_EQ(item->sequence, received) << "messages lost or reordered";
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    const auto killed = Clock::now();
    try {
      while (auto item = rx.recv()) {
        ASSERT_EQ(item->sequence, received++) << "messages lost or reordered";
      }
      ADD_FAILURE() << "a killed sender looked like a clean end of stream";
    } catch (const PeerDied&) {
      // What the survivor must see.
    } catch (const std::exception& error) {
      ADD_FAILURE() << "a killed sender must be PeerDied, not: " << error.what();
    }
    EXPECT_LT(Clock::now() - killed, kDetectionBound);
    EXPECT_THROW(rx.recv(), PeerDied) << "the receiver must stay dead";
    rx.close();
    EXPECT_EQ(wait_child(child).signal, SIGKILL);
  });
}

TEST_P(CrashMatrixTest, ReceiverKilledAtRandomPoints) {
  run_column("receiver killed", [&](std::uint64_t seed) {
    std::mt19937_64 rng(seed ^ 0xdead);
    auto [tx, rx] = channel<Item>(GetParam());
    const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
      tx.detach();
      std::mt19937_64 local(seed);
      std::vector<Item> held;  // a receiver that keeps some tensors mapped when it dies
      while (auto item = rx.recv()) {
        if (local() % 4 == 0) held.push_back(std::move(*item));
        if (held.size() > 16) held.erase(held.begin());
        if (local() % 64 == 0) std::this_thread::sleep_for(std::chrono::microseconds(local() % 500));
      }
    });
    rx.close();
    const auto before_kill = static_cast<std::int64_t>(rng() % 300);
    std::vector<Tensor> pool;
    auto next_item = [&](std::int64_t i) {
      Item item;
      item.sequence = i;
      if (rng() % 2 == 0 || pool.empty()) {
        pool.push_back(Tensor::zeros({1 + static_cast<std::int64_t>(rng() % 8192)}, DType::Int32, Device::SharedCpu));
        if (pool.size() > 8) pool.erase(pool.begin());
      }
      item.main = pool[rng() % pool.size()];
      return item;
    };
    std::int64_t sent = 0;
    for (; sent < before_kill; ++sent) tx.send(next_item(sent));
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    const auto killed = Clock::now();
    try {
      while (Clock::now() - killed < kDetectionBound) tx.send(next_item(sent++));
      ADD_FAILURE() << "sends kept succeeding after the receiver was killed";
    } catch (const ChannelClosed&) {
      // What the survivor must see.
    } catch (const std::exception& error) {
      ADD_FAILURE() << "a killed receiver must be ChannelClosed, not: " << error.what();
    }
    EXPECT_LT(Clock::now() - killed, kDetectionBound);
    EXPECT_FALSE(tx.is_open());
    tx.close();  // must not throw or wait for the dead receiver's acknowledgements
    pool.clear();
    EXPECT_EQ(wait_child(child).signal, SIGKILL);
  });
}

TEST_P(CrashMatrixTest, SpawnedWorkerKilledAtRandomPoints) {
  // A worker started by ferry::spawn (fork or exec, alternating) echoes a stream of items
  // with tensors; it is killed at a random point, sometimes before it read its arguments.
  // Its group, and both channels to it, must report the death; nothing may stay pinned.
  constexpr std::int64_t kInFlight = 4;  // items ahead of their echoes: no transport ever fills
  run_column("spawned worker killed", [&](std::uint64_t seed) {
    std::mt19937_64 rng(seed ^ 0xa11ce);
    SpawnOptions options;
    options.start_method = seed % 2 == 0 ? StartMethod::Fork : StartMethod::Spawn;
    SCOPED_TRACE(std::string("start method ") + std::string(start_method_name(options.start_method)));
    ChannelOptions channel_options;
    channel_options.peer_check_interval = 20ms;  // a ring notices the death sooner: more rounds
    auto [to_worker, worker_in] = channel<Item>(GetParam(), channel_options);
    auto [worker_out, from_worker] = channel<Item>(GetParam(), channel_options);
    WorkerGroup workers = spawn(options, 1, echo_items, std::move(worker_in), std::move(worker_out), seed);
    const pid_t worker = workers.pid(0);

    ItemSource source(seed);
    const std::int64_t before_kill = rng() % 8 == 0 ? 0 : static_cast<std::int64_t>(rng() % 300);
    std::int64_t sent = 0;
    std::int64_t echoed = 0;
    while (echoed < before_kill) {
      for (; sent < echoed + kInFlight; ++sent) to_worker.send(source.next(sent));
      auto echo = from_worker.recv();
      ASSERT_TRUE(echo.has_value());
      ASSERT_EQ(echo->sequence, echoed++) << "echoes lost or reordered";
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    ASSERT_EQ(::kill(worker, SIGKILL), 0);
    const auto killed = Clock::now();

    // The channel from the worker: the echoes already on their way, in order, then PeerDied.
    try {
      while (auto echo = from_worker.recv()) {
        ASSERT_EQ(echo->sequence, echoed++) << "echoes lost or reordered";
      }
      ADD_FAILURE() << "a killed worker looked like a clean end of stream";
    } catch (const PeerDied&) {
      // What the parent must see.
    } catch (const std::exception& error) {
      ADD_FAILURE() << "a killed worker's channel must be PeerDied, not: " << error.what();
    }
    EXPECT_LT(Clock::now() - killed, kDetectionBound);
    EXPECT_LE(echoed, sent);

    // The channel to the worker: sends fail with ChannelClosed.
    try {
      while (Clock::now() - killed < kDetectionBound) to_worker.send(source.next(sent++));
      ADD_FAILURE() << "sends to a killed worker kept succeeding";
    } catch (const ChannelClosed&) {
      // What the parent must see.
    } catch (const std::exception& error) {
      ADD_FAILURE() << "sending to a killed worker must be ChannelClosed, not: " << error.what();
    }
    EXPECT_LT(Clock::now() - killed, kDetectionBound);
    EXPECT_FALSE(to_worker.is_open());

    // The group: WorkerFailed naming the worker and the signal.
    try {
      const bool finished = workers.join(kDetectionBound);
      ADD_FAILURE() << "join() did not report the killed worker (finished: " << finished << ")";
    } catch (const WorkerFailed& failure) {
      EXPECT_EQ(failure.failure(), WorkerFailure::Signal) << failure.what();
      EXPECT_EQ(failure.signal(), SIGKILL) << failure.what();
      EXPECT_EQ(failure.rank(), 0);
      EXPECT_EQ(failure.pid(), worker);
      EXPECT_NE(std::string(failure.what()).find("killed by signal SIGKILL"), std::string::npos) << failure.what();
    }
    EXPECT_LT(Clock::now() - killed, kDetectionBound);
    ASSERT_TRUE(workers.exit_status(0).has_value());
    EXPECT_EQ(workers.exit_status(0)->signal, SIGKILL);
    EXPECT_EQ(workers.running(), 0);
    EXPECT_TRUE(test::has_no_children()) << "the killed worker was not reaped";
    to_worker.close();  // must not throw or wait for the dead worker's acknowledgements
    from_worker.close();
  });
}

}  // namespace
}  // namespace ferry
