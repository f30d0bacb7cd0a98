// The device pools: one BlockPool per CUDA device, fed by cudaMalloc; allocating and zeroing
// CUDA storages; collect/empty_cache/statistics for users.
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/cudart.hpp"
#include "cuda/memory.hpp"
#include "ferry/cuda/runtime.hpp"
#include "ferry/detail/cuda/block_pool.hpp"

namespace ferry {
namespace cuda {
namespace {

// Blocks of one device, from cudaMalloc.
class DeviceBlockSource final : public BlockSource {
 public:
  explicit DeviceBlockSource(int device) : device_(device) {}

  void* allocate(std::size_t bytes) override {
    DeviceGuard guard(device_);
    void* base = nullptr;
    const cudaError_t status = cuda::cudart().cudaMalloc(&base, bytes);
    if (status == cudaErrorMemoryAllocation) {
      (void)cuda::cudart().cudaGetLastError();
      return nullptr;  // the pool empties its cache and tries again, then reports
    }
    check_cuda(status, "cudaMalloc of " + std::to_string(bytes) + " bytes on cuda:" + std::to_string(device_));
    return base;
  }

  void release(void* base, std::size_t /*bytes*/) noexcept override {
    try {
      DeviceGuard guard(device_);
      ignore_cuda_error(cuda::cudart().cudaFree(base));
    } catch (...) {
      // The device is unusable (the process is exiting, or the context is broken): nothing to free.
    }
  }

 private:
  int device_;
};

struct Pools {
  std::mutex mutex;
  std::vector<std::unique_ptr<BlockPool>> by_device;
};

Pools& pools() {
  // Leaked on purpose: storages may die during static destruction and must still find their pool.
  static auto* instance = new Pools();
  return *instance;
}

BlockPool& pool_for(int device) {
  check_device(device);
  Pools& all = pools();
  std::lock_guard lock(all.mutex);
  const auto index = static_cast<std::size_t>(device);
  if (all.by_device.size() <= index) all.by_device.resize(index + 1);
  if (!all.by_device[index]) {
    all.by_device[index] = std::make_unique<BlockPool>(std::make_unique<DeviceBlockSource>(device), device);
  }
  return *all.by_device[index];
}

// The pools that exist, without creating any (and without touching CUDA).
std::vector<BlockPool*> existing_pools() {
  Pools& all = pools();
  std::lock_guard lock(all.mutex);
  std::vector<BlockPool*> out;
  for (const auto& pool : all.by_device) {
    if (pool) out.push_back(pool.get());
  }
  return out;
}

}  // namespace

std::shared_ptr<Allocation> allocate(std::size_t bytes, Device device) {
  if (bytes == 0) return std::make_shared<EmptyCudaAllocation>(device.index);
  return pool_for(device.index).allocate(bytes);
}

void zero(Storage& storage) {
  if (storage.nbytes() == 0) return;
  const int device = storage.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  check_cuda(cuda::cudart().cudaMemsetAsync(storage.data(), 0, storage.nbytes(), stream),
             "cudaMemsetAsync of " + std::to_string(storage.nbytes()) + " bytes on cuda:" + std::to_string(device));
  wait_for_stream(stream, "waiting for the zeroing of a CUDA storage");
}

}  // namespace cuda

std::size_t cuda_collect() {
  std::size_t freed = 0;
  for (cuda::BlockPool* pool : cuda::existing_pools()) freed += pool->collect();
  return freed;
}

std::size_t cuda_empty_cache() {
  std::size_t released = 0;
  for (cuda::BlockPool* pool : cuda::existing_pools()) released += pool->empty_cache();
  return released;
}

CudaMemoryStats cuda_memory_stats(int device) {
  for (cuda::BlockPool* pool : cuda::existing_pools()) {
    if (pool->device() == device) return pool->stats();
  }
  return CudaMemoryStats{};
}

}  // namespace ferry
