// The caching allocator behind Device::SharedCpu: storages are blocks carved from larger
// sealed memfd segments, and freed blocks are kept for reuse instead of being returned to
// the kernel, so a pipeline that allocates a new tensor every step stops creating segments
// and faulting pages after warm-up.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "ferry/allocation.hpp"

namespace ferry {

/// The default cache limit: a quarter of the memory this process may use (the machine's
/// physical memory, or its cgroup's memory.max when that is lower), and at least 256 MiB, so
/// that a steady pipeline of large tensors keeps its blocks instead of giving them back to
/// the kernel every step. Read once per process.
std::size_t default_max_cached_bytes() noexcept;

/// Limits of a caching shared-memory allocator.
struct SharedAllocatorSettings {
  /// Size of the segments that small blocks (up to an eighth of it; see
  /// small_block_limit()) are carved from. A multiple of 4096, 64 KiB to 64 GiB. Larger
  /// requests get a segment of their own, rounded up by at most an eighth.
  std::size_t segment_bytes = std::size_t{2} << 20;
  /// Bytes of free blocks the allocator keeps mapped for reuse. When a block is freed and
  /// the free bytes exceed this, segments without any block in use are released, least
  /// recently used first. 0 releases every idle segment at once.
  std::size_t max_cached_bytes = default_max_cached_bytes();
};

/// What an allocator holds, from its point of view.
struct SharedMemoryStats {
  std::size_t segments = 0;       ///< segments mapped now
  std::size_t segment_bytes = 0;  ///< their total size
  std::size_t bytes_in_use = 0;   ///< size of the blocks in use (by this process or a receiver)
  std::size_t bytes_cached = 0;   ///< segment_bytes - bytes_in_use: free, kept for reuse
  std::size_t blocks_in_use = 0;  ///< blocks in use
  std::uint64_t hits = 0;         ///< allocations that needed no new segment (a freed or a never used block)
  std::uint64_t misses = 0;       ///< allocations that had to create a segment (reuse: this stays flat)
  /// Misses whose size had a segment before, which the cache limit or trim() gave back to
  /// the kernel: a steady pipeline that shows these wants a higher max_cached_bytes.
  std::uint64_t misses_after_release = 0;
  /// The other misses: the first allocations of a size, or more blocks of it in use at
  /// once than ever before (misses = misses_cold + misses_after_release).
  std::uint64_t misses_cold = 0;
  std::uint64_t segments_released = 0;  ///< segments given back to the kernel so far
};

/// A caching allocator of shared memory (a pool). The handle is cheap to copy; copies
/// share the pool, which lives as long as a handle or a block of it does.
///
/// A block is never recycled while anyone may read it: its owner's storage holds it, and a
/// channel that passed it keeps it pinned until the receiver gives it back (see
/// docs/design/allocator.md). Thread-safe. After fork(), the child starts with an
/// empty pool: segments inherited from the parent are never carved again in the child.
class SharedAllocator {
 public:
  /// A new, private pool (for isolation between peers: see ChannelOptions::pool).
  explicit SharedAllocator(const SharedAllocatorSettings& settings = {});
  /// The process-wide pool that Device::SharedCpu allocations come from.
  static const SharedAllocator& global();

  /// A block of at least `nbytes` (> 0) bytes, 64-byte aligned. With `zeroed`, its bytes
  /// are zero (fresh memory is zero already; a recycled block is cleared). Throws
  /// OutOfSharedMemory when no memory can be reserved, Error for a size of 0.
  std::shared_ptr<SharedBlock> allocate(std::size_t nbytes, bool zeroed = false) const;

  /// What the pool holds now.
  SharedMemoryStats stats() const;
  SharedAllocatorSettings settings() const;
  /// Changes the limits. A new segment size applies to segments created from now on; a
  /// lower cache limit releases idle segments at once. Throws Error for invalid settings.
  void configure(const SharedAllocatorSettings& settings) const;
  /// Collects blocks that receivers gave back (or that dead receivers held), then releases
  /// every segment without a block in use, whatever the cache limit.
  void trim() const;
  /// True when `block` was carved by this pool.
  bool owns(const SharedBlock& block) const noexcept;

  friend bool operator==(const SharedAllocator& a, const SharedAllocator& b) noexcept { return a.core_ == b.core_; }

  class Core;  // the pool's state; defined in shared_allocator.cpp
  class ReleaseBatch;

 private:
  explicit SharedAllocator(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  std::shared_ptr<Core> core_;
};

/// While one lives on a thread, blocks of any pool that die on that thread are given back
/// to their pools when it ends (or each time it has gathered kCapacity), under one lock per
/// pool instead of one per block: for code that frees many blocks at once, such as a
/// channel collecting what a receiver gave back. Only the outermost batch of a thread
/// gathers; inner ones change nothing. A gathered block counts as in use until given back.
class SharedAllocator::ReleaseBatch {
 public:
  ReleaseBatch() noexcept;
  ~ReleaseBatch();
  ReleaseBatch(const ReleaseBatch&) = delete;
  ReleaseBatch& operator=(const ReleaseBatch&) = delete;

  /// A dead block: its pool, its segment (the pool's record), index and fork generation.
  /// No member initializers: a batch's array of them stays uninitialized (4 KiB not zeroed
  /// per batch); only gathered entries are read.
  struct Pending {
    Core* core;
    void* segment;
    std::uint64_t generation;
    std::uint32_t index;
  };
  /// Gathers a dead block into the thread's open batch; false when none is open (the
  /// caller gives the block back at once). Inline: every block that dies asks.
  static bool gather(const Pending& block) noexcept {
    ReleaseBatch* batch = current_;
    if (batch == nullptr) return false;
    if (batch->count_ == kCapacity) [[unlikely]]
      batch->flush();
    batch->pending_[batch->count_++] = block;
    return true;
  }

 private:
  static constexpr std::size_t kCapacity = 128;
  static constinit inline thread_local ReleaseBatch* current_ = nullptr;  // the thread's outermost open one
  void flush() noexcept;
  bool outermost_;
  std::size_t count_ = 0;
  std::array<Pending, kCapacity> pending_;
};

/// Statistics of this process's process-wide pool (SharedAllocator::global()): what this
/// process allocated, not the segments it maps from its senders, so ask in the allocating
/// process.
SharedMemoryStats shared_memory_stats();
/// Changes the limits of the process-wide pool.
void configure_shared_memory(const SharedAllocatorSettings& settings);
/// Trims the process-wide pool: gives every idle segment back to the kernel.
void release_cached_shared_memory();

}  // namespace ferry
