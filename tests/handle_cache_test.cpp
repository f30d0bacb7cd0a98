#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "ferry/handle_cache.hpp"
#include "ferry/shared_allocator.hpp"
#include "ferry/storage.hpp"
#include "support/leak_check.hpp"

namespace ferry {
namespace {

class HandleCacheTest : public test::LeakCheckedTest {};

// A segment that is in no cache yet (the cache is tested with fake identities).
std::shared_ptr<detail::SharedSegment> new_segment() { return detail::SharedSegment::create(4096, nullptr); }

TEST_F(HandleCacheTest, NewSharedStorageIsFoundByItsIdentity) {
  auto storage = Storage::allocate(4096, Device::SharedCpu);
  const std::shared_ptr<detail::SharedSegment>& segment = storage->shared_block()->segment();
  const detail::FileIdentity identity = segment->identity();
  EXPECT_EQ(HandleCache::global().find(identity), segment);
  EXPECT_EQ(identity, detail::identify_fd(segment->fd()));
}

TEST_F(HandleCacheTest, HoldsWeakReferencesOnly) {
  // A pool that caches nothing: the segment is unmapped as soon as its only block dies, and
  // the cache must not have kept it alive.
  SharedAllocatorSettings settings;
  settings.max_cached_bytes = 0;
  const SharedAllocator pool(settings);
  detail::FileIdentity identity;
  {
    auto storage = Storage::allocate(64, pool);
    identity = storage->shared_block()->segment()->identity();
    ASSERT_NE(HandleCache::global().find(identity), nullptr);
  }
  EXPECT_EQ(pool.stats().segments, 0u);
  EXPECT_EQ(HandleCache::global().find(identity), nullptr);
}

TEST_F(HandleCacheTest, ExistingLiveEntryWinsOverAnInsert) {
  HandleCache cache;
  auto first = new_segment();
  auto second = new_segment();
  const detail::FileIdentity identity{1, 2};
  EXPECT_EQ(cache.insert(identity, first), first);
  EXPECT_EQ(cache.insert(identity, second), first);
  first.reset();
  EXPECT_EQ(cache.insert(identity, second), second);  // the dead entry is replaced
}

TEST_F(HandleCacheTest, DeadEntriesArePurgedAndTheLimitScalesWithLiveOnes) {
  HandleCache cache;
  std::vector<std::shared_ptr<detail::SharedSegment>> live;
  for (std::uint64_t i = 0; i < 100; ++i) {
    live.push_back(new_segment());
    cache.insert({0, i}, live.back());
  }
  for (std::uint64_t i = 100; i < 128; ++i) cache.insert({0, i}, new_segment());  // dead at once
  EXPECT_EQ(cache.size(), 128u);
  EXPECT_EQ(cache.limit(), 128u);
  auto extra = new_segment();
  cache.insert({0, 1000}, extra);  // 129 entries > 128: the 28 dead ones go
  EXPECT_EQ(cache.size(), 101u);
  EXPECT_EQ(cache.limit(), 202u);
  live.resize(10);
  extra.reset();
  cache.purge();
  EXPECT_EQ(cache.size(), 10u);
  EXPECT_EQ(cache.limit(), 128u);
}

TEST_F(HandleCacheTest, ConcurrentInsertsOfOneIdentityAgreeOnOneSegment) {
  HandleCache cache;
  constexpr int kThreads = 8;
  constexpr int kRounds = 2000;
  std::atomic<int> disagreements{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        const detail::FileIdentity identity{7, static_cast<std::uint64_t>(round % 64)};
        auto mine = new_segment();
        auto winner = cache.insert(identity, mine);
        auto found = cache.find(identity);
        // While `winner` lives, every thread must see that same segment.
        if (found != winner) disagreements.fetch_add(1);
        if (t % 2 == 0 && round % 7 == 0) cache.purge();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(disagreements.load(), 0);
}

}  // namespace
}  // namespace ferry
