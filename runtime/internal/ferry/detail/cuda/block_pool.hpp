// ferry's caching device allocator: storages are ranges inside larger blocks obtained from
// a BlockSource (cudaMalloc for a device), so a storage is (block base, offset, size), and a
// dropped storage that another process still holds waits in a limbo instead of being reused.
// Plain host code (the source does the CUDA calls), built in every build and tested on the
// CPU with host memory.
//
// Sizes (as torch's caching allocator): requests are rounded up to 512 bytes; up to 1 MiB
// they share 2 MiB blocks, up to 10 MiB 20 MiB blocks, larger ones get a block of their size
// rounded up to 2 MiB. Small requests are served only from 2 MiB blocks, so one small tensor
// never pins a large block. Within a pool, the smallest free range that fits is used, and
// freed ranges merge with free neighbours. Blocks go back to the source only through
// empty_cache() (also tried once when the source runs out of memory).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "ferry/cuda.hpp"
#include "ferry/detail/cuda/hold_counter_board.hpp"
#include "ferry/storage.hpp"

namespace ferry::cuda {

/// Where a BlockPool gets its blocks: cudaMalloc/cudaFree on one device, or host memory in
/// tests.
class BlockSource {
 public:
  virtual ~BlockSource() = default;
  /// A new block of `bytes`, or nullptr when the device is out of memory (other failures throw).
  virtual void* allocate(std::size_t bytes) = 0;
  /// Returns a block obtained from allocate().
  virtual void release(void* base, std::size_t bytes) noexcept = 0;
};

/// One block obtained from a BlockSource.
struct Block {
  std::byte* base = nullptr;
  std::size_t bytes = 0;
  std::uint64_t id = 0;  ///< unique in this process, never reused (names the block on the wire)
  bool small = false;    ///< serves requests of up to 1 MiB only
  // Guarded by the pool's mutex:
  std::map<std::size_t, std::size_t> free_ranges;  ///< offset -> size
  std::size_t used = 0;                            ///< bytes in live or limbo ranges
  // The IPC handle of the block, made once (see ipc.hpp); guarded by export_mutex.
  std::mutex export_mutex;
  std::optional<std::array<std::byte, 64>> ipc_handle;
};

class BlockPool;

/// A producer's storage in device memory: `size()` bytes at `offset()` of a pool block.
/// When it dies, its range goes back to the pool, or to the limbo while receivers hold it.
class CudaAllocation final : public Allocation {
 public:
  /// `bytes` requested, `reserved` (rounded up) taken from the block at `offset`.
  CudaAllocation(BlockPool& pool, Block& block, std::size_t offset, std::size_t bytes, std::size_t reserved) noexcept
      : pool_(pool), block_(block), offset_(offset), bytes_(bytes), reserved_(reserved) {}
  ~CudaAllocation() override;
  CudaAllocation(const CudaAllocation&) = delete;
  CudaAllocation& operator=(const CudaAllocation&) = delete;

  std::byte* data() const noexcept override { return block_.base + offset_; }
  std::size_t size() const noexcept override { return bytes_; }
  Device device() const noexcept override;
  Block& block() const noexcept { return block_; }
  std::size_t offset() const noexcept { return offset_; }

  /// The hold of the connection whose boards are `boards` on this storage, made on first use:
  /// the board and counter that its receiver releases. Thread-safe.
  std::pair<std::shared_ptr<HoldCounterBoard>, std::uint32_t> hold_for(HoldCounterBoardSet& boards);
  /// Holds taken on this storage so far (for tests).
  std::size_t hold_count() const;

 private:
  BlockPool& pool_;
  Block& block_;
  std::size_t offset_;
  std::size_t bytes_;
  std::size_t reserved_;
  mutable std::mutex mutex_;
  std::vector<ConsumerHold> holds_;
};

/// Zero bytes "on" a CUDA device: needs no memory and no CUDA call.
class EmptyCudaAllocation final : public Allocation {
 public:
  explicit EmptyCudaAllocation(int device) noexcept : device_(device) {}
  std::byte* data() const noexcept override { return nullptr; }
  std::size_t size() const noexcept override { return 0; }
  Device device() const noexcept override { return Device::Cuda(device_); }

 private:
  int device_;
};

/// The caching allocator of one device. Thread-safe. Lives as long as the process (its
/// allocations refer to it).
class BlockPool {
 public:
  static constexpr std::size_t kRounding = 512;
  static constexpr std::size_t kSmallRequest = std::size_t{1} << 20;
  static constexpr std::size_t kSmallBlock = std::size_t{2} << 20;
  static constexpr std::size_t kMediumRequest = std::size_t{10} << 20;
  static constexpr std::size_t kMediumBlock = std::size_t{20} << 20;
  static constexpr std::size_t kLargeRounding = std::size_t{2} << 20;

  BlockPool(std::unique_ptr<BlockSource> source, int device);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  ~BlockPool();

  /// `bytes` of device memory (an EmptyCudaAllocation for 0). When nothing cached fits, it
  /// collects the limbo, then asks the source for a block, then empties the cache and asks
  /// again; throws CudaError (out of memory, with the pool's numbers) after that.
  std::shared_ptr<Allocation> allocate(std::size_t bytes);
  /// Frees the limbo ranges whose holds are all released; returns the bytes freed.
  std::size_t collect();
  /// collect(), then gives every block without a live or limbo range back to the source;
  /// returns the bytes given back.
  std::size_t empty_cache();
  CudaMemoryStats stats() const;
  int device() const noexcept { return device_; }

 private:
  friend class CudaAllocation;
  struct LimboEntry {
    Block* block;
    std::size_t offset;
    std::size_t bytes;
    std::vector<ConsumerHold> holds;
  };
  // Called by a dying CudaAllocation.
  void release(Block& block, std::size_t offset, std::size_t bytes, std::vector<ConsumerHold> holds) noexcept;
  std::shared_ptr<Allocation> carve_locked(std::size_t bytes, std::size_t rounded);
  std::size_t collect_locked();
  std::size_t empty_cache_locked();
  void free_range_locked(Block& block, std::size_t offset, std::size_t bytes);
  [[noreturn]] void throw_out_of_memory_locked(std::size_t requested, std::size_t block_bytes);

  std::unique_ptr<BlockSource> source_;
  int device_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<LimboEntry> limbo_;
  std::size_t allocated_bytes_ = 0;
  std::size_t limbo_bytes_ = 0;
};

/// A fresh, process-unique block id.
std::uint64_t next_block_id() noexcept;

}  // namespace ferry::cuda
