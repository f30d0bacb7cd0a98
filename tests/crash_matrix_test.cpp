// The crash matrix: for every transport, SIGKILL the sender or the receiver at random
// points of a long stream of messages with tensors (new, repeated, heap, released, views),
// many times over. The survivor must report a closed channel (PeerDied / ChannelClosed,
// never a ProtocolError, a clean end of stream or a hang) within a bounded time, and the
// fds and /dev/shm entries of this process must return to their starting values after
// every round, once the caching shared-memory allocator gave its cached segments back (a
// cache is not a leak; trimming also reclaims what a killed receiver held).
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

constexpr auto kColumnBudget = 1500ms;      // rounds per column stop starting after this
constexpr int kMaxRounds = 100;
constexpr auto kDetectionBound = 10s;       // generous: a dead peer is seen in well under 1 s

struct Item {
  std::int64_t sequence = 0;
  std::string note;
  Tensor main;
  std::vector<Tensor> views;
  template <class Archive>
  void serialize(Archive& ar) { ar(sequence, note, main, views); }
};

std::uint64_t base_seed() {
  static const std::uint64_t seed = [] {
    if (const char* text = std::getenv("FERRY_CRASH_SEED")) return static_cast<std::uint64_t>(std::strtoull(text, nullptr, 10));
    return static_cast<std::uint64_t>(Clock::now().time_since_epoch().count());
  }();
  return seed;
}

// An endless stream as a real producer writes it: new shared tensors of random sizes,
// tensors sent again (leases), heap tensors (moved to shared memory when sent), views of
// earlier ones, and tensors dropped (their leases released in later frames).
[[noreturn]] void produce_forever(Sender<Item>& tx, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Tensor> pool;
  for (std::int64_t i = 0;; ++i) {
    Item item;
    item.sequence = i;
    item.note = std::string(rng() % 64, 'n');
    const std::int64_t elements = 1 + static_cast<std::int64_t>(rng() % 16384);
    switch (rng() % 4) {
      case 0: item.main = Tensor::zeros({elements}, DType::Float32, Device::SharedCpu); break;
      case 1: item.main = pool.empty() ? Tensor() : pool[rng() % pool.size()]; break;
      case 2: item.main = Tensor::zeros({elements}, DType::UInt8); break;
      default: break;
    }
    if (item.main.defined()) pool.push_back(item.main);
    for (std::uint64_t v = rng() % 3; v > 0 && !pool.empty(); --v) {
      const Tensor& base = pool[rng() % pool.size()];
      item.views.push_back(base.slice(0, 0, std::max<std::int64_t>(1, base.size(0) / 2)));
    }
    if (pool.size() > 8) pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(rng() % pool.size()));
    tx.send(item);
  }
}

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
      SCOPED_TRACE(std::string(column) + " round " + std::to_string(rounds) + ", FERRY_CRASH_SEED=" +
                   std::to_string(base_seed()));
      round(seed);
      release_cached_shared_memory();
      ASSERT_EQ(count_open_fds(), fds) << "fds leaked in round " << rounds << " (seed " << seed << ")";
      ASSERT_EQ(count_dev_shm_entries(), shm) << "/dev/shm entries leaked in round " << rounds;
      if (HasFatalFailure()) return;
    }
    std::fprintf(stderr, "%s over %s: %d rounds (FERRY_CRASH_SEED=%llu)\n", column,
                 std::string(transport_name(GetParam())).c_str(), rounds,
                 static_cast<unsigned long long>(base_seed()));
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
  // TODO(crash-matrix): ferry::spawn (worker processes and their supervision) is being
  // written on another branch. Once it is merged, kill a spawned worker at random points of
  // its input stream, and check that join() reports the worker's death (with its signal)
  // within a bounded time, that the parent's channels to it report ChannelClosed, and that
  // fds and /dev/shm entries return to their starting values, as the two columns above do.
  GTEST_SKIP() << "ferry::spawn does not exist on this branch yet: the spawned-worker column of the "
                  "crash matrix runs once spawn is merged";
}

}  // namespace
}  // namespace ferry
