#include "ferry/detail/cuda/block_pool.hpp"

#include <algorithm>
#include <atomic>
#include <limits>
#include <string>

namespace ferry::cuda {
namespace {

constexpr int kCudaErrorMemoryAllocation = 2;  // cudaErrorMemoryAllocation

std::size_t round_up(std::size_t value, std::size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

std::string mib(std::size_t bytes) {
  return std::to_string(bytes >> 20) + "." + std::to_string(((bytes & ((1u << 20) - 1)) * 10) >> 20) + " MiB";
}

}  // namespace

std::uint64_t next_block_id() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// ---- CudaAllocation ------------------------------------------------------------------

CudaAllocation::~CudaAllocation() { pool_.release(block_, offset_, reserved_, std::move(holds_)); }

Device CudaAllocation::device() const noexcept { return Device::Cuda(pool_.device()); }

std::pair<std::shared_ptr<HoldCounterBoard>, std::uint32_t> CudaAllocation::hold_for(HoldCounterBoardSet& boards) {
  std::lock_guard lock(mutex_);
  for (const ConsumerHold& hold : holds_) {
    if (boards.owns(*hold.board())) return {hold.board(), hold.counter()};
  }
  holds_.push_back(boards.acquire());
  return {holds_.back().board(), holds_.back().counter()};
}

std::size_t CudaAllocation::hold_count() const {
  std::lock_guard lock(mutex_);
  return holds_.size();
}

// ---- BlockPool -----------------------------------------------------------------------

BlockPool::BlockPool(std::unique_ptr<BlockSource> source, int device) : source_(std::move(source)), device_(device) {}

BlockPool::~BlockPool() {
  // Only pools made by tests die; the device pools live as long as the process.
  for (const auto& block : blocks_) source_->release(block->base, block->bytes);
}

std::shared_ptr<Allocation> BlockPool::allocate(std::size_t bytes) {
  if (bytes == 0) return std::make_shared<EmptyCudaAllocation>(device_);
  std::lock_guard lock(mutex_);
  if (bytes > std::numeric_limits<std::size_t>::max() - kLargeRounding) throw_out_of_memory_locked(bytes, bytes);
  const std::size_t rounded = round_up(bytes, kRounding);
  if (auto allocation = carve_locked(bytes, rounded)) return allocation;
  // Running short: first take back what receivers have let go of.
  if (!limbo_.empty() && collect_locked() > 0) {
    if (auto allocation = carve_locked(bytes, rounded)) return allocation;
  }
  const bool small = rounded <= kSmallRequest;
  const std::size_t block_bytes = small                       ? kSmallBlock
                                  : rounded <= kMediumRequest ? kMediumBlock
                                                              : round_up(rounded, kLargeRounding);
  void* base = source_->allocate(block_bytes);
  if (base == nullptr && empty_cache_locked() > 0) base = source_->allocate(block_bytes);
  if (base == nullptr) throw_out_of_memory_locked(bytes, block_bytes);
  auto block = std::make_unique<Block>();
  block->base = static_cast<std::byte*>(base);
  block->bytes = block_bytes;
  block->id = next_block_id();
  block->small = small;
  block->free_ranges.emplace(0, block_bytes);
  blocks_.push_back(std::move(block));
  return carve_locked(bytes, rounded);
}

std::shared_ptr<Allocation> BlockPool::carve_locked(std::size_t bytes, std::size_t rounded) {
  const bool small = rounded <= kSmallRequest;
  Block* best_block = nullptr;
  std::size_t best_offset = 0;
  std::size_t best_size = std::numeric_limits<std::size_t>::max();
  for (const auto& block : blocks_) {
    if (block->small != small) continue;
    for (const auto& [offset, size] : block->free_ranges) {
      if (size >= rounded && size < best_size) {
        best_block = block.get();
        best_offset = offset;
        best_size = size;
      }
    }
  }
  if (best_block == nullptr) return nullptr;
  best_block->free_ranges.erase(best_offset);
  if (best_size > rounded) best_block->free_ranges.emplace(best_offset + rounded, best_size - rounded);
  best_block->used += rounded;
  allocated_bytes_ += rounded;
  return std::make_shared<CudaAllocation>(*this, *best_block, best_offset, bytes, rounded);
}

void BlockPool::release(Block& block, std::size_t offset, std::size_t bytes, std::vector<ConsumerHold> holds) noexcept {
  std::lock_guard lock(mutex_);
  allocated_bytes_ -= bytes;
  bool held = false;
  for (const ConsumerHold& hold : holds) {
    try {
      held = held || !hold.released();
    } catch (...) {
      held = true;  // could not tell: keep the memory rather than risk handing it out
    }
  }
  if (held) {
    try {
      limbo_.push_back(LimboEntry{&block, offset, bytes, std::move(holds)});
      limbo_bytes_ += bytes;
    } catch (...) {
      // Out of host memory: the range stays used (leaked) instead of being reused too early.
    }
  } else {
    free_range_locked(block, offset, bytes);
  }
  // A collect step on every free: ranges whose receivers have let go come back.
  if (!limbo_.empty()) {
    try {
      collect_locked();
    } catch (...) {
      // A later free or collect() tries again.
    }
  }
}

std::size_t BlockPool::collect() {
  std::lock_guard lock(mutex_);
  return collect_locked();
}

std::size_t BlockPool::collect_locked() {
  std::size_t freed = 0;
  std::erase_if(limbo_, [&](const LimboEntry& entry) {
    const bool released =
        std::all_of(entry.holds.begin(), entry.holds.end(), [](const ConsumerHold& hold) { return hold.released(); });
    if (!released) return false;
    free_range_locked(*entry.block, entry.offset, entry.bytes);
    limbo_bytes_ -= entry.bytes;
    freed += entry.bytes;
    return true;  // erasing destroys the holds, which gives their counters back
  });
  return freed;
}

std::size_t BlockPool::empty_cache() {
  std::lock_guard lock(mutex_);
  return empty_cache_locked();
}

std::size_t BlockPool::empty_cache_locked() {
  collect_locked();
  std::size_t released = 0;
  std::erase_if(blocks_, [&](const std::unique_ptr<Block>& block) {
    if (block->used != 0) return false;
    source_->release(block->base, block->bytes);
    released += block->bytes;
    return true;
  });
  return released;
}

void BlockPool::free_range_locked(Block& block, std::size_t offset, std::size_t bytes) {
  block.used -= bytes;
  auto [it, inserted] = block.free_ranges.emplace(offset, bytes);
  // Merge with the following free range, then with the preceding one.
  if (auto next = std::next(it); next != block.free_ranges.end() && it->first + it->second == next->first) {
    it->second += next->second;
    block.free_ranges.erase(next);
  }
  if (it != block.free_ranges.begin()) {
    auto previous = std::prev(it);
    if (previous->first + previous->second == it->first) {
      previous->second += it->second;
      block.free_ranges.erase(it);
    }
  }
}

CudaMemoryStats BlockPool::stats() const {
  std::lock_guard lock(mutex_);
  CudaMemoryStats stats;
  for (const auto& block : blocks_) stats.reserved_bytes += block->bytes;
  stats.allocated_bytes = allocated_bytes_;
  stats.limbo_bytes = limbo_bytes_;
  stats.limbo_ranges = limbo_.size();
  stats.blocks = blocks_.size();
  return stats;
}

void BlockPool::throw_out_of_memory_locked(std::size_t requested, std::size_t block_bytes) {
  std::size_t reserved = 0;
  for (const auto& block : blocks_) reserved += block->bytes;
  throw CudaError("out of memory on cuda:" + std::to_string(device_) + ": cannot allocate " +
                      std::to_string(requested) + " bytes (a new block of " + mib(block_bytes) +
                      "). ferry's allocator there holds " + mib(reserved) + ": " + mib(allocated_bytes_) +
                      " in live storages and " + mib(limbo_bytes_) +
                      " in storages this process dropped but other processes still hold (they come back when those "
                      "drop the tensors they received). Free tensors, or allocate less",
                  kCudaErrorMemoryAllocation);
}

}  // namespace ferry::cuda
