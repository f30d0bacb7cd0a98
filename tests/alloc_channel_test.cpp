// The caching allocator across processes, over every transport: recycled blocks travel
// without new segments, a block is never recycled while a receiver holds it (even after the
// channel closed), receivers killed while holding blocks are reclaimed without leaks, and
// isolated channels pass only their own pool's segments.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "ferry/detail/frame_channel.hpp"
#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/transports.hpp"

namespace ferry {
namespace {

using test::child_succeeded;
using test::fork_child;

constexpr std::size_t kMiB = 1024 * 1024;

struct Batch {
  std::int64_t step = 0;
  std::vector<Tensor> tensors;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(step, tensors);
  }
};

class AllocChannelTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {};

// Both ends of a new channel as members of one object: the body of a forked process can
// capture it with [&], which clang 14 does not allow for a structured binding.
template <class T>
struct Ends {
  explicit Ends(Transport transport, const ChannelOptions& options = {}) {
    std::tie(tx, rx) = channel<T>(transport, options);
  }
  Sender<T> tx;
  Receiver<T> rx;
};

INSTANTIATE_TEST_SUITE_P(Transports, AllocChannelTest, ::testing::ValuesIn(test::interprocess_transports()),
                         test::transport_test_name);

// A tensor of `elements` int32 from `pool`, every element `value`.
Tensor filled(const SharedAllocator& pool, std::int64_t elements, std::int32_t value) {
  Tensor t = Tensor::empty({elements}, DType::Int32, pool);
  t.fill(value);
  return t;
}

// True when every element of `t` (of integer type T) is `value`: the first is, and each
// equals the next (one memcmp of the elements against themselves shifted by one, which
// keeps the long tests quick in the -O0 build).
template <class T>
bool all_equal(const Tensor& t, T value) {
  static_assert(std::is_integral_v<T>, "bytes compare like values only for integers");
  const auto* data = t.data<T>();  // throws for another dtype
  const std::int64_t count = t.numel();
  if (count == 0) return true;
  return data[0] == value && std::memcmp(data, data + 1, static_cast<std::size_t>(count - 1) * sizeof(T)) == 0;
}

TEST_P(AllocChannelTest, NewTensorsInRecycledBlocksNeedNoNewSegments) {
  SharedAllocator pool;
  Ends<Batch> data(GetParam());
  Ends<int> reply(GetParam());
  constexpr int kSteps = 60;
  const pid_t child = fork_child([&] {
    data.tx.detach();
    reply.rx.close();
    reply.tx.adopt();
    for (int step = 0; step < kSteps; ++step) {
      auto batch = data.rx.recv();
      CHILD_CHECK(batch.has_value() && batch->step == step);
      CHILD_CHECK(batch->tensors.size() == 11);
      for (const Tensor& t : batch->tensors) CHILD_CHECK(all_equal(t, step));
      // Segments stay leased; only a handful are ever needed.
      CHILD_CHECK(detail::EndAccess::core(data.rx).leased_segments() <= 4);
      reply.tx.send(step);
    }
    CHILD_CHECK(!data.rx.recv().has_value());
  });
  data.rx.close();
  reply.tx.detach();
  SharedMemoryStats warm;
  for (int step = 0; step < kSteps; ++step) {
    if (step == 10) warm = pool.stats();
    Batch batch{step, {filled(pool, kMiB / 4, step)}};                               // 1 MiB: a segment of its own
    for (int i = 0; i < 10; ++i) batch.tensors.push_back(filled(pool, 1024, step));  // 4 KiB blocks
    data.tx.send(batch);
    ASSERT_EQ(reply.rx.recv().value(), step);
  }
  const SharedMemoryStats after = pool.stats();
  EXPECT_EQ(after.misses, warm.misses) << "a steady pipeline created segments after warm-up";
  EXPECT_EQ(after.segments, warm.segments);
  EXPECT_GT(after.hits, warm.hits);
  data.tx.close();
  EXPECT_TRUE(child_succeeded(child));
}

TEST_P(AllocChannelTest, HundredSmallTensorsShareOneSegment) {
  SharedAllocator pool;
  Ends<Batch> data(GetParam());
  const pid_t child = fork_child([&] {
    data.tx.detach();
    for (int round = 0; round < 3; ++round) {
      auto batch = data.rx.recv();
      CHILD_CHECK(batch.has_value() && batch->tensors.size() == 100);
      for (std::size_t i = 0; i < 100; ++i)
        CHILD_CHECK(all_equal(batch->tensors[i], round * 100 + static_cast<int>(i)));
      CHILD_CHECK(detail::EndAccess::core(data.rx).leased_segments() == 1);
      CHILD_CHECK(test::count_ferry_mappings() == 1);
    }
    CHILD_CHECK(!data.rx.recv().has_value());
  });
  data.rx.close();
  for (int round = 0; round < 3; ++round) {
    Batch batch{round, {}};
    for (int i = 0; i < 100; ++i) batch.tensors.push_back(filled(pool, 1024, round * 100 + i));
    data.tx.send(batch);
  }
  EXPECT_EQ(pool.stats().segments, 1u);
  data.tx.close();
  EXPECT_TRUE(child_succeeded(child));
}

TEST_P(AllocChannelTest, BlockIsNotRecycledWhileTheReceiverHoldsIt) {
  SharedAllocator pool;
  Ends<Batch> data(GetParam());
  Ends<int> reply(GetParam());
  const pid_t child = fork_child([&] {
    data.tx.detach();
    reply.rx.close();
    reply.tx.adopt();
    auto first = data.rx.recv();
    CHILD_CHECK(first.has_value());
    const Tensor kept = first->tensors.at(0);  // held by the user, across later messages
    CHILD_CHECK(all_equal(kept, 7));
    reply.tx.send(0);
    for (int i = 1; i <= 200; ++i) {
      auto batch = data.rx.recv();  // new tensors the producer wrote after it dropped `kept`
      CHILD_CHECK(batch.has_value() && all_equal(batch->tensors.at(0), 9));
      CHILD_CHECK(batch->tensors.at(0).data_ptr() != kept.data_ptr());
    }
    CHILD_CHECK(all_equal(kept, 7));
    reply.tx.send(1);
    CHILD_CHECK(!data.rx.recv().has_value());
  });
  data.rx.close();
  reply.tx.detach();
  const void* kept_address = nullptr;
  {
    Tensor first = filled(pool, 1024, 7);
    kept_address = first.data_ptr();
    data.tx.send(Batch{0, {first}});
    ASSERT_EQ(reply.rx.recv().value(), 0);
  }  // the producer's last reference to the first tensor dies here
  for (int i = 1; i <= 200; ++i) {
    Tensor next = filled(pool, 1024, 9);  // the same size class: the block would fit
    EXPECT_NE(next.data_ptr(), kept_address) << "a block the receiver holds was recycled";
    data.tx.send(Batch{i, {next}});
    release_cached_shared_memory();  // collecting and trimming must not free it either
  }
  ASSERT_EQ(reply.rx.recv().value(), 1);
  data.tx.close();
  EXPECT_TRUE(child_succeeded(child));
  // The child exited: every block came back.
  pool.trim();
  EXPECT_EQ(pool.stats().blocks_in_use, 0u);
}

TEST_P(AllocChannelTest, ReceivedStorageKeepsItsIdentityWhileLeasedAndItsBlockComesBackAfter) {
  // Lease identity with segment leases: the receiver drops every tensor after each message,
  // yet the storage stays the same Storage object (same id, same address) while the sender
  // holds it; once the sender dropped it and announced the release, the receiver's block
  // is given back and the sender's allocator may recycle it.
  SharedAllocator pool;
  Ends<Batch> data(GetParam());
  Ends<int> reply(GetParam());
  constexpr int kRounds = 20;
  const pid_t child = fork_child([&] {
    data.tx.detach();
    reply.rx.close();
    reply.tx.adopt();
    const Storage* first = nullptr;
    std::uint64_t first_id = 0;
    const void* first_data = nullptr;
    for (int round = 0; round < kRounds; ++round) {
      auto batch = data.rx.recv();
      CHILD_CHECK(batch.has_value() && batch->step == round);
      const Tensor& t = batch->tensors.at(0);
      CHILD_CHECK(all_equal(t, 5));
      if (first == nullptr) {
        first = t.storage().get();
        first_id = t.storage()->id();
        first_data = t.data_ptr();
      }
      CHILD_CHECK(t.storage().get() == first);
      CHILD_CHECK(t.storage()->id() == first_id);
      CHILD_CHECK(t.data_ptr() == first_data);
      CHILD_CHECK(detail::EndAccess::core(data.rx).leased() == 1);
      reply.tx.send(round);
    }                            // every tensor of the storage is dropped here, after each round
    auto last = data.rx.recv();  // releases the first storage's slot before resolving its own
    CHILD_CHECK(last.has_value() && last->step == kRounds && all_equal(last->tensors.at(0), 6));
    CHILD_CHECK(detail::EndAccess::core(data.rx).leased() == 1);
    reply.tx.send(kRounds);
    CHILD_CHECK(!data.rx.recv().has_value());
  });
  data.rx.close();
  reply.tx.detach();
  {
    const Tensor shared = filled(pool, 1024, 5);
    for (int round = 0; round < kRounds; ++round) {
      data.tx.send(Batch{round, {shared}});
      ASSERT_EQ(reply.rx.recv().value(), round);
    }
    EXPECT_EQ(detail::EndAccess::core(data.tx).storages_passed(), 1u)
        << "a storage the receiver leases travels as its slot";
  }  // the sender's last reference dies: the next frame announces the release
  const Tensor next = filled(pool, 1024, 6);
  data.tx.send(Batch{kRounds, {next}});
  ASSERT_EQ(reply.rx.recv().value(), kRounds);
  release_cached_shared_memory();  // reads the return board
  EXPECT_EQ(detail::EndAccess::core(data.tx).pinned_storages(), 1u) << "the receiver gave the released block back";
  EXPECT_EQ(pool.stats().blocks_in_use, 1u);
  data.tx.close();
  EXPECT_TRUE(child_succeeded(child));
}

// The README's advice for many small tensors: views of one storage (Tensor::unbind) cost
// one block, sent once; they arrive as views of one storage, each with its own elements.
TEST_P(AllocChannelTest, UnboundViewsOfOneStorageTravelAsOneBlock) {
  SharedAllocator pool;
  Ends<Batch> data(GetParam());
  const pid_t child = fork_child([&] {
    data.tx.detach();
    auto batch = data.rx.recv();
    CHILD_CHECK(batch.has_value() && batch->tensors.size() == 100);
    for (std::size_t i = 0; i < batch->tensors.size(); ++i) {
      CHILD_CHECK(batch->tensors[i].shares_storage_with(batch->tensors[0]));
      CHILD_CHECK(all_equal(batch->tensors[i], static_cast<std::int32_t>(i)));
    }
  });
  data.rx.close();
  Tensor whole = Tensor::empty({100, 1024}, DType::Int32, pool);
  std::vector<Tensor> views = whole.unbind();
  for (std::size_t i = 0; i < views.size(); ++i) views[i].fill(static_cast<std::int32_t>(i));
  EXPECT_EQ(pool.stats().blocks_in_use, 1u);
  data.tx.send(Batch{0, std::move(views)});
  EXPECT_EQ(detail::EndAccess::core(data.tx).tracked_storages(), 1u);  // one lease for the receiver, however many views
  data.tx.close();
  EXPECT_TRUE(child_succeeded(child));
}

TEST_P(AllocChannelTest, ReceiverThatClosedTheChannelKeepsWhatItHolds) {
  SharedAllocator pool;
  Ends<Batch> data(GetParam());
  Ends<int> reply(GetParam());
  Ends<int> go(GetParam());
  const pid_t child = fork_child([&] {
    data.tx.detach();
    reply.rx.close();
    reply.tx.adopt();
    go.tx.detach();
    auto batch = data.rx.recv();
    CHILD_CHECK(batch.has_value());
    CHILD_CHECK(!data.rx.recv().has_value());  // end of stream: every lease is dropped
    data.rx.close();
    reply.tx.send(0);
    CHILD_CHECK(go.rx.recv().has_value());  // the producer allocated and wrote meanwhile
    CHILD_CHECK(all_equal(batch->tensors.at(0), 5));
  });
  data.rx.close();
  reply.tx.detach();
  go.rx.close();
  {
    data.tx.send(Batch{0, {filled(pool, 4096, 5)}});
    data.tx.close();
  }
  ASSERT_EQ(reply.rx.recv().value(), 0);
  release_cached_shared_memory();  // the receiver lives: nothing it holds is reclaimed
  EXPECT_EQ(pool.stats().blocks_in_use, 1u);
  std::vector<Tensor> others;
  for (int i = 0; i < 20; ++i) others.push_back(filled(pool, 4096, 6));
  go.tx.send(1);
  EXPECT_TRUE(child_succeeded(child));
}

TEST_P(AllocChannelTest, KilledReceiverHoldingBlocksIsReclaimedWhenMemoryIsNeeded) {
  SharedAllocatorSettings settings;
  settings.max_cached_bytes = 0;  // idle segments go at once: reclaiming shows in `segments`
  SharedAllocator pool(settings);
  Ends<Batch> data(GetParam());
  Ends<int> reply(GetParam());
  const pid_t child = fork_child([&] {
    data.tx.detach();
    reply.rx.close();
    reply.tx.adopt();
    std::vector<Batch> held;
    for (int i = 0; i < 5; ++i) held.push_back(data.rx.recv().value());
    reply.tx.send(1);
    while (true) ::pause();  // holds everything until killed
  });
  data.rx.close();
  reply.tx.detach();
  for (int i = 0; i < 5; ++i) data.tx.send(Batch{i, {filled(pool, 1024, i), filled(pool, kMiB / 2, i)}});
  ASSERT_EQ(reply.rx.recv().value(), 1);
  // Every block is the receiver's alone now, pinned for it.
  EXPECT_EQ(pool.stats().blocks_in_use, 10u);
  EXPECT_EQ(detail::EndAccess::core(data.tx).pinned_storages(), 10u);
  ::kill(child, SIGKILL);
  const test::ChildExit exit = test::wait_child(child);
  ASSERT_EQ(exit.signal, SIGKILL);
  // The channel is still open; the next allocation that finds no cached block collects
  // the dead receiver's blocks before it creates a segment.
  Tensor needs_memory = filled(pool, 3 * kMiB / 4, 0);
  EXPECT_EQ(pool.stats().blocks_in_use, 1u);
  EXPECT_EQ(pool.stats().segments, 1u);
  EXPECT_EQ(detail::EndAccess::core(data.tx).pinned_storages(), 0u);
  data.tx.close();  // tolerates the dead receiver
}

TEST_P(AllocChannelTest, FramesAKilledReceiverNeverReadAreReclaimed) {
  SharedAllocator pool;
  ChannelOptions options;
  options.peer_check_interval = std::chrono::milliseconds(5);  // ShmRing: notice the death soon
  Ends<Batch> data(GetParam(), options);
  const pid_t child = fork_child([&] {
    data.tx.detach();
    while (true) ::pause();  // never reads
  });
  data.rx.close();
  for (int i = 0; i < 3; ++i) data.tx.send(Batch{i, {filled(pool, 1024, i)}});
  EXPECT_EQ(pool.stats().blocks_in_use, 3u);
  ::kill(child, SIGKILL);
  ASSERT_EQ(test::wait_child(child).signal, SIGKILL);
  // Nobody registered as a holder and nobody can read the frames: the failed send (or a
  // failed close) gives their memory back. A pipe or socket fails the first send; a ring
  // looks at its peer at most once per peer_check_interval while it finds room, so its
  // sends may succeed (into the ring) for about that long.
  bool failed = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (int i = 3; !failed && std::chrono::steady_clock::now() < deadline; ++i) {
    try {
      data.tx.send(Batch{i, {filled(pool, 1024, i)}});
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } catch (const ChannelClosed&) {
      failed = true;
    }
  }
  EXPECT_TRUE(failed) << "sending to a dead receiver kept succeeding";
  pool.trim();
  EXPECT_EQ(pool.stats().blocks_in_use, 0u);
  EXPECT_EQ(pool.stats().segments, 0u);
}

TEST_P(AllocChannelTest, ClosedChannelReclaimsFramesOfAReceiverThatDiedBeforeReading) {
  SharedAllocator pool;
  ChannelOptions options;
  // Pipe: close() waits up to close_linger for the receiver to open the segments named by
  // /proc path; this receiver never will.
  options.close_linger = std::chrono::milliseconds(20);
  Ends<Batch> data(GetParam(), options);
  const pid_t child = fork_child([&] {
    data.tx.detach();
    while (true) ::pause();
  });
  data.rx.close();
  data.tx.send(Batch{0, {filled(pool, 1024, 0)}});
  data.tx.close();  // the receiver lives but never read the frame: its blocks stay pinned
  pool.trim();
  EXPECT_EQ(pool.stats().blocks_in_use, 1u);
  ::kill(child, SIGKILL);
  ASSERT_EQ(test::wait_child(child).signal, SIGKILL);
  pool.trim();  // the closed channel's probe sees the reading end gone
  EXPECT_EQ(pool.stats().blocks_in_use, 0u);
  EXPECT_EQ(detail::live_hold_ledgers(), 0u);
}

struct Stamped {
  std::int64_t step = 0;
  std::vector<std::int64_t> stamps;
  std::vector<Tensor> tensors;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(step, stamps, tensors);
  }
};

bool stamped(const Tensor& t, std::int64_t stamp) { return all_equal<std::int64_t>(t, stamp); }

// Random traffic over a pool that recycles at once (64 KiB slabs, nothing cached): new
// tensors, repeats (leases), drops on both sides and tensors echoed back to their sender
// and sent again. Every tensor is filled with its own stamp once; whoever holds it must
// always read that stamp, or a block was recycled while in use.
TEST_P(AllocChannelTest, RandomSendsDropsAndEchoesNeverShowARecycledBlock) {
  SharedAllocatorSettings settings;
  settings.segment_bytes = 64 * 1024;
  settings.max_cached_bytes = 0;
  SharedAllocator pool(settings);
  Ends<Stamped> data(GetParam());
  Ends<Stamped> back(GetParam());
  constexpr int kRounds = 100;
  const pid_t child = fork_child([&] {
    data.tx.detach();
    back.rx.close();
    back.tx.adopt();
    std::mt19937 random(7);
    std::vector<std::pair<std::int64_t, Tensor>> held;
    while (auto message = data.rx.recv()) {
      CHILD_CHECK(message->stamps.size() == message->tensors.size());
      for (std::size_t i = 0; i < message->tensors.size(); ++i) {
        CHILD_CHECK(stamped(message->tensors[i], message->stamps[i]));
        if (random() % 3 == 0) held.emplace_back(message->stamps[i], message->tensors[i]);
      }
      for (const auto& [stamp, t] : held) CHILD_CHECK(stamped(t, stamp));
      while (!held.empty() && random() % 4 == 0)
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(random() % held.size()));
      if (message->step < 0) {  // a sync: echo some held tensors back
        Stamped echo{message->step, {}, {}};
        for (const auto& [stamp, t] : held) {
          if (random() % 2 == 0) {
            echo.stamps.push_back(stamp);
            echo.tensors.push_back(t);
          }
        }
        back.tx.send(echo);
      }
    }
    for (const auto& [stamp, t] : held) CHILD_CHECK(stamped(t, stamp));
  });
  data.rx.close();
  back.tx.detach();
  std::mt19937 random(11);
  std::vector<std::pair<std::int64_t, Tensor>> live;
  std::vector<std::pair<std::int64_t, Tensor>> echoed;
  std::int64_t next_stamp = 1;
  for (int round = 0; round < kRounds; ++round) {
    const int frames = 1 + static_cast<int>(random() % 6);
    for (int f = 0; f < frames; ++f) {
      Stamped message{round, {}, {}};
      const int fresh = static_cast<int>(random() % 4);
      for (int i = 0; i < fresh; ++i) {
        const std::int64_t elements = std::int64_t{1} << (random() % 14);  // 8 B ... 64 KiB
        Tensor t = Tensor::empty({elements}, DType::Int64, pool);
        t.fill(next_stamp);
        live.emplace_back(next_stamp++, t);
      }
      for (int i = 0; i < 4 && !live.empty(); ++i) {
        const auto& [stamp, t] = live[random() % live.size()];
        message.stamps.push_back(stamp);
        message.tensors.push_back(t);
      }
      if (!echoed.empty() && random() % 2 == 0) {
        const auto& [stamp, t] = echoed[random() % echoed.size()];
        message.stamps.push_back(stamp);
        message.tensors.push_back(t);
      }
      data.tx.send(message);
      while (!live.empty() && random() % 3 == 0)
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(random() % live.size()));
      while (!echoed.empty() && random() % 3 == 0)
        echoed.erase(echoed.begin() + static_cast<std::ptrdiff_t>(random() % echoed.size()));
    }
    data.tx.send(Stamped{-1 - round, {}, {}});
    auto echo = back.rx.recv();
    ASSERT_TRUE(echo.has_value());
    for (std::size_t i = 0; i < echo->tensors.size(); ++i) {
      ASSERT_TRUE(stamped(echo->tensors[i], echo->stamps[i])) << "round " << round;
      echoed.emplace_back(echo->stamps[i], echo->tensors[i]);
    }
    for (const auto& [stamp, t] : live) ASSERT_TRUE(stamped(t, stamp)) << "round " << round;
  }
  data.tx.close();
  EXPECT_TRUE(child_succeeded(child));
  live.clear();
  echoed.clear();
  back.rx.close();
  pool.trim();
  EXPECT_EQ(pool.stats().blocks_in_use, 0u);
}

TEST_P(AllocChannelTest, ReceiverHandedToAForkedWorkerKeepsItsLeasesAndBlocks) {
  // A process that has received (its end is used) hands its Receiver to a worker started
  // by fork (spawn's default). The worker inherits the receiving state: the leases and
  // the tensors received so far. The handing process's copy of the end is let go; that
  // must not give the worker's leases and blocks back to the sender.
  SharedAllocator pool;
  Ends<Batch> data(GetParam());
  Ends<int> handed(GetParam());
  Ends<int> report(GetParam());
  constexpr int kSteps = 40;
  const pid_t child = fork_child([&] {
    data.tx.detach();
    handed.rx.close();
    handed.tx.adopt();
    report.rx.close();
    auto first = data.rx.recv();
    CHILD_CHECK(first.has_value() && first->tensors.size() == 2);
    const Tensor kept = first->tensors[1];
    first.reset();
    WorkerGroup group = spawn(
        1,
        [](WorkerContext&, Receiver<Batch> in, Tensor kept_too, Sender<int> report) {
          int ok = all_equal(kept_too, 7) ? 1 : 0;
          for (int step = 1; step <= kSteps; ++step) {
            std::optional<Batch> batch;
            try {
              batch = in.recv();
            } catch (const Error& error) {
              std::fprintf(stderr, "worker: step %d: %s\n", step, error.what());
              ok = 0;
              break;
            }
            if (!batch || batch->step != step || !all_equal(batch->tensors.at(0), 5) ||
                !all_equal(batch->tensors.at(1), 9) || !all_equal(kept_too, 7)) {
              ok = 0;
            }
          }
          report.send(ok);
        },
        std::move(data.rx), kept, std::move(report.tx));
    handed.tx.send(1);  // the end is the worker's now; this process lives on
    group.join();
  });
  data.rx.close();
  handed.tx.detach();
  report.tx.detach();
  const Tensor first_kept = filled(pool, 1024, 5);  // travels again: as a lease
  {
    data.tx.send(Batch{0, {first_kept, filled(pool, 1024, 7)}});  // the second one only the receiver holds
    ASSERT_EQ(handed.rx.recv().value(), 1);
  }
  for (int step = 1; step <= kSteps; ++step) {
    data.tx.send(Batch{step, {first_kept, filled(pool, 1024, 9)}});  // same class as the held block
    release_cached_shared_memory();
  }
  EXPECT_EQ(report.rx.recv().value_or(-1), 1) << "the worker lost its leases or saw a recycled block";
  data.tx.close();
  EXPECT_TRUE(child_succeeded(child));
  pool.trim();  // both holders exited: everything but the sender's own tensor comes back
  EXPECT_EQ(pool.stats().blocks_in_use, 1u);
}

TEST_P(AllocChannelTest, SenderHandedToAForkedWorkerGetsItsBlocksBack) {
  // A used Sender handed to a worker started by fork (spawn's default): the worker's own
  // sends must come back to its allocator when the receiver lets them go, as they would
  // on a fresh end, instead of staying pinned for the worker's life.
  Ends<Batch> data(GetParam());
  Ends<int> ack(GetParam());
  Ends<std::uint64_t> report(GetParam());
  constexpr int kSteps = 40;
  const pid_t receiver = fork_child([&] {
    data.tx.detach();
    ack.rx.close();
    ack.tx.adopt();
    report.tx.detach();
    report.rx.close();
    for (int step = 0; step <= kSteps; ++step) {
      {
        auto batch = data.rx.recv();
        CHILD_CHECK(batch.has_value() && batch->step == step && all_equal(batch->tensors.at(0), step));
      }  // dropped here; its lease goes when the sender announces the release
      ack.tx.send(step);
    }
    CHILD_CHECK(!data.rx.recv().has_value());
  });
  data.rx.close();
  ack.tx.detach();
  data.tx.send(Batch{0, {filled(SharedAllocator::global(), 16, 0)}});  // the end is used now
  ASSERT_EQ(ack.rx.recv().value_or(-1), 0);
  WorkerGroup group = spawn(
      1,
      [](WorkerContext&, Sender<Batch> out, Receiver<int> acks, Sender<std::uint64_t> report) {
        SharedAllocator pool;
        for (int step = 1; step <= kSteps; ++step) {
          out.send(Batch{step, {filled(pool, 64 * 1024, step)}});  // 256 KiB, dropped at once
          if (acks.recv() != step) throw std::runtime_error("lost step");
        }
        report.send(pool.stats().segments);
        report.send(detail::EndAccess::core(out).pinned_storages());
      },
      std::move(data.tx), std::move(ack.rx), std::move(report.tx));
  const auto segments = report.rx.recv();
  const auto pinned = report.rx.recv();
  EXPECT_EQ(segments.value_or(99), 1u) << "the worker's allocator never got its blocks back";
  EXPECT_LE(pinned.value_or(99), 2u) << "the worker's sends stayed pinned";
  ASSERT_TRUE(group.join(std::chrono::seconds(30)));
  EXPECT_TRUE(child_succeeded(receiver));
}

// ~SenderCore, destroyed while an exception unwinds, skips close(); it used to let its encoder
// close the ledger without the transport's liveness probe: a receiver that never resolved a
// frame never registers as a holder, so nothing told the ledger that the frames were
// unreadable, and their blocks stayed pinned for the life of the process (blocks_in_use 1, a
// ledger still live after trim).
TEST_P(AllocChannelTest, SenderDestroyedByAnExceptionReclaimsFramesOfAReceiverThatDiedBeforeReading) {
  SharedAllocator pool;
  ChannelOptions options;
  options.close_linger = std::chrono::milliseconds(20);
  Ends<Batch> data(GetParam(), options);
  const pid_t child = fork_child([&] {
    data.tx.detach();
    while (true) ::pause();  // never reads
  });
  data.rx.close();
  try {
    Sender<Batch> stage = std::move(data.tx);  // a stage that fails after a send
    stage.send(Batch{0, {filled(pool, 1024, 0)}});
    throw std::runtime_error("the stage failed");
  } catch (const std::runtime_error&) {
  }
  ::kill(child, SIGKILL);
  ASSERT_EQ(test::wait_child(child).signal, SIGKILL);
  pool.trim();  // nobody can read the frame any more
  EXPECT_EQ(pool.stats().blocks_in_use, 0u);
  EXPECT_EQ(detail::live_hold_ledgers(), 0u);
}

TEST_P(AllocChannelTest, IsolatedChannelPassesOnlyItsPoolsSegments) {
  SharedAllocator pool;
  ChannelOptions options;
  options.pool = pool;
  Ends<Batch> data(GetParam(), options);
  Ends<int> reply(GetParam());
  Tensor foreign = filled(SharedAllocator::global(), 1024, 3);  // a block of the process-wide pool
  const detail::FileIdentity foreign_segment = foreign.storage()->shared_block()->segment()->identity();
  const pid_t child = fork_child([&] {
    data.tx.detach();
    reply.rx.close();
    reply.tx.adopt();
    auto batch = data.rx.recv();
    CHILD_CHECK(batch.has_value() && batch->tensors.size() == 2);
    CHILD_CHECK(all_equal(batch->tensors[0], 3));
    CHILD_CHECK(all_equal(batch->tensors[1], 4));
    for (const Tensor& t : batch->tensors) {
      CHILD_CHECK(t.storage()->shared_block()->segment()->identity() != foreign_segment);
    }
    CHILD_CHECK(detail::EndAccess::core(data.rx).leased_segments() == 1);
    batch->tensors[1].fill(std::int32_t{8});  // the pool's tensor travelled without a copy
    reply.tx.send(1);
    CHILD_CHECK(!data.rx.recv().has_value());
  });
  data.rx.close();
  reply.tx.detach();
  ASSERT_TRUE(data.tx.pool().has_value());
  Tensor own = Tensor::empty({1024}, DType::Int32, *data.tx.pool());
  own.fill(std::int32_t{4});
  data.tx.send(Batch{0, {foreign, own}});
  ASSERT_EQ(reply.rx.recv().value(), 1);
  EXPECT_TRUE(all_equal(own, 8));
  EXPECT_TRUE(all_equal(foreign, 3));
  data.tx.close();
  EXPECT_TRUE(child_succeeded(child));
}

// Forwarding. A sends a block to B, B forwards it to C (the same storage, passed on), and B
// dies while C still views it: C registered as a holder on A's connection too, so A keeps
// the block while C lives and holds what came through B, and C never sees it change.

// A forked process of a forwarding test lets go of the ends it does not use.
template <class... Ends>
void detach_each(Ends&... ends) {
  (ends.detach(), ...);
}

// A forwarder's body: passes one batch from `in` on to `out`, then waits to be killed.
[[noreturn]] void forward_one_then_wait(Receiver<Batch>& in, Sender<Batch>& out) {
  out.adopt();
  {
    Batch got = in.recv().value();
    out.send(got);
  }
  while (true) ::pause();
}

// Reads the end of a dead forwarder's stream, after which the receiver lets go of the
// connection: once the blocks that came on it died as well, this process unregisters from
// the connections upstream of it, and their senders may reclaim what they pinned for the
// forwarder while this process lives on.
void let_go_of_a_dead_forwarder(Receiver<Batch>& from_forwarder) {
  try {
    CHILD_CHECK(!from_forwarder.recv().has_value());  // end of stream on pipe and socket
  } catch (const PeerDied&) {
    // the ring, or a frame cut short by the kill
  }
}

// Allocates and fills blocks of `pool` until it has recycled a few (what A would hand a
// block it wrongly reclaimed to).
std::vector<Tensor> allocate_over(const SharedAllocator& pool) {
  std::vector<Tensor> reuse;
  for (int i = 0; i < 8; ++i) reuse.push_back(filled(pool, 1024, 9));
  return reuse;
}

TEST_P(AllocChannelTest, ForwarderKilledWhileAThirdProcessHoldsTheBlockLeavesItIntactUntilTheThirdLetsGo) {
  SharedAllocator pool;
  Ends<Batch> ab(GetParam());
  Ends<Batch> bc(GetParam());
  Ends<int> held(GetParam());
  Ends<int> go(GetParam());
  const pid_t c = fork_child([&] {
    detach_each(ab.tx, bc.tx, go.tx, ab.rx, held.rx);
    held.tx.adopt();
    {
      Batch got = bc.rx.recv().value();
      CHILD_CHECK(all_equal(got.tensors.at(0), 7));
      held.tx.send(1);
      CHILD_CHECK(go.rx.recv().value() == 1);  // B is dead, A allocated over what it would have recycled
      CHILD_CHECK(all_equal(got.tensors.at(0), 7));
      let_go_of_a_dead_forwarder(bc.rx);
    }
    held.tx.send(2);
    CHILD_CHECK(go.rx.recv().value() == 2);  // lives on while A checks
  });
  const pid_t b = fork_child([&] {
    detach_each(ab.tx, held.tx, go.tx, bc.rx, held.rx, go.rx);
    forward_one_then_wait(ab.rx, bc.tx);
  });
  ab.rx.close();
  bc.tx.detach();
  bc.rx.close();
  held.tx.detach();
  go.rx.close();
  const Tensor anchor = filled(pool, 1024, 1);    // keeps the slab from going idle
  ab.tx.send(Batch{0, {filled(pool, 1024, 7)}});  // A's own tensor dies here: only the pins keep it
  ASSERT_EQ(held.rx.recv().value(), 1);
  ::kill(b, SIGKILL);
  ASSERT_EQ(test::wait_child(b).signal, SIGKILL);
  pool.trim();  // reads the holders: B is dead, C lives
  EXPECT_EQ(detail::EndAccess::core(ab.tx).pinned_storages(), 1u);
  const std::vector<Tensor> reuse = allocate_over(pool);
  go.tx.send(1);
  ASSERT_EQ(held.rx.recv().value(), 2);
  pool.trim();  // C let go: it unregistered from A's connection
  EXPECT_EQ(detail::EndAccess::core(ab.tx).pinned_storages(), 0u)
      << "A kept the dead forwarder's block after C let go of it";
  go.tx.send(2);
  EXPECT_TRUE(child_succeeded(c)) << "C saw its block recycled by A after B died";
  ab.tx.close();
}

// The same with A's board reaching C on two connections from B: C stays registered while
// it still holds a block of either, and A reclaims once C let go of both.
TEST_P(AllocChannelTest,
       ProcessDownstreamStaysRegisteredUpstreamWhileItHoldsABlockOfEitherConnectionThatBroughtTheBoard) {
  SharedAllocator pool;
  Ends<Batch> ab(GetParam());
  Ends<Batch> bc1(GetParam());
  Ends<Batch> bc2(GetParam());
  Ends<int> held(GetParam());
  Ends<int> go(GetParam());
  const pid_t c = fork_child([&] {
    detach_each(ab.tx, bc1.tx, bc2.tx, go.tx, ab.rx, held.rx);
    held.tx.adopt();
    std::optional<Batch> second = bc2.rx.recv().value();
    {
      Batch first = bc1.rx.recv().value();
      CHILD_CHECK(all_equal(first.tensors.at(0), 7) && all_equal(second->tensors.at(0), 8));
      held.tx.send(1);
      CHILD_CHECK(go.rx.recv().value() == 1);  // B is dead
      let_go_of_a_dead_forwarder(bc1.rx);
    }
    held.tx.send(2);
    CHILD_CHECK(go.rx.recv().value() == 2);  // A allocated over what it would have recycled
    CHILD_CHECK(all_equal(second->tensors.at(0), 8));
    let_go_of_a_dead_forwarder(bc2.rx);
    second.reset();
    held.tx.send(3);
    CHILD_CHECK(go.rx.recv().value() == 3);
  });
  const pid_t b = fork_child([&] {
    detach_each(ab.tx, held.tx, go.tx, bc1.rx, bc2.rx, held.rx, go.rx);
    bc1.tx.adopt();
    bc2.tx.adopt();
    {
      Batch first = ab.rx.recv().value();
      Batch second = ab.rx.recv().value();
      bc1.tx.send(first);
      bc2.tx.send(second);
    }
    while (true) ::pause();
  });
  ab.rx.close();
  bc1.tx.detach();
  bc1.rx.close();
  bc2.tx.detach();
  bc2.rx.close();
  held.tx.detach();
  go.rx.close();
  const Tensor anchor = filled(pool, 1024, 1);
  ab.tx.send(Batch{0, {filled(pool, 1024, 7)}});
  ab.tx.send(Batch{1, {filled(pool, 1024, 8)}});
  ASSERT_EQ(held.rx.recv().value(), 1);
  ::kill(b, SIGKILL);
  ASSERT_EQ(test::wait_child(b).signal, SIGKILL);
  go.tx.send(1);
  ASSERT_EQ(held.rx.recv().value(), 2);
  pool.trim();
  EXPECT_EQ(detail::EndAccess::core(ab.tx).pinned_storages(), 2u)
      << "C still holds a block that came on the second connection";
  const std::vector<Tensor> reuse = allocate_over(pool);
  go.tx.send(2);
  ASSERT_EQ(held.rx.recv().value(), 3);
  pool.trim();
  EXPECT_EQ(detail::EndAccess::core(ab.tx).pinned_storages(), 0u);
  go.tx.send(3);
  EXPECT_TRUE(child_succeeded(c)) << "C saw a block recycled while it held it";
  ab.tx.close();
}

// A process downstream of a forwarder (C) hands its used Receiver, and with it a block that
// came through A's board, to a forked worker W that takes the end over only later, and drops
// its own copy of the block: C stays registered on A's board for W (C's objects of the board
// are gone, but W may register only after that), so A keeps the block once the forwarder B
// died, and W reads it intact.
TEST_P(AllocChannelTest, ProcessThatHandedAForwardedBlockToAForkedWorkerStaysRegisteredUpstreamForIt) {
  SharedAllocator pool;
  Ends<Batch> ab(GetParam());
  Ends<Batch> bc(GetParam());
  Ends<int> held(GetParam());    // C -> A: handed over, C's copy of the block dropped
  Ends<int> go(GetParam());      // A -> W: B is dead and A allocated over what it could recycle
  Ends<int> result(GetParam());  // W -> A
  Ends<int> done(GetParam());    // A -> C
  const pid_t c = fork_child([&] {
    detach_each(ab.tx, ab.rx, bc.tx, held.rx, go.tx, result.rx, done.tx);
    held.tx.adopt();
    pid_t w = -1;
    {
      const Batch got = bc.rx.recv().value();
      CHILD_CHECK(all_equal(got.tensors.at(0), 7));
      w = fork_child([&] {
        detach_each(held.tx, done.rx);
        CHILD_CHECK(go.rx.recv().value() == 1);
        bc.rx.adopt();  // only now: C's copy of the block died long ago
        result.tx.adopt();
        result.tx.send(all_equal(got.tensors.at(0), 7) ? 1 : 0);
      });
      bc.rx.detach();  // handed over to W
    }                  // C's copy of the block dies: nothing that came through A's board lives in C any more
    detach_each(go.rx, result.tx);
    held.tx.send(1);
    CHILD_CHECK(done.rx.recv().value() == 1);
    CHILD_CHECK(child_succeeded(w));
  });
  const pid_t b = fork_child([&] {
    detach_each(ab.tx, bc.rx, held.tx, held.rx, go.tx, go.rx, result.tx, result.rx, done.tx, done.rx);
    bc.tx.adopt();
    {
      Batch got = ab.rx.recv().value();
      bc.tx.send(got);
    }
    while (true) ::pause();
  });
  ab.rx.close();
  bc.tx.detach();
  bc.rx.close();
  held.tx.detach();
  go.rx.close();
  result.tx.detach();
  done.rx.close();
  const Tensor anchor = filled(pool, 1024, 1);
  ab.tx.send(Batch{0, {filled(pool, 1024, 7)}});
  ASSERT_EQ(held.rx.recv().value(), 1);
  ::kill(b, SIGKILL);
  ASSERT_EQ(test::wait_child(b).signal, SIGKILL);
  pool.trim();  // B is dead; C lives, registered for W
  EXPECT_EQ(detail::EndAccess::core(ab.tx).pinned_storages(), 1u)
      << "C let go of A's board before W took the block over";
  const std::vector<Tensor> reuse = allocate_over(pool);
  go.tx.send(1);
  EXPECT_EQ(result.rx.recv().value(), 1) << "W saw its block recycled by A";
  done.tx.send(1);
  EXPECT_TRUE(child_succeeded(c));
  ab.tx.close();
}

// The same over two forwarders (A -> B -> C -> D), both killed while D holds the block: D
// registered on A's connection too, through C.
TEST_P(AllocChannelTest, TwoForwardersKilledWhileTheLastProcessHoldsTheBlockLeaveTheBlockIntact) {
  SharedAllocator pool;
  Ends<Batch> ab(GetParam());
  Ends<Batch> bc(GetParam());
  Ends<Batch> cd(GetParam());
  Ends<int> held(GetParam());
  Ends<int> go(GetParam());
  const pid_t d = fork_child([&] {
    detach_each(ab.tx, bc.tx, cd.tx, go.tx, ab.rx, bc.rx, held.rx);
    held.tx.adopt();
    Batch got = cd.rx.recv().value();
    CHILD_CHECK(all_equal(got.tensors.at(0), 7));
    held.tx.send(1);
    CHILD_CHECK(go.rx.recv().value() == 1);
    CHILD_CHECK(all_equal(got.tensors.at(0), 7));
  });
  const pid_t c = fork_child([&] {
    detach_each(ab.tx, bc.tx, held.tx, go.tx, ab.rx, cd.rx, held.rx, go.rx);
    forward_one_then_wait(bc.rx, cd.tx);
  });
  const pid_t b = fork_child([&] {
    detach_each(ab.tx, cd.tx, held.tx, go.tx, bc.rx, cd.rx, held.rx, go.rx);
    forward_one_then_wait(ab.rx, bc.tx);
  });
  ab.rx.close();
  bc.tx.detach();
  bc.rx.detach();
  cd.tx.detach();
  cd.rx.close();
  held.tx.detach();
  go.rx.close();
  const Tensor anchor = filled(pool, 1024, 1);
  ab.tx.send(Batch{0, {filled(pool, 1024, 7)}});
  ASSERT_EQ(held.rx.recv().value(), 1);
  for (const pid_t forwarder_pid : {b, c}) {
    ::kill(forwarder_pid, SIGKILL);
    ASSERT_EQ(test::wait_child(forwarder_pid).signal, SIGKILL);
  }
  pool.trim();
  EXPECT_EQ(detail::EndAccess::core(ab.tx).pinned_storages(), 1u);
  const std::vector<Tensor> reuse = allocate_over(pool);
  go.tx.send(1);
  EXPECT_TRUE(child_succeeded(d)) << "D saw its block recycled by A after B and C died";
  ab.tx.close();
}

// A block that comes back to the process that sent it, through a forwarder that dies while
// the sender views it again (its own Storage died meanwhile): the pin of the connection it
// left on keeps it, although the forwarder's death ends that pin.
TEST_P(AllocChannelTest, OwnBlockForwardedBackByAProcessThatDiesStaysIntactWhileViewed) {
  SharedAllocator pool;
  Ends<Batch> ab(GetParam());
  Ends<Batch> ba(GetParam());
  const pid_t b = fork_child([&] {
    detach_each(ab.tx, ba.rx);
    ba.tx.adopt();
    {
      Batch got = ab.rx.recv().value();
      ba.tx.send(got);
    }
    while (true) ::pause();
  });
  ab.rx.close();
  ba.tx.detach();
  const Tensor anchor = filled(pool, 1024, 1);
  ab.tx.send(Batch{0, {filled(pool, 1024, 7)}});  // its Storage dies here
  const Batch echo = ba.rx.recv().value();
  ::kill(b, SIGKILL);
  ASSERT_EQ(test::wait_child(b).signal, SIGKILL);
  pool.trim();  // B, the only holder of A's connection, is dead
  const std::vector<Tensor> reuse = allocate_over(pool);
  EXPECT_TRUE(all_equal(echo.tensors.at(0), 7)) << "A recycled a block it views through the echo";
  EXPECT_EQ(pool.stats().blocks_in_use, 2u + reuse.size());
  ab.tx.close();
}

// The same block coming back after the forwarder died and the sender reclaimed it (its only
// holder was dead): the frame is refused instead of showing the recycled block. Over a
// socket the block's fd travels with the frame, so the refusal is the own-block check's;
// over a pipe or ring the dead forwarder's fd cannot be opened any more.
TEST_P(AllocChannelTest, OwnBlockForwardedBackAfterTheSenderReclaimedItIsRefused) {
  SharedAllocator pool;
  Ends<Batch> ab(GetParam());
  Ends<Batch> ba(GetParam());
  Ends<int> forwarded(GetParam());
  const pid_t b = fork_child([&] {
    detach_each(ab.tx, ba.rx, forwarded.rx);
    ba.tx.adopt();
    forwarded.tx.adopt();
    {
      Batch got = ab.rx.recv().value();
      ba.tx.send(got);
    }
    forwarded.tx.send(1);
    while (true) ::pause();
  });
  ab.rx.close();
  ba.tx.detach();
  forwarded.tx.detach();
  const Tensor anchor = filled(pool, 1024, 1);
  ab.tx.send(Batch{0, {filled(pool, 1024, 7)}});  // its Storage dies here
  ASSERT_EQ(forwarded.rx.recv().value(), 1);
  ::kill(b, SIGKILL);
  ASSERT_EQ(test::wait_child(b).signal, SIGKILL);
  pool.trim();  // B was the only holder: A reclaims the block
  EXPECT_EQ(detail::EndAccess::core(ab.tx).pinned_storages(), 0u);
  const std::vector<Tensor> reuse = allocate_over(pool);
  try {
    const auto echo = ba.rx.recv();
    ADD_FAILURE() << "the echo of a reclaimed block was read";
  } catch (const PeerDied& error) {
    if (GetParam() == Transport::UnixSocket) {
      EXPECT_NE(std::string(error.what()).find("came back through processes that exited"), std::string::npos)
          << error.what();
    }
  }
  ab.tx.close();
}

// A used Receiver taken over by a forked process (adopt()) holds what arrived before: the
// process that received it exits, and the sender keeps the blocks while the new owner lives.
TEST_P(AllocChannelTest, ReceiverAdoptedByAForkedProcessKeepsWhatArrivedAfterTheReceiverExits) {
  SharedAllocator pool;
  Ends<Batch> ab(GetParam());
  Ends<int> held(GetParam());
  Ends<int> go(GetParam());
  Ends<int> result(GetParam());
  const pid_t b = fork_child([&] {
    detach_each(ab.tx, held.rx, go.tx, result.rx);
    const Batch got = ab.rx.recv().value();
    // C: takes the receiver (and the batch it received) over, and outlives B.
    fork_child([&] {
      ab.rx.adopt();
      held.tx.adopt();
      result.tx.adopt();
      held.tx.send(1);
      CHILD_CHECK(go.rx.recv().value() == 1);
      result.tx.send(all_equal(got.tensors.at(0), 7) ? 1 : 0);
    });
    ab.rx.detach();  // handed over to C
    detach_each(held.tx, go.rx, result.tx);
  });
  ab.rx.close();
  held.tx.detach();
  go.rx.close();
  result.tx.detach();
  const Tensor anchor = filled(pool, 1024, 1);
  ab.tx.send(Batch{0, {filled(pool, 1024, 7)}});
  ASSERT_EQ(held.rx.recv().value(), 1);
  ASSERT_TRUE(child_succeeded(b));  // B exited; C holds the block
  pool.trim();
  EXPECT_EQ(detail::EndAccess::core(ab.tx).pinned_storages(), 1u);
  const std::vector<Tensor> reuse = allocate_over(pool);
  go.tx.send(1);
  EXPECT_EQ(result.rx.recv().value(), 1) << "C saw its block recycled after B exited";
  ab.tx.close();
}

// The race the registration closes: B forwards a block and dies before C read the frame,
// and A reclaims everything it pinned for B (its only holder is dead) before C registers.
// C must then refuse the frame (PeerDied) instead of viewing memory A recycled.
TEST_P(AllocChannelTest, FrameForwardedByAProcessThatDiedBeforeItWasReadFailsOnceTheSenderReclaimed) {
  SharedAllocator pool;
  Ends<Batch> ab(GetParam());
  Ends<Batch> bc(GetParam());
  Ends<int> forwarded(GetParam());
  Ends<int> go(GetParam());
  const pid_t c = fork_child([&] {
    detach_each(ab.tx, bc.tx, forwarded.tx, go.tx, ab.rx, forwarded.rx);
    CHILD_CHECK(go.rx.recv().value() == 1);
    try {
      const auto got = bc.rx.recv();
      CHILD_CHECK(!"the frame of a dead forwarder was read after its memory was reclaimed");
    } catch (const PeerDied&) {
    }
  });
  const pid_t b = fork_child([&] {
    detach_each(ab.tx, forwarded.rx, go.tx, bc.rx, go.rx);
    bc.tx.adopt();
    forwarded.tx.adopt();
    {
      Batch got = ab.rx.recv().value();
      bc.tx.send(got);
    }
    forwarded.tx.send(1);
    while (true) ::pause();
  });
  ab.rx.close();
  bc.tx.detach();
  bc.rx.close();
  forwarded.tx.detach();
  go.rx.close();
  const Tensor anchor = filled(pool, 1024, 1);
  ab.tx.send(Batch{0, {filled(pool, 1024, 7)}});
  ASSERT_EQ(forwarded.rx.recv().value(), 1);
  ::kill(b, SIGKILL);
  ASSERT_EQ(test::wait_child(b).signal, SIGKILL);
  pool.trim();  // B was the only holder: A reclaims the block
  EXPECT_EQ(detail::EndAccess::core(ab.tx).pinned_storages(), 0u);
  const std::vector<Tensor> reuse = allocate_over(pool);
  go.tx.send(1);
  EXPECT_TRUE(child_succeeded(c));
  ab.tx.close();
}

// A forwarder that closes its end cleanly and exits: every frame it sent stays readable.
// B forwards two blocks of one segment of A that came on two connections; the second frame
// introduces no segment (the first one did), only the board of the second connection.
// Named by /proc path (Pipe, ShmRing), that board must stay open until the receiver has
// it, like a segment: B's close() waits for that, not just for the frames with segments.
TEST_P(AllocChannelTest, FrameThatIntroducesOnlyAnUpstreamBoardIsReadableAfterItsForwarderClosedAndExited) {
  SharedAllocator pool;
  Ends<Batch> a1(GetParam());
  Ends<Batch> a2(GetParam());
  Ends<Batch> ba(GetParam());
  Ends<int> go(GetParam());
  Ends<int> sent(GetParam());
  const pid_t b = fork_child([&] {
    detach_each(a1.tx, a2.tx, ba.rx, go.tx, sent.rx);
    ba.tx.adopt();
    sent.tx.adopt();
    ba.tx.send(a1.rx.recv().value());
    CHILD_CHECK(go.rx.recv().value() == 1);
    ba.tx.send(a2.rx.recv().value());
    // The receiver has not read the second frame yet: its board is what close() waits for.
    CHILD_CHECK(detail::EndAccess::core(ba.tx).writer().capabilities().passes_fds ||
                detail::EndAccess::core(ba.tx).segments_awaiting_acknowledgement() == 1);
    sent.tx.send(1);
    ba.tx.close();
  });
  a1.rx.close();
  a2.rx.close();
  ba.tx.detach();
  go.rx.close();
  sent.tx.detach();
  const Tensor first = filled(pool, 1024, 5);
  const Tensor second = filled(pool, 1024, 6);
  ASSERT_EQ(first.storage()->shared_block()->segment(), second.storage()->shared_block()->segment());
  a1.tx.send(Batch{0, {first}});
  a2.tx.send(Batch{0, {second}});
  EXPECT_TRUE(all_equal(ba.rx.recv().value().tensors.at(0), 5));
  go.tx.send(1);
  ASSERT_EQ(sent.rx.recv().value(), 1);
  std::optional<Batch> echo;
  EXPECT_NO_THROW(echo = ba.rx.recv()) << "a frame sent before a clean close was lost";
  ASSERT_TRUE(echo.has_value());
  EXPECT_TRUE(all_equal(echo->tensors.at(0), 6));
  EXPECT_FALSE(ba.rx.recv().has_value());
  EXPECT_TRUE(child_succeeded(b));
  a1.tx.close();
  a2.tx.close();
}

// Descriptors of return boards this process has open.
std::size_t open_return_boards() {
  std::size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target = std::filesystem::read_symlink(entry.path(), error).string();
    if (!error && target.starts_with("/memfd:ferry-returns")) ++count;
  }
  return count;
}

// A forwarder keeps the board of a connection it forwarded from only while a block of that
// connection lives in it: one that forwards for many short-lived senders keeps no descriptor
// per sender it ever had.
TEST_P(AllocChannelTest, ForwarderLetsGoOfTheBoardOfAConnectionItNoLongerHoldsBlocksOf) {
  SharedAllocator pool;
  Ends<Batch> ab(GetParam());
  Ends<Batch> ba(GetParam());
  Ends<int> go(GetParam());
  const pid_t b = fork_child([&] {
    detach_each(ab.tx, ba.rx, go.tx);
    ba.tx.adopt();
    ba.tx.send(ab.rx.recv().value());
    CHILD_CHECK(!ab.rx.recv().has_value());
    ab.rx.close();
    ba.tx.send(Batch{1, {}});  // announces that B dropped the block
    CHILD_CHECK(go.rx.recv().value() == 1);
    detail::collect_returned_blocks(false);  // A gave the block back: nothing of A's connection lives here
    CHILD_CHECK(open_return_boards() == 0);
  });
  ab.rx.close();
  ba.tx.detach();
  go.rx.close();
  ab.tx.send(Batch{0, {filled(pool, 1024, 7)}});
  EXPECT_TRUE(all_equal(ba.rx.recv().value().tensors.at(0), 7));
  ab.tx.close();
  EXPECT_EQ(ba.rx.recv().value().tensors.size(), 0u);  // drops the lease of the block it echoed
  go.tx.send(1);
  EXPECT_TRUE(child_succeeded(b));
}

// The receiver at the end of a long-lived forwarding connection (C, fed by B) lets go of the
// boards of upstream connections that ended: B retires a board once nothing of its
// connection lives in B, so C keeps no descriptor and no mapping per connection B ever
// forwarded from (it kept all of them until its own connection closed before).
TEST_P(AllocChannelTest, LongLivedForwardingConnectionLetsGoOfTheBoardsOfUpstreamConnectionsThatEnded) {
  constexpr int kUpstreams = 5;
  SharedAllocator pool;
  std::vector<std::pair<Sender<Batch>, Receiver<Batch>>> upstreams;  // A -> B, one per round
  for (int i = 0; i < kUpstreams; ++i) upstreams.push_back(channel<Batch>(GetParam()));
  Ends<Batch> bc(GetParam());
  Ends<int> cb(GetParam());  // C tells B it dropped what it got
  // C: checks each forwarded block, drops it and says so; then counts its boards.
  const pid_t c = fork_child([&] {
    for (auto& [tx, rx] : upstreams) detach_each(tx, rx);
    detach_each(bc.tx, cb.rx);
    cb.tx.adopt();
    while (std::optional<Batch> got = bc.rx.recv()) {
      CHILD_CHECK(got->step < 0 || all_equal(got->tensors.at(0), static_cast<std::int32_t>(got->step)));
      const auto step = static_cast<int>(got->step);
      got.reset();
      cb.tx.send(step);
      if (step == -1) break;
    }
    // The connection's own board, and none of the upstream connections' boards.
    CHILD_CHECK(open_return_boards() == 1);
  });
  // B: forwards one batch of each upstream connection, drops it and closes that connection;
  // then a few empty frames carry the releases, collect C's returns and retire the boards.
  const pid_t b = fork_child([&] {
    detach_each(bc.rx, cb.tx);
    bc.tx.adopt();
    for (int i = 0; i < kUpstreams; ++i) {
      auto& [tx, rx] = upstreams[static_cast<std::size_t>(i)];
      tx.detach();
      bc.tx.send(rx.recv().value());
      CHILD_CHECK(!rx.recv().has_value());
      rx.close();
      CHILD_CHECK(cb.rx.recv().value() == i);
    }
    for (int k = 0; k < 4; ++k) {
      bc.tx.send(Batch{-2, {}});
      CHILD_CHECK(cb.rx.recv().value() == -2);
    }
    bc.tx.send(Batch{-1, {}});
    CHILD_CHECK(cb.rx.recv().value() == -1);
  });
  bc.tx.detach();
  bc.rx.close();
  cb.tx.detach();
  cb.rx.close();
  for (int i = 0; i < kUpstreams; ++i) {
    auto& [tx, rx] = upstreams[static_cast<std::size_t>(i)];
    rx.close();
    tx.send(Batch{i, {filled(pool, 1024, i)}});
    tx.close();
  }
  EXPECT_TRUE(child_succeeded(b));
  EXPECT_TRUE(child_succeeded(c));
}

// A board can reach a forwarder on two of its connections: B forwards two blocks of A (on
// A's connection, board X) to C on two connections, so that C maps X once for each. C passes
// X on to D once, with the first block. When the first connection has ended and its block is
// gone, C's object of X for that connection dies while the second block, which came through
// X too, still lives in C (and in D): C must not retire X then. Else D forgets X, the block
// D passes on to E is not held on A's connection for E, and once B, C and D are gone A
// recycles it under E. `when`: when C forwards the second block.
enum class SecondBlock {
  BeforeTheFirstDied,  // before D dropped the first
  WhileTheFirstDies,   // in the frame whose encoding collects D's return of the first (the
                       // object of X that C passed dies while that frame is encoded)
  AfterXWasRetired,    // once C retired X (it died with the first): C passes X again
};
void forward_a_board_that_came_on_two_connections(Transport transport, SecondBlock when) {
  SharedAllocator pool;
  Ends<Batch> ab(transport);
  Ends<Batch> bc1(transport);
  Ends<Batch> bc2(transport);
  Ends<Batch> cd(transport);
  Ends<int> dc(transport);  // D tells C it dropped the first block
  Ends<Batch> de(transport);
  Ends<int> held(transport);
  Ends<int> go(transport);
  // E: holds the second block, which D passed on, while A recycles what it may.
  const pid_t e = fork_child([&] {
    detach_each(ab.tx, ab.rx, bc1.tx, bc1.rx, bc2.tx, bc2.rx, cd.tx, cd.rx, dc.tx, dc.rx, de.tx, held.rx, go.tx);
    held.tx.adopt();
    const Batch got = de.rx.recv().value();
    CHILD_CHECK(all_equal(got.tensors.at(0), 7));
    held.tx.send(1);
    CHILD_CHECK(go.rx.recv().value() == 1);
    CHILD_CHECK(all_equal(got.tensors.at(0), 7));
  });
  // D: drops the first block, keeps the second; once C's frames retired what died in C, it
  // passes the second block on to E.
  const pid_t d = fork_child([&] {
    detach_each(ab.tx, ab.rx, bc1.tx, bc1.rx, bc2.tx, bc2.rx, cd.tx, dc.rx, de.rx, held.tx, held.rx, go.tx, go.rx);
    dc.tx.adopt();
    de.tx.adopt();
    CHILD_CHECK(all_equal(cd.rx.recv().value().tensors.at(0), 5));
    std::optional<Batch> second;
    for (int frame = 0;; ++frame) {  // the second block and empty frames, in C's order, up to -9
      Batch got = cd.rx.recv().value();
      if (frame == 0) dc.tx.send(1);  // that frame released the first block here
      if (got.step == -9) break;
      if (!got.tensors.empty()) {
        CHILD_CHECK(all_equal(got.tensors.at(0), 7));
        second = std::move(got);
      }
    }
    CHILD_CHECK(second.has_value());
    de.tx.send(*second);
    while (true) ::pause();
  });
  // C: forwards both blocks to D and ends the first connection; the frame after D dropped
  // the first block collects D's return (C's object of X for the first connection dies),
  // the next one retires what died.
  const pid_t c = fork_child([&] {
    detach_each(ab.tx, ab.rx, bc1.tx, bc2.tx, cd.rx, dc.tx, de.tx, de.rx, held.tx, held.rx, go.tx, go.rx);
    cd.tx.adopt();
    cd.tx.send(bc1.rx.recv().value());
    bc1.rx.close();
    const Batch second = bc2.rx.recv().value();
    if (when == SecondBlock::BeforeTheFirstDied) {
      cd.tx.send(second);  // releases the first block
      CHILD_CHECK(dc.rx.recv().value() == 1);
      cd.tx.send(Batch{-1, {}});  // collects D's return of it
    } else {
      cd.tx.send(Batch{-1, {}});  // releases the first block
      CHILD_CHECK(dc.rx.recv().value() == 1);
      if (when == SecondBlock::AfterXWasRetired) {
        cd.tx.send(Batch{-2, {}});  // collects D's return of it
        cd.tx.send(Batch{-3, {}});  // retires what died: X too, no object of it lives here
      }
      cd.tx.send(second);
    }
    cd.tx.send(Batch{-9, {}});  // retires what died
    while (true) ::pause();
  });
  // B: forwards A's two blocks to C, one on each connection.
  const pid_t b = fork_child([&] {
    detach_each(ab.tx, bc1.rx, bc2.rx, cd.tx, cd.rx, dc.tx, dc.rx, de.tx, de.rx, held.tx, held.rx, go.tx, go.rx);
    bc1.tx.adopt();
    bc2.tx.adopt();
    bc1.tx.send(ab.rx.recv().value());
    bc2.tx.send(ab.rx.recv().value());
    while (true) ::pause();
  });
  detach_each(ab.rx, bc1.tx, bc1.rx, bc2.tx, bc2.rx, cd.tx, cd.rx, dc.tx, dc.rx, de.tx, de.rx, held.tx, go.rx);
  const Tensor anchor = filled(pool, 1024, 1);
  ab.tx.send(Batch{0, {filled(pool, 1024, 5)}});
  ab.tx.send(Batch{1, {filled(pool, 1024, 7)}});
  ASSERT_EQ(held.rx.recv().value(), 1);
  for (const pid_t forwarder : {b, c, d}) {
    ::kill(forwarder, SIGKILL);
    ASSERT_EQ(test::wait_child(forwarder).signal, SIGKILL);
  }
  pool.trim();  // reads the holders of A's connection: B, C and D are dead, E lives
  EXPECT_EQ(detail::EndAccess::core(ab.tx).pinned_storages(), 2u);  // the first block too: B never gave it back
  const std::vector<Tensor> reuse = allocate_over(pool);
  go.tx.send(1);
  EXPECT_TRUE(child_succeeded(e)) << "E saw its block recycled by A after B, C and D died";
  ab.tx.close();
}

TEST_P(AllocChannelTest, ForwarderKeepsAnUpstreamBoardThatCameOnTwoConnectionsWhileOneStillHoldsItsBlocks) {
  forward_a_board_that_came_on_two_connections(GetParam(), SecondBlock::BeforeTheFirstDied);
}

TEST_P(AllocChannelTest, ForwarderKeepsAnUpstreamBoardWhoseObjectItPassedDiedWhileAnotherOneWasForwarded) {
  forward_a_board_that_came_on_two_connections(GetParam(), SecondBlock::WhileTheFirstDies);
}

TEST_P(AllocChannelTest, ForwarderPassesARetiredUpstreamBoardAgainWithABlockThatCameThroughIt) {
  forward_a_board_that_came_on_two_connections(GetParam(), SecondBlock::AfterXWasRetired);
}

// A forked worker K inherits its parent's segments. Once a block of K's own came back to
// it (through B), a block of such an inherited segment that the parent P sends on through
// B is not K's own block coming back: K holds it like any forwarded block (registered on
// P's board), and reads it.
TEST_P(AllocChannelTest, ForkedWorkerReadsABlockOfAnInheritedSegmentForwardedAfterItsOwnCameBack) {
  SharedAllocator pool;
  const Tensor anchor = filled(pool, 1024, 1);  // its segment exists before the fork
  Ends<Batch> pb(GetParam());
  Ends<Batch> bk(GetParam());
  Ends<Batch> kb(GetParam());
  Ends<int> done(GetParam());
  const pid_t k = fork_child([&] {
    detach_each(pb.tx, bk.tx, kb.rx, done.rx, pb.rx);
    kb.tx.adopt();
    done.tx.adopt();
    kb.tx.send(Batch{0, {filled(pool, 1024, 3)}});  // a segment of K's (K's Storage dies here)
    CHILD_CHECK(all_equal(bk.rx.recv().value().tensors.at(0), 3));
    try {
      const Batch forwarded = bk.rx.recv().value();
      CHILD_CHECK(all_equal(forwarded.tensors.at(0), 7));
    } catch (const PeerDied&) {
      CHILD_CHECK(!"a block of the parent's segment was taken for one of K's own, reclaimed");
    }
    done.tx.send(1);
  });
  const pid_t b = fork_child([&] {
    detach_each(pb.tx, bk.rx, kb.tx, done.tx, done.rx);
    bk.tx.adopt();
    bk.tx.send(kb.rx.recv().value());  // K's block goes back to K
    bk.tx.send(pb.rx.recv().value());  // P's block goes on to K
    CHILD_CHECK(!pb.rx.recv().has_value());
  });
  pb.rx.close();
  bk.tx.detach();
  bk.rx.close();
  kb.tx.detach();
  kb.rx.close();
  done.tx.detach();
  const Tensor sent = filled(pool, 1024, 7);
  ASSERT_EQ(sent.storage()->shared_block()->segment(), anchor.storage()->shared_block()->segment());
  pb.tx.send(Batch{0, {sent}});
  EXPECT_EQ(done.rx.recv().value(), 1);
  pb.tx.close();
  EXPECT_TRUE(child_succeeded(k));
  EXPECT_TRUE(child_succeeded(b));
}

}  // namespace
}  // namespace ferry
