// CUDA IPC memory: exporting a producer's block, and the receiver's cache of opened blocks
// (each block is opened once per process and device, and closed when the last range in it dies).
#include <cuda.h>
#include <cudaTypedefs.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "cuda/cudart.hpp"
#include "cuda/fence_watch.hpp"
#include "cuda/memory_operations.hpp"
#include "ferry/cuda/runtime.hpp"
#include "ferry/detail/cuda/block_pool.hpp"
#include "ferry/detail/cuda/ipc.hpp"

namespace ferry {
namespace cuda {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(IpcHandle));

std::atomic<std::uint64_t> g_blocks_opened{0};
std::atomic<std::uint64_t> g_blocks_closed{0};
std::atomic<std::uint64_t> g_fence_buffers_opened{0};

std::string bus_text(const PciBusId& bus_id) {
  return std::string(bus_id.data(), ::strnlen(bus_id.data(), bus_id.size()));
}

// The driver's cuMemGetAddressRange.
PFN_cuMemGetAddressRange_v3020 address_range_function() {
  static const auto function = driver_function<PFN_cuMemGetAddressRange_v3020>("cuMemGetAddressRange");
  return function;
}

// The size of the allocation that starts at `base` (an opened IPC block) as the driver knows
// it, or std::nullopt when the driver cannot tell (then the producer's word is taken, and a
// warning says so once).
std::optional<std::size_t> real_block_bytes(void* base) {
  const PFN_cuMemGetAddressRange_v3020 get_range = address_range_function();
  CUdeviceptr range_base = 0;
  std::size_t range_bytes = 0;
  const CUresult status =
      get_range != nullptr ? get_range(&range_base, &range_bytes, reinterpret_cast<CUdeviceptr>(base)) : CUDA_SUCCESS;
  if (get_range != nullptr && status == CUDA_SUCCESS && range_base == reinterpret_cast<CUdeviceptr>(base)) {
    return range_bytes;
  }
  static std::once_flag once;
  std::call_once(once, [&] {
    std::fprintf(stderr,
                 "ferry: warning: cannot check the size of CUDA blocks received from other processes "
                 "(cuMemGetAddressRange %s, driver status %d): trusting the sizes senders claim\n",
                 get_range == nullptr ? "is not available" : "failed", static_cast<int>(status));
  });
  return std::nullopt;
}

// One block of another process, opened in this one.
struct OpenBlock {
  void* base = nullptr;
  std::size_t users = 0;  // ranges alive in it
  pid_t producer = 0;
  std::uint64_t block_id = 0;
  std::uint64_t block_bytes = 0;
  bool counted = true;  // a storage block (counted in cuda_ipc_stats), not a fence buffer
};

// (local device, IPC handle bytes) -> the opened block. An entry lives exactly as long as
// ranges in the block do (users > 0); counting under the lock makes "close the last range"
// and "open it again" impossible to interleave (CUDA refuses a second open of a handle).
struct BlockCache {
  std::mutex mutex;
  std::map<std::pair<int, IpcHandle>, OpenBlock> blocks;
};

BlockCache& block_cache() {
  static auto* instance = new BlockCache();  // leaked: ranges may die during static destruction
  return *instance;
}

void release_block(const std::pair<int, IpcHandle>& key) noexcept {
  BlockCache& cache = block_cache();
  std::lock_guard lock(cache.mutex);
  const auto it = cache.blocks.find(key);
  if (it == cache.blocks.end() || --it->second.users > 0) return;
  try {
    DeviceGuard guard(key.first);
    ignore_cuda_error(cuda::cudart().cudaIpcCloseMemHandle(it->second.base));
  } catch (...) {
    // The device is unusable (the process is exiting): the mapping goes with the process.
  }
  if (it->second.counted) g_blocks_closed.fetch_add(1, std::memory_order_relaxed);
  cache.blocks.erase(it);
}

// A received Storage's allocation: a range plus one hold on the producer's counter, and the
// sender's fence buffer (a stream may still wait on it after the connection closed it).
class HeldCudaRange final : public Allocation {
 public:
  HeldCudaRange(std::shared_ptr<ReceivedCudaRange> range, HoldCounterView board, std::uint32_t counter,
                std::shared_ptr<const void> signal) noexcept
      : range_(std::move(range)), board_(std::move(board)), counter_(counter), signal_(std::move(signal)) {}
  HeldCudaRange(const HeldCudaRange&) = delete;
  HeldCudaRange& operator=(const HeldCudaRange&) = delete;
  ~HeldCudaRange() override {
    // Work this process queued on the memory must be finished before the producer may reuse
    // it (as torch does, the current stream is waited for: the storage's death is not on the
    // hot path of a send).
    const int device = range_->device().index;
    try {
      DeviceGuard guard(device);
      wait_for_stream(current_stream(device), "waiting for the stream before releasing a received CUDA storage");
    } catch (...) {
      // The device is unusable: nothing runs on it any more.
    }
    range_.reset();  // closes the block if this was its last range, before the producer hears of it
    board_.release(counter_);
  }
  std::byte* data() const noexcept override { return range_->data(); }
  std::size_t size() const noexcept override { return range_->size(); }
  Device device() const noexcept override { return range_->device(); }

 private:
  std::shared_ptr<ReceivedCudaRange> range_;
  HoldCounterView board_;
  std::uint32_t counter_;
  std::shared_ptr<const void> signal_;  // let go after the stream was waited for
};

}  // namespace

BlockExport export_allocation(const CudaAllocation& allocation) {
  const int device = allocation.device().index;
  Block& block = allocation.block();
  BlockExport exported;
  {
    std::lock_guard lock(block.export_mutex);
    if (!block.ipc_handle) {
      DeviceGuard guard(device);
      cudaIpcMemHandle_t handle{};
      check_cuda(
          cuda::cudart().cudaIpcGetMemHandle(&handle, block.base),
          "cudaIpcGetMemHandle of a " + std::to_string(block.bytes) + "-byte block on cuda:" + std::to_string(device));
      IpcHandle bytes{};
      std::memcpy(bytes.data(), &handle, sizeof handle);
      block.ipc_handle = bytes;
      // From now on other processes may hold memory of this one: warn if it exits first.
      warn_at_exit_about_outstanding_holds();
    }
    exported.memory_handle = *block.ipc_handle;
  }
  static std::mutex bus_mutex;
  static std::map<int, PciBusId> bus_ids;
  {
    std::lock_guard lock(bus_mutex);
    auto it = bus_ids.find(device);
    if (it == bus_ids.end()) {
      PciBusId bus_id{};
      check_cuda(cuda::cudart().cudaDeviceGetPCIBusId(bus_id.data(), static_cast<int>(bus_id.size()), device),
                 "cudaDeviceGetPCIBusId of cuda:" + std::to_string(device));
      bus_id.back() = '\0';
      it = bus_ids.emplace(device, bus_id).first;
    }
    exported.pci_bus_id = it->second;
  }
  exported.block_id = block.id;
  exported.block_bytes = block.bytes;
  exported.offset = allocation.offset();
  return exported;
}

int local_device(const PciBusId& bus_id) {
  static std::mutex mutex;
  static std::map<std::string, int> devices;
  const std::string text = bus_text(bus_id);
  std::lock_guard lock(mutex);
  if (const auto it = devices.find(text); it != devices.end()) return it->second;
  int device = -1;
  const cudaError_t status = cuda::cudart().cudaDeviceGetByPCIBusId(&device, text.c_str());
  if (status != cudaSuccess) {
    ignore_cuda_error(status);
    throw CudaError("this process does not see the GPU at PCI bus id '" + text + "' that the sender's tensor is on (" +
                        cuda::cudart().cudaGetErrorName(status) + "); check CUDA_VISIBLE_DEVICES in both processes",
                    static_cast<int>(status));
  }
  devices.emplace(text, device);
  return device;
}

std::shared_ptr<ReceivedCudaRange> open_received_range(const BlockExport& exported, int device, std::size_t bytes,
                                                       pid_t producer, bool counted) {
  if (exported.offset > exported.block_bytes || bytes > exported.block_bytes - exported.offset) {
    throw CudaError("a received CUDA storage of " + std::to_string(bytes) + " bytes at offset " +
                        std::to_string(exported.offset) + " does not fit its block of " +
                        std::to_string(exported.block_bytes) + " bytes",
                    cudaErrorInvalidValue);
  }
  std::pair<int, IpcHandle> key{device, exported.memory_handle};
  void* base = nullptr;
  {
    BlockCache& cache = block_cache();
    std::lock_guard lock(cache.mutex);
    if (auto it = cache.blocks.find(key); it != cache.blocks.end()) {
      OpenBlock& open = it->second;
      if (open.counted != counted) {
        throw CudaError("process " + std::to_string(producer) + " sent the IPC handle of " +
                            (counted ? "a fence buffer as a storage's block" : "a storage's block as a fence buffer") +
                            " (block " + std::to_string(exported.block_id) + "; this process has it open as block " +
                            std::to_string(open.block_id) + " of process " + std::to_string(open.producer) + ")",
                        cudaErrorInvalidValue);
      }
      if (open.producer != producer || open.block_id != exported.block_id || open.block_bytes != exported.block_bytes) {
        throw CudaError("process " + std::to_string(producer) + " sent CUDA block " +
                            std::to_string(exported.block_id) +
                            " with the IPC handle of a block this process still has open (block " +
                            std::to_string(open.block_id) + " of process " + std::to_string(open.producer) +
                            "): a producer freed a block that another channel's receiver still maps",
                        cudaErrorInvalidValue);
      }
      ++open.users;
      base = open.base;
    } else {
      DeviceGuard guard(device);
      cudaIpcMemHandle_t handle{};
      std::memcpy(&handle, exported.memory_handle.data(), sizeof handle);
      check_cuda(cuda::cudart().cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess),
                 "cudaIpcOpenMemHandle of a block of process " + std::to_string(producer) +
                     " on cuda:" + std::to_string(device));
      // A block smaller than claimed would let the sender make this process fault on the device.
      if (const std::optional<std::size_t> real_bytes = real_block_bytes(base);
          real_bytes && *real_bytes < exported.block_bytes) {
        ignore_cuda_error(cuda::cudart().cudaIpcCloseMemHandle(base));
        throw CudaError("process " + std::to_string(producer) + " claims its CUDA block has " +
                            std::to_string(exported.block_bytes) + " bytes but it has " + std::to_string(*real_bytes),
                        cudaErrorInvalidValue);
      }
      cache.blocks.emplace(key, OpenBlock{base, 1, producer, exported.block_id, exported.block_bytes, counted});
      (counted ? g_blocks_opened : g_fence_buffers_opened).fetch_add(1, std::memory_order_relaxed);
    }
  }
  // The keepalive's deleter gives the use back (and closes the block after the last one).
  std::shared_ptr<const void> keepalive(base, [key](const void*) { release_block(key); });
  return std::make_shared<ReceivedCudaRange>(std::move(keepalive), static_cast<std::byte*>(base) + exported.offset,
                                             bytes, device, producer, exported.block_id, exported.offset);
}

std::uint64_t fence_buffers_opened() noexcept { return g_fence_buffers_opened.load(std::memory_order_relaxed); }

std::shared_ptr<Allocation> hold_received_range(std::shared_ptr<ReceivedCudaRange> range, HoldCounterView board,
                                                std::uint32_t counter, std::shared_ptr<const void> signal) {
  return std::make_shared<HeldCudaRange>(std::move(range), std::move(board), counter, std::move(signal));
}

}  // namespace cuda

CudaIpcStats cuda_ipc_stats() {
  CudaIpcStats stats;
  stats.blocks_opened = cuda::g_blocks_opened.load(std::memory_order_relaxed);
  stats.blocks_closed = cuda::g_blocks_closed.load(std::memory_order_relaxed);
  stats.blocks_open = stats.blocks_opened - stats.blocks_closed;
  stats.events_opened = cuda::ipc_events_opened();
  stats.fence_buffers_opened = cuda::fence_buffers_opened();
  stats.fences_released = cuda::fences_released_for_dead_producers();
  return stats;
}

}  // namespace ferry
