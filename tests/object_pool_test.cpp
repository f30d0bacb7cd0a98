// The per-thread caches behind detail::PoolAllocator. This binary counts the blocks that
// operator new hands out, to see that a thread's cache is given back when the thread ends.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <set>
#include <thread>
#include <vector>

#include "ferry/detail/object_pool.hpp"

namespace {
std::atomic<long> g_live_blocks{0};
}  // namespace

void* operator new(std::size_t bytes) {
  void* memory = std::malloc(bytes == 0 ? 1 : bytes);
  if (memory == nullptr) throw std::bad_alloc();
  g_live_blocks.fetch_add(1, std::memory_order_relaxed);
  return memory;
}
void operator delete(void* memory) noexcept {
  if (memory == nullptr) return;
  g_live_blocks.fetch_sub(1, std::memory_order_relaxed);
  std::free(memory);
}
void operator delete(void* memory, std::size_t) noexcept { operator delete(memory); }

namespace ferry::detail {
namespace {

// Allocates `count` blocks of each size in `sizes`, writes them, frees them all.
void churn(std::size_t count, const std::vector<std::size_t>& sizes) {
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::size_t i = 0; i < count; ++i) {
    for (const std::size_t size : sizes) {
      void* block = pooled_allocate(size);
      std::memset(block, 0xab, size);
      blocks.emplace_back(block, size);
    }
  }
  for (const auto& [block, size] : blocks) pooled_free(block, size);
}

TEST(ObjectPoolTest, BlocksAreDistinctAlignedAndWritable) {
  std::vector<std::pair<void*, std::size_t>> blocks;
  std::set<std::uintptr_t> addresses;
  for (int round = 0; round < 3; ++round) {
    for (const std::size_t size : {std::size_t{1}, std::size_t{16}, std::size_t{17}, std::size_t{200},
                                   kPooledBytesLimit, kPooledBytesLimit + 1, std::size_t{4096}}) {
      void* block = pooled_allocate(size);
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(block) % 16, 0u);
      std::memset(block, round, size);
      EXPECT_TRUE(addresses.insert(reinterpret_cast<std::uintptr_t>(block)).second);
      blocks.emplace_back(block, size);
    }
  }
  for (const auto& [block, size] : blocks) pooled_free(block, size);
  pooled_free(nullptr, 16);  // a no-op, like operator delete
}

TEST(ObjectPoolTest, AThreadGivesItsCacheBackWhenItEnds) {
  const long before = g_live_blocks.load();
  std::thread worker([] { churn(3000, {24, 96, 128, 250, 1000}); });
  worker.join();
  EXPECT_EQ(g_live_blocks.load(), before);
}

TEST(ObjectPoolTest, BlocksFreedOnAnotherThreadAreNotLost) {
  std::vector<void*> blocks;
  for (int i = 0; i < 2000; ++i) blocks.push_back(pooled_allocate(112));
  const long before_free = g_live_blocks.load();
  std::thread worker([&blocks] {
    for (void* block : blocks) pooled_free(block, 112);
  });
  worker.join();
  // The freeing thread cached some blocks and gave them back when it ended; the rest went
  // back at once: nothing it received is still allocated.
  EXPECT_EQ(g_live_blocks.load(), before_free - 2000);
}

TEST(ObjectPoolTest, SharedPointersUseThePool) {
  struct Payload {
    std::int64_t values[6];
  };
  const long before = g_live_blocks.load();
  std::thread worker([] {
    std::vector<std::shared_ptr<Payload>> payloads;
    for (int i = 0; i < 500; ++i) payloads.push_back(std::allocate_shared<Payload>(PoolAllocator<Payload>()));
    std::shared_ptr<int> custom(
        new int(5), [](int* value) { delete value; }, PoolAllocator<int>());
    EXPECT_EQ(*custom, 5);
  });
  worker.join();
  EXPECT_EQ(g_live_blocks.load(), before);
}

}  // namespace
}  // namespace ferry::detail
