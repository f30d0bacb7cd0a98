// The caching shared-memory allocator in one process: size classes, reuse, statistics,
// the cache limit, zeroing, threads and fork.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ferry/detail/process_identity.hpp"
#include "ferry/detail/size_classes.hpp"
#include "ferry/detail/unique_fd.hpp"
#include "ferry/handle_cache.hpp"
#include "ferry/shared_allocator.hpp"
#include "ferry/storage.hpp"
#include "ferry/tensor.hpp"
#include "memory/prefetch_for_write.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"

namespace ferry {
namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

class SharedAllocatorTest : public test::LeakCheckedTest {};

TEST(SizeClassTest, SmallClassesRoundUpByAtMostAQuarter) {
  EXPECT_EQ(detail::small_size_class(1).bytes, 64u);
  EXPECT_EQ(detail::small_size_class(64).bytes, 64u);
  EXPECT_EQ(detail::small_size_class(65).bytes, 128u);
  EXPECT_EQ(detail::small_size_class(4096).bytes, 4096u);
  EXPECT_EQ(detail::small_size_class(4097).bytes, 5120u);
  EXPECT_EQ(detail::small_size_class(8192).bytes, 8192u);
  EXPECT_EQ(detail::small_size_class(8193).bytes, 10240u);
  std::uint32_t previous_index = 0;
  std::size_t previous_bytes = 0;
  for (std::size_t n = 1; n <= 300 * KiB; n += 37) {
    const detail::SizeClass size_class = detail::small_size_class(n);
    ASSERT_GE(size_class.bytes, n);
    ASSERT_EQ(size_class.bytes % detail::kBlockAlignment, 0u);
    if (n > 4096) {
      ASSERT_LE(size_class.bytes - n, size_class.bytes / 5 + 1) << n;
    }
    ASSERT_EQ(detail::small_class_bytes(size_class.index), size_class.bytes);
    // Indices grow with sizes, one per class.
    if (size_class.bytes != previous_bytes) {
      ASSERT_GE(size_class.index, previous_index);
      previous_index = size_class.index;
      previous_bytes = size_class.bytes;
    }
  }
}

TEST(SizeClassTest, LargeSegmentsRoundUpByAtMostAnEighth) {
  EXPECT_EQ(detail::small_block_limit(2 * MiB), 256 * KiB);
  EXPECT_EQ(detail::large_segment_bytes(64 * MiB), 64 * MiB);
  EXPECT_EQ(detail::large_segment_bytes(64 * MiB + 1), 72 * MiB);
  for (std::size_t n = 256 * KiB + 1; n < 512 * MiB; n = n * 3 / 2 + 4093) {
    const std::size_t bytes = detail::large_segment_bytes(n);
    ASSERT_GE(bytes, n);
    ASSERT_EQ(bytes % 4096, 0u);
    ASSERT_LE(bytes - n, n / 8 + 4096) << n;
  }
  EXPECT_THROW(detail::large_segment_bytes(0), Error);
}

TEST(ProcessIdentityTest, LivenessFollowsTheProcessNotItsPid) {
  const detail::ProcessIdentity self = detail::current_process();
  EXPECT_EQ(self.pid, ::getpid());
  EXPECT_GT(self.start_time, 0u);
  EXPECT_TRUE(detail::process_alive(self));
  EXPECT_FALSE(detail::process_alive(detail::ProcessIdentity{self.pid, self.start_time + 1}));  // a reused pid
  EXPECT_FALSE(detail::process_alive(detail::ProcessIdentity{0, 0}));

  int ends[2];
  ASSERT_EQ(::pipe(ends), 0);
  const detail::UniqueFd ready_read(ends[0]);
  const detail::UniqueFd ready_write(ends[1]);
  const pid_t child = test::fork_child([&] {
    const detail::ProcessIdentity me = detail::current_process();
    CHILD_CHECK(me.pid == ::getpid() && me.pid != self.pid);  // recomputed after fork
    CHILD_CHECK(::write(ready_write.get(), &me, sizeof me) == sizeof me);
  });
  detail::ProcessIdentity child_identity;
  ASSERT_EQ(::read(ready_read.get(), &child_identity, sizeof child_identity),
            static_cast<ssize_t>(sizeof child_identity));
  // Exited but not reaped yet (a zombie), or reaped: either way it no longer runs.
  while (detail::process_alive(child_identity)) std::this_thread::yield();
  EXPECT_TRUE(test::child_succeeded(child));
  EXPECT_FALSE(detail::process_alive(child_identity));
}

TEST(ProcessIdentityTest, AForkedChildKnowsItselfWhileAnotherThreadAskedAtTheFork) {
  // A receiver registers itself as a holder (current_process()) when it resolves its first
  // new block. A fork while another thread asked must not leave the child's registration
  // waiting for ever.
  std::atomic<bool> stop{false};
  std::thread asker([&] {
    while (!stop.load(std::memory_order_relaxed)) detail::current_process();
  });
  constexpr int kForks = 12;
  int hung = 0;
  for (int i = 0; i < kForks; ++i) {
    const pid_t child = test::fork_child([] { CHILD_CHECK(detail::current_process().pid == ::getpid()); });
    // A hung child never finishes; a slow one (ctest -j2 next to a build) may take more
    // than the 2 s this allowed before, which failed once under that load.
    const test::ChildExit exit = test::wait_child(child, std::chrono::seconds(5));
    if (!(exit.exited && exit.code == 0)) ++hung;
  }
  stop = true;
  asker.join();
  EXPECT_EQ(hung, 0) << hung << " of " << kForks << " children never learnt who they are";
}

TEST_F(SharedAllocatorTest, FreedSmallBlockComesBackForTheNextAllocation) {
  SharedAllocator pool;
  const void* first = nullptr;
  {
    auto block = pool.allocate(4000);
    first = block->data();
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(first) % detail::kBlockAlignment, 0u);
    EXPECT_EQ(block->size(), 4000u);
    EXPECT_TRUE(pool.owns(*block));
    EXPECT_FALSE(SharedAllocator::global().owns(*block));
  }
  auto again = pool.allocate(3000);  // same class (4 KiB)
  EXPECT_EQ(again->data(), first);
  const SharedMemoryStats stats = pool.stats();
  EXPECT_EQ(stats.misses, 1u);
  EXPECT_EQ(stats.hits, 1u);
  EXPECT_EQ(stats.segments, 1u);
}

TEST_F(SharedAllocatorTest, FreedLargeBlockComesBackWithItsSegment) {
  SharedAllocator pool;
  detail::FileIdentity identity;
  const void* address = nullptr;
  {
    auto block = pool.allocate(5 * MiB);
    identity = block->segment()->identity();
    address = block->data();
    EXPECT_EQ(block->offset(), 0u);
  }
  auto again = pool.allocate(5 * MiB - 100);  // same rounded size
  EXPECT_EQ(again->segment()->identity(), identity);
  EXPECT_EQ(again->data(), address);
  EXPECT_EQ(pool.stats().misses, 1u);
  EXPECT_EQ(pool.stats().hits, 1u);
}

TEST_F(SharedAllocatorTest, StatsCountSegmentsBytesHitsAndMisses) {
  SharedAllocator pool;
  EXPECT_EQ(pool.stats().segments, 0u);
  std::vector<std::shared_ptr<SharedBlock>> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(pool.allocate(1000));  // class 1 KiB, one slab
  blocks.push_back(pool.allocate(3 * MiB));                           // a segment of its own
  SharedMemoryStats stats = pool.stats();
  EXPECT_EQ(stats.segments, 2u);
  EXPECT_EQ(stats.segment_bytes, 2 * MiB + 3 * MiB);
  EXPECT_EQ(stats.blocks_in_use, 4u);
  EXPECT_EQ(stats.bytes_in_use, 3 * KiB + 3 * MiB);
  EXPECT_EQ(stats.bytes_cached, stats.segment_bytes - stats.bytes_in_use);
  EXPECT_EQ(stats.misses, 2u);
  EXPECT_EQ(stats.hits, 2u);  // the second and third 1 KiB blocks came from the slab
  blocks.clear();
  stats = pool.stats();
  EXPECT_EQ(stats.blocks_in_use, 0u);
  EXPECT_EQ(stats.bytes_in_use, 0u);
  EXPECT_EQ(stats.bytes_cached, 5 * MiB);  // under the default limit: kept for reuse
  EXPECT_EQ(stats.segments_released, 0u);
}

TEST_F(SharedAllocatorTest, StatsTellMissesAfterAReleaseFromColdOnes) {
  SharedAllocatorSettings settings;
  settings.max_cached_bytes = 0;  // every idle segment goes back to the kernel at once
  SharedAllocator pool(settings);
  pool.allocate(1 * MiB).reset();        // cold: the first of its size; released when freed
  auto again = pool.allocate(1 * MiB);   // its segment was given back: a miss after a release
  auto second = pool.allocate(1 * MiB);  // one more in use than ever before: cold
  pool.allocate(1000).reset();           // a small size class, first time: cold
  SharedMemoryStats stats = pool.stats();
  EXPECT_EQ(stats.misses, 4u);
  EXPECT_EQ(stats.misses_after_release, 1u);
  EXPECT_EQ(stats.misses_cold, 3u);
  again.reset();
  second.reset();
  pool.allocate(1000).reset();  // its slab was released by the limit
  pool.configure(SharedAllocatorSettings{settings.segment_bytes, 8 * MiB});
  auto kept = pool.allocate(1 * MiB);  // released earlier (twice): after a release
  kept.reset();
  auto hit = pool.allocate(1 * MiB);  // kept under the new limit: a hit, no miss
  stats = pool.stats();
  EXPECT_EQ(stats.misses, 6u);
  EXPECT_EQ(stats.misses_after_release, 3u);
  EXPECT_EQ(stats.misses_cold, 3u);
  EXPECT_EQ(stats.hits, 1u);
}

TEST_F(SharedAllocatorTest, TheDefaultCacheLimitIsAShareOfTheMachinesMemory) {
  const std::size_t physical =
      static_cast<std::size_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t limit = SharedAllocatorSettings{}.max_cached_bytes;
  EXPECT_EQ(limit, default_max_cached_bytes());
  EXPECT_GE(limit, 256 * MiB);
  EXPECT_LE(limit, std::max(256 * MiB, physical / 4));
  if (physical < 8 * 1024 * MiB) GTEST_SKIP() << "needs 8 GiB of memory to check a steady pipeline of 512 MiB blocks";
  // A steady pipeline of two 512 MiB blocks in flight keeps its segments with the default.
  SharedAllocator pool;
  for (int step = 0; step < 3; ++step) {
    auto a = pool.allocate(512 * MiB);
    auto b = pool.allocate(512 * MiB);
  }
  EXPECT_EQ(pool.stats().misses, 2u);
  EXPECT_EQ(pool.stats().segments_released, 0u);
}

TEST_F(SharedAllocatorTest, IdleSegmentsAreReleasedOverTheCacheLimitAndByTrim) {
  SharedAllocatorSettings settings;
  settings.max_cached_bytes = 2 * MiB;
  SharedAllocator pool(settings);
  std::vector<std::shared_ptr<SharedBlock>> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(pool.allocate(1 * MiB));
  EXPECT_EQ(pool.stats().segments, 4u);
  blocks.clear();
  // Two idle 1 MiB segments fit under the limit; the two used least recently went.
  EXPECT_EQ(pool.stats().segments, 2u);
  EXPECT_EQ(pool.stats().segments_released, 2u);
  // A lower limit releases idle segments at once.
  pool.configure(SharedAllocatorSettings{settings.segment_bytes, 1 * MiB});
  EXPECT_EQ(pool.stats().segments, 1u);
  EXPECT_EQ(pool.stats().segments_released, 3u);
  pool.trim();
  EXPECT_EQ(pool.stats().segments, 0u);
  EXPECT_EQ(pool.stats().bytes_cached, 0u);

  // With no cache at all, a segment goes as soon as its last block does, but not before.
  pool.configure(SharedAllocatorSettings{settings.segment_bytes, 0});
  auto a = pool.allocate(100);
  auto b = pool.allocate(100);
  a.reset();
  EXPECT_EQ(pool.stats().segments, 1u);
  b.reset();
  EXPECT_EQ(pool.stats().segments, 0u);
}

TEST_F(SharedAllocatorTest, SegmentsHoldTheirFdsOnlyWhileMapped) {
  const std::size_t fds_before = test::count_open_fds();
  SharedAllocator pool;
  {
    auto a = pool.allocate(10);
    auto b = pool.allocate(10 * MiB);
    EXPECT_EQ(test::count_open_fds(), fds_before + 2);
  }
  EXPECT_EQ(test::count_open_fds(), fds_before + 2);  // cached
  pool.trim();
  EXPECT_EQ(test::count_open_fds(), fds_before);
}

TEST_F(SharedAllocatorTest, BlocksOutliveTheirPoolsHandlesAndTakeItWithTheLastOne) {
  const std::size_t fds_before = test::count_open_fds();
  std::shared_ptr<SharedBlock> small;
  std::shared_ptr<SharedBlock> large;
  {
    SharedAllocator pool;
    const SharedAllocator copy = pool;  // NOLINT(performance-unnecessary-copy-initialization): a second handle
    small = pool.allocate(100);
    large = copy.allocate(3 * MiB);
    auto freed = pool.allocate(100);  // back in the pool before the handles go
  }
  // The handles are gone; the blocks still work and keep their segments mapped.
  std::memset(small->data(), 1, small->size());
  std::memset(large->data(), 2, large->size());
  EXPECT_EQ(test::count_open_fds(), fds_before + 2);
  small.reset();
  EXPECT_EQ(test::count_open_fds(), fds_before + 2);  // the pool lives on with its large block
  large.reset();
  // The last block took the pool, and the pool its segments (ASan: nothing leaks).
  EXPECT_EQ(test::count_open_fds(), fds_before);
}

TEST_F(SharedAllocatorTest, AReleaseBatchGivesItsBlocksBackWhenItEnds) {
  SharedAllocator pool;
  SharedAllocator other;
  std::vector<std::shared_ptr<SharedBlock>> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(pool.allocate(4096));
  const void* freed_last = blocks.back()->data();
  {
    const SharedAllocator::ReleaseBatch batch;
    {
      const SharedAllocator::ReleaseBatch inner;  // joins the outer batch
      blocks.resize(2);
    }
    EXPECT_EQ(pool.stats().blocks_in_use, 6u);  // gathered, not given back yet
  }
  EXPECT_EQ(pool.stats().blocks_in_use, 2u);
  EXPECT_EQ(pool.allocate(4096)->data(), freed_last);  // back in the free list, reused first

  // More blocks than a batch holds, of two pools: all come back to their own pool.
  for (int i = 0; i < 300; ++i) blocks.push_back((i % 3 == 0 ? other : pool).allocate(1000 + i));
  {
    const SharedAllocator::ReleaseBatch batch;
    blocks.clear();
  }
  EXPECT_EQ(pool.stats().blocks_in_use, 0u);
  EXPECT_EQ(other.stats().blocks_in_use, 0u);
  EXPECT_EQ(pool.stats().bytes_in_use, 0u);
}

TEST_F(SharedAllocatorTest, AReleaseBatchTakesAPoolWithoutHandlesWithItsLastBlocks) {
  const std::size_t fds_before = test::count_open_fds();
  std::vector<std::shared_ptr<SharedBlock>> blocks;
  {
    SharedAllocator pool;
    for (int i = 0; i < 3; ++i) blocks.push_back(pool.allocate(100));
    blocks.push_back(pool.allocate(3 * MiB));
  }
  {
    const SharedAllocator::ReleaseBatch batch;
    blocks.clear();
    EXPECT_EQ(test::count_open_fds(), fds_before + 2);  // the pool waits for the batch
  }
  // The batch gave the last blocks back and the pool went with its segments (ASan: no leak).
  EXPECT_EQ(test::count_open_fds(), fds_before);
}

TEST_F(SharedAllocatorTest, ZerosClearsARecycledBlock) {
  SharedAllocator pool;
  const void* address = nullptr;
  {
    Tensor dirty = Tensor::empty({1024}, DType::Int32, pool);
    dirty.fill(std::int32_t{7});
    address = dirty.data_ptr();
  }
  Tensor clean = Tensor::zeros({1024}, DType::Int32, pool);
  ASSERT_EQ(clean.data_ptr(), address);                                            // the same block ...
  for (std::int32_t value : clean.to_vector<std::int32_t>()) ASSERT_EQ(value, 0);  // ... cleared
  EXPECT_TRUE(clean.is_shared());
  EXPECT_EQ(clean.device(), Device::SharedCpu);
}

// Recycled blocks are prefetched for their writers as they are carved, each with the one
// two allocations later (prefetch_for_write, PREFETCHW where CPUID says so): a hint that
// must leave what the blocks hold as it was.
TEST_F(SharedAllocatorTest, RecycledBlocksKeepTheirBytesWhenHandedOutAgain) {
  SharedAllocator pool;
  std::set<const void*> addresses;
  {
    std::vector<Tensor> first;
    for (std::int32_t i = 0; i < 6; ++i) {
      first.push_back(Tensor::empty({1024}, DType::Int32, pool));
      first.back().fill(i);
      addresses.insert(first.back().data_ptr());
    }
  }
  std::set<std::int32_t> seen;
  std::vector<Tensor> again;  // kept, so that each comes from the free list
  for (int i = 0; i < 6; ++i) {
    again.push_back(Tensor::empty({1024}, DType::Int32, pool));
    ASSERT_TRUE(addresses.count(again.back().data_ptr()));  // a block of the free list ...
    const std::vector<std::int32_t> values = again.back().to_vector<std::int32_t>();
    ASSERT_TRUE(std::all_of(values.begin(), values.end(), [&](std::int32_t v) { return v == values[0]; }));
    seen.insert(values[0]);  // ... holding what it held
  }
  EXPECT_EQ(seen, (std::set<std::int32_t>{0, 1, 2, 3, 4, 5}));
}

#if defined(__x86_64__) || defined(__i386__)
TEST(PrefetchForWriteTest, UsesPrefetchwExactlyWhereTheCpuHasIt) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  bool listed = false;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      listed = (line + " ").find(" 3dnowprefetch ") != std::string::npos;
      break;
    }
  }
  EXPECT_EQ(detail::kHasPrefetchW, listed) << "CPUID and /proc/cpuinfo disagree on PREFETCHW";
  int value = 5;
  detail::prefetch_for_write(&value);
  EXPECT_EQ(value, 5);
}
#endif

TEST_F(SharedAllocatorTest, DeviceSharedCpuAllocatesFromTheGlobalPool) {
  const SharedMemoryStats before = shared_memory_stats();
  Tensor t = Tensor::empty({100}, DType::Float32, Device::SharedCpu);
  const SharedMemoryStats after = shared_memory_stats();
  EXPECT_TRUE(SharedAllocator::global().owns(*t.storage()->shared_block()));
  EXPECT_EQ(after.blocks_in_use, before.blocks_in_use + 1);
  Tensor heap = Tensor::from({1.0f, 2.0f});
  heap.share_memory();
  EXPECT_TRUE(SharedAllocator::global().owns(*heap.storage()->shared_block()));
  EXPECT_EQ(heap.to_vector<float>(), (std::vector<float>{1.0f, 2.0f}));
}

// The process-wide pool's free functions: configure_shared_memory() sets its limits (a
// lower cache limit releases idle segments at once), shared_memory_stats() reports it and
// release_cached_shared_memory() gives every idle segment back.
TEST_F(SharedAllocatorTest, TheProcessWidePoolIsConfiguredReportedAndTrimmed) {
  const SharedAllocatorSettings original = SharedAllocator::global().settings();
  configure_shared_memory(SharedAllocatorSettings{original.segment_bytes, 2 * MiB});
  EXPECT_EQ(SharedAllocator::global().settings().max_cached_bytes, 2 * MiB);
  const SharedMemoryStats before = shared_memory_stats();
  {
    Tensor a = Tensor::empty({256 * 1024}, DType::UInt8, Device::SharedCpu);  // an eighth: a slab block
    Tensor b = Tensor::empty({1 << 20}, DType::UInt8, Device::SharedCpu);     // a segment of its own
    EXPECT_EQ(shared_memory_stats().blocks_in_use, before.blocks_in_use + 2);
  }
  SharedMemoryStats idle = shared_memory_stats();
  EXPECT_EQ(idle.blocks_in_use, before.blocks_in_use);
  EXPECT_GE(idle.bytes_cached, 1 * MiB);
  configure_shared_memory(SharedAllocatorSettings{original.segment_bytes, 0});
  idle = shared_memory_stats();
  EXPECT_EQ(idle.bytes_cached, 0u);
  EXPECT_GT(idle.segments_released, before.segments_released);
  configure_shared_memory(original);
  { Tensor c = Tensor::empty({1 << 20}, DType::UInt8, Device::SharedCpu); }
  EXPECT_GE(shared_memory_stats().bytes_cached, 1 * MiB);
  release_cached_shared_memory();
  EXPECT_EQ(shared_memory_stats().segments, 0u);
  EXPECT_EQ(shared_memory_stats().bytes_cached, 0u);
}

// A storage is told whether its allocation is a shared block (no virtual call per storage):
// every way of making one must still say so, and share_memory() must still move a heap
// storage into the pool it is given.
TEST_F(SharedAllocatorTest, AStorageKnowsWhetherItsAllocationIsShared) {
  SharedAllocator pool;
  const auto shared = Storage::allocate(64, pool);
  EXPECT_TRUE(shared->is_shared());
  EXPECT_TRUE(Storage::allocate(64, Device::SharedCpu)->is_shared());
  const auto empty = Storage::allocate(0, pool);
  EXPECT_FALSE(empty->is_shared());  // no bytes, no block
  EXPECT_EQ(empty->device(), Device::SharedCpu);
  const auto heap = Storage::allocate(64, Device::Cpu);
  EXPECT_FALSE(heap->is_shared());
  EXPECT_TRUE(Storage::adopt(shared->shared_allocation())->is_shared());
  EXPECT_FALSE(Storage::adopt(heap->shared_allocation())->is_shared());
  EXPECT_FALSE(Storage::adopt(nullptr)->is_shared());

  std::memset(heap->data(), 5, 64);
  heap->share_memory(pool);
  EXPECT_TRUE(heap->is_shared());
  ASSERT_NE(heap->shared_block(), nullptr);
  EXPECT_TRUE(pool.owns(*heap->shared_block()));
  EXPECT_EQ(static_cast<int>(heap->data()[63]), 5);
  const std::byte* moved = heap->data();
  heap->share_memory();  // already shared: stays in `pool`
  EXPECT_EQ(heap->data(), moved);
}

TEST_F(SharedAllocatorTest, InvalidSettingsAndSizesAreRejected) {
  EXPECT_THROW(SharedAllocator(SharedAllocatorSettings{1000, 0}), Error);
  EXPECT_THROW(SharedAllocator(SharedAllocatorSettings{32 * KiB, 0}), Error);
  // 256 GiB of 64-byte blocks would be 2^32 blocks: a segment's 32-bit block count would wrap to 0.
  EXPECT_THROW(SharedAllocator(SharedAllocatorSettings{std::size_t{256} << 30, 0}), Error);
  EXPECT_THROW(SharedAllocator(SharedAllocatorSettings{(std::size_t{64} << 30) + 4096, 0}), Error);
  SharedAllocator pool;
  EXPECT_THROW(pool.allocate(0), Error);
  EXPECT_THROW(pool.configure(SharedAllocatorSettings{4097 * 16, 0}), Error);
}

TEST_F(SharedAllocatorTest, ManyThreadsAllocateAndFreeConcurrently) {
  SharedAllocatorSettings settings;
  settings.max_cached_bytes = 4 * MiB;  // makes threads release segments while others carve
  SharedAllocator pool(settings);
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  std::vector<std::thread> threads;
  std::atomic<int> corrupted{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(static_cast<unsigned>(t));
      std::vector<std::shared_ptr<SharedBlock>> held;
      for (int round = 0; round < kRounds; ++round) {
        const std::size_t sizes[] = {64, 1000, 4096, 20000, 300 * KiB, 1 * MiB};
        const std::size_t size = sizes[random() % std::size(sizes)];
        const SharedAllocator source = pool;  // handles are copies of one pool
        auto block = source.allocate(size);
        // Each thread stamps its blocks' first and last bytes (what the checks read; a whole
        // memset made this test take 14 s under ThreadSanitizer): a block handed to two
        // owners would be overwritten.
        auto* stamped = reinterpret_cast<unsigned char*>(block->data());
        stamped[0] = static_cast<unsigned char>(t + 1);
        stamped[size - 1] = static_cast<unsigned char>(t + 1);
        held.push_back(std::move(block));
        if (held.size() > 8 || random() % 2 == 0) {
          const std::size_t victim = random() % held.size();
          const auto* bytes = reinterpret_cast<const unsigned char*>(held[victim]->data());
          if (bytes[0] != t + 1 || bytes[held[victim]->size() - 1] != t + 1) ++corrupted;
          held.erase(held.begin() + static_cast<std::ptrdiff_t>(victim));
        }
      }
      for (const auto& block : held) {
        const auto* bytes = reinterpret_cast<const unsigned char*>(block->data());
        if (bytes[0] != t + 1 || bytes[block->size() - 1] != t + 1) ++corrupted;
      }
    });
  }
  // The global pool, from other threads at the same time.
  std::thread global_user([] {
    for (int i = 0; i < kRounds; ++i) Tensor::empty({i % 500 + 1}, DType::Float64, Device::SharedCpu);
  });
  for (auto& thread : threads) thread.join();
  global_user.join();
  EXPECT_EQ(corrupted.load(), 0);
  const SharedMemoryStats stats = pool.stats();
  EXPECT_EQ(stats.blocks_in_use, 0u);
  EXPECT_EQ(stats.bytes_in_use, 0u);
  EXPECT_EQ(stats.hits + stats.misses, std::uint64_t{kThreads} * kRounds);
  pool.trim();
  EXPECT_EQ(pool.stats().segments, 0u);
}

TEST_F(SharedAllocatorTest, AForkedChildNeverCarvesTheParentsSegments) {
  SharedAllocator pool;
  auto parent_block = pool.allocate(4096);
  std::memset(parent_block->data(), 1, 4096);
  const detail::FileIdentity parent_segment = parent_block->segment()->identity();
  { auto freed = pool.allocate(4096); }  // a free block sits in the parent's slab
  const pid_t child = test::fork_child([&] {
    auto child_block = pool.allocate(4096);
    CHILD_CHECK(child_block->segment()->identity() != parent_segment);  // a segment of its own
    CHILD_CHECK(pool.stats().misses == 1 && pool.stats().segments == 1);
    std::memset(child_block->data(), 2, 4096);
    parent_block.reset();  // the parent's block, inherited: nothing goes back to a free list
    CHILD_CHECK(pool.stats().blocks_in_use == 1);
  });
  ASSERT_TRUE(test::child_succeeded(child));
  const auto* bytes = reinterpret_cast<const unsigned char*>(parent_block->data());
  EXPECT_EQ(bytes[0], 1);
  EXPECT_EQ(pool.stats().blocks_in_use, 1u);
  EXPECT_EQ(pool.stats().segments, 1u);
}

TEST_F(SharedAllocatorTest, AForkedChildCreatesSegmentsWhileAnotherThreadUsedTheHandleCache) {
  // Every new segment is recorded in the process's handle cache, and every received one is
  // looked up there, under its lock. A fork while another thread held that lock (a
  // receiving thread, say) must not leave the child's first new segment waiting for ever;
  // neither must a fork while that thread was still making the cache (its first use): the
  // child then waited on the static's initialization guard (1 of 12 children, run after run).
  const auto probe = detail::SharedSegment::create(4096, nullptr);
  std::atomic<bool> stop{false};
  std::thread receiver_like([&] {
    while (!stop.load(std::memory_order_relaxed)) HandleCache::global().find(probe->identity());
  });
  constexpr int kForks = 12;  // about half of them hung
  int hung = 0;
  for (int i = 0; i < kForks; ++i) {
    const pid_t child = test::fork_child([] {
      const SharedAllocator pool;  // a new pool: its first block needs a new segment
      auto block = pool.allocate(64 * KiB);
      CHILD_CHECK(block != nullptr);
    });
    // A hung child never finishes; a slow one (ctest -j2 next to a build) may take more
    // than the 2 s this allowed before, which failed once under that load.
    const test::ChildExit exit = test::wait_child(child, std::chrono::seconds(5));
    if (!(exit.exited && exit.code == 0)) ++hung;
  }
  stop = true;
  receiver_like.join();
  EXPECT_EQ(hung, 0) << hung << " of " << kForks << " children never finished their first allocation";
}

}  // namespace
}  // namespace ferry
