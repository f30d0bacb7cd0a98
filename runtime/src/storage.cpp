#include "ferry/storage.hpp"

#include <cstring>
#include <new>

#include "ferry/cuda/memory.hpp"
#include "ferry/error.hpp"
#include "ferry/handle_cache.hpp"

namespace ferry {
namespace {

constexpr std::align_val_t kHeapAlignment{64};
std::atomic<std::uint64_t> g_next_storage_id{1};
std::atomic<std::uint64_t> g_sent_storage_deaths{0};

}  // namespace

HeapAllocation::HeapAllocation(std::size_t size) : size_(size) {
  if (size > 0) data_ = static_cast<std::byte*>(::operator new(size, kHeapAlignment));
}

HeapAllocation::~HeapAllocation() {
  if (data_ != nullptr) ::operator delete(data_, kHeapAlignment);
}

Storage::Storage(std::shared_ptr<Allocation> allocation, Device device, bool received)
    : allocation_(std::move(allocation)),
      device_(device),
      id_(g_next_storage_id.fetch_add(1, std::memory_order_relaxed)),
      received_(received) {
  shared_.store(allocation_ != nullptr && allocation_->shared_memory() != nullptr, std::memory_order_release);
}

Storage::~Storage() {
  if (sent_.load(std::memory_order_relaxed)) g_sent_storage_deaths.fetch_add(1, std::memory_order_release);
}

void Storage::announce_dropped() noexcept {
  if (sent_.load(std::memory_order_relaxed)) g_sent_storage_deaths.fetch_add(1, std::memory_order_release);
}

std::shared_ptr<Storage> Storage::allocate(std::size_t nbytes, Device device) {
  switch (device.kind) {
    case DeviceKind::Cpu:
      return std::shared_ptr<Storage>(new Storage(std::make_unique<HeapAllocation>(nbytes), device, false));
    case DeviceKind::SharedCpu: {
      if (nbytes == 0) {
        // Nothing to share: an empty storage needs no segment and travels without one.
        return std::shared_ptr<Storage>(new Storage(nullptr, device, false));
      }
      auto storage = std::shared_ptr<Storage>(
          new Storage(std::make_unique<SharedMemoryAllocation>(SharedMemory::create(nbytes)), device, false));
      HandleCache::global().insert(storage->shared_memory()->identity(), storage);
      return storage;
    }
    case DeviceKind::Cuda:
      // Device memory comes from ferry's caching CUDA allocator (runtime/src/cuda/).
      return std::shared_ptr<Storage>(new Storage(cuda::allocate(nbytes, device), device, false));
  }
  throw Error("Storage::allocate: invalid device kind");
}

std::shared_ptr<Storage> Storage::adopt(std::shared_ptr<Allocation> allocation, bool received) {
  const Device device = allocation ? allocation->device() : Device::Cpu;
  return std::shared_ptr<Storage>(new Storage(std::move(allocation), device, received));
}

void Storage::share_memory() {
  if (shared_.load(std::memory_order_acquire)) return;  // the common case: no lock
  std::lock_guard lock(share_mutex_);
  if (device_.kind == DeviceKind::SharedCpu) return;
  if (device_.kind == DeviceKind::Cuda) return;  // device memory is shared through CUDA IPC as it is
  if (device_.kind != DeviceKind::Cpu) {
    throw Error("share_memory: only CPU storages can be moved into shared memory, not " + device_.to_string());
  }
  const std::size_t size = nbytes();
  std::shared_ptr<Allocation> shared;
  if (size > 0) {
    SharedMemory segment = SharedMemory::create(size);
    std::memcpy(segment.data(), data(), size);
    shared = std::make_shared<SharedMemoryAllocation>(std::move(segment));
  }
  allocation_ = std::move(shared);
  device_ = Device::SharedCpu;
  shared_.store(allocation_ != nullptr, std::memory_order_release);
  if (allocation_ != nullptr) {
    if (auto self = weak_from_this().lock()) HandleCache::global().insert(shared_memory()->identity(), self);
  }
}

std::uint64_t sent_storage_deaths() noexcept { return g_sent_storage_deaths.load(std::memory_order_acquire); }

}  // namespace ferry
