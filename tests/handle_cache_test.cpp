#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "ferry/handle_cache.hpp"
#include "ferry/storage.hpp"
#include "support/leak_check.hpp"

namespace ferry {
namespace {

class HandleCacheTest : public test::LeakCheckedTest {};

TEST_F(HandleCacheTest, NewSharedStorageIsFoundByItsIdentity) {
  auto storage = Storage::allocate(4096, Device::SharedCpu);
  const FileIdentity identity = storage->shared_memory()->identity();
  EXPECT_EQ(HandleCache::global().find(identity), storage);
  EXPECT_EQ(identity, identify_fd(storage->shared_memory()->fd()));
}

TEST_F(HandleCacheTest, HoldsWeakReferencesOnly) {
  FileIdentity identity;
  {
    auto storage = Storage::allocate(64, Device::SharedCpu);
    identity = storage->shared_memory()->identity();
  }
  EXPECT_EQ(HandleCache::global().find(identity), nullptr);
}

TEST_F(HandleCacheTest, ExistingLiveEntryWinsOverAnInsert) {
  HandleCache cache;
  auto first = Storage::allocate(16, Device::Cpu);
  auto second = Storage::allocate(16, Device::Cpu);
  const FileIdentity identity{1, 2};
  EXPECT_EQ(cache.insert(identity, first), first);
  EXPECT_EQ(cache.insert(identity, second), first);
  first.reset();
  EXPECT_EQ(cache.insert(identity, second), second);  // the dead entry is replaced
}

TEST_F(HandleCacheTest, DeadEntriesArePurgedAndTheLimitScalesWithLiveOnes) {
  HandleCache cache;
  std::vector<std::shared_ptr<Storage>> live;
  for (std::uint64_t i = 0; i < 100; ++i) {
    live.push_back(Storage::allocate(8, Device::Cpu));
    cache.insert({0, i}, live.back());
  }
  for (std::uint64_t i = 100; i < 128; ++i) cache.insert({0, i}, Storage::allocate(8, Device::Cpu));  // dead at once
  EXPECT_EQ(cache.size(), 128u);
  EXPECT_EQ(cache.limit(), 128u);
  auto extra = Storage::allocate(8, Device::Cpu);
  cache.insert({0, 1000}, extra);  // 129 entries > 128: the 28 dead ones go
  EXPECT_EQ(cache.size(), 101u);
  EXPECT_EQ(cache.limit(), 202u);
  live.resize(10);
  extra.reset();
  cache.purge();
  EXPECT_EQ(cache.size(), 10u);
  EXPECT_EQ(cache.limit(), 128u);
}

TEST_F(HandleCacheTest, ConcurrentInsertsOfOneIdentityAgreeOnOneStorage) {
  HandleCache cache;
  constexpr int kThreads = 8;
  constexpr int kRounds = 2000;
  std::atomic<int> disagreements{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        const FileIdentity identity{7, static_cast<std::uint64_t>(round % 64)};
        auto mine = Storage::allocate(8, Device::Cpu);
        auto winner = cache.insert(identity, mine);
        auto found = cache.find(identity);
        // While `winner` lives, every thread must see that same storage.
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
