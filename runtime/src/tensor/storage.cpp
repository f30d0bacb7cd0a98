#include "ferry/storage.hpp"

#include <cstring>
#include <new>

#include "cuda/memory.hpp"
#include "ferry/detail/object_pool.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/error.hpp"
#include "ferry/shared_allocator.hpp"

namespace ferry {
namespace {

constexpr std::align_val_t kHeapAlignment{64};
std::atomic<std::uint64_t> g_next_storage_id{1};
// Each thread takes ids in ranges: one atomic operation per kIdRange storages, not per storage.
constexpr std::uint64_t kIdRange = 1024;

std::uint64_t next_storage_id() noexcept {
  constinit thread_local std::uint64_t next = 0;
  constinit thread_local std::uint64_t end = 0;
  if (next == end) {
    next = g_next_storage_id.fetch_add(kIdRange, std::memory_order_relaxed);
    end = next + kIdRange;
  }
  return next++;
}
std::atomic<std::uint64_t> g_sent_storage_deaths{0};

}  // namespace

// Lets std::allocate_shared reach the private constructor: one allocation for the Storage
// and its control block, from the thread's pool (a message makes storages by the hundred).
struct Storage::Constructor : Storage {
  template <class A>
  Constructor(std::shared_ptr<A>&& allocation, Device device, bool received, bool shared)
      : Storage(std::move(allocation), device, received, shared) {}
};

template <class A>
std::shared_ptr<Storage> Storage::make(std::shared_ptr<A>&& allocation, Device device, bool received, bool shared) {
  return std::allocate_shared<Constructor>(detail::PoolAllocator<Constructor>(), std::move(allocation), device,
                                           received, shared);
}

HeapAllocation::HeapAllocation(std::size_t size) : size_(size) {
  if (size > 0) data_ = static_cast<std::byte*>(::operator new(size, kHeapAlignment));
}

HeapAllocation::~HeapAllocation() {
  if (data_ != nullptr) ::operator delete(data_, kHeapAlignment);
}

template <class A>
Storage::Storage(std::shared_ptr<A>&& allocation, Device device, bool received, bool shared)
    : allocation_(std::move(allocation)),
      device_(device),
      id_(next_storage_id()),
      received_(received),
      shared_(shared) {}

Storage::~Storage() {
  if (sent_.load(std::memory_order_relaxed)) g_sent_storage_deaths.fetch_add(1, std::memory_order_release);
}

void Storage::announce_dropped() noexcept {
  if (sent_.load(std::memory_order_relaxed)) g_sent_storage_deaths.fetch_add(1, std::memory_order_release);
}

std::shared_ptr<Storage> Storage::allocate(std::size_t nbytes, Device device, bool zeroed) {
  switch (device.kind) {
    case DeviceKind::Cpu: {
      auto storage = make(std::make_shared<HeapAllocation>(nbytes), device, false, false);
      if (zeroed && nbytes > 0) std::memset(storage->data(), 0, nbytes);
      return storage;
    }
    case DeviceKind::SharedCpu:  // as allocate(nbytes, global(), zeroed), without the call
      if (nbytes == 0) return make(std::shared_ptr<Allocation>(), Device::SharedCpu, false, false);
      return make(SharedAllocator::global().allocate(nbytes, zeroed), Device::SharedCpu, false, true);
    case DeviceKind::Cuda: {
      // Device memory comes from ferry's caching CUDA allocator (runtime/src/cuda/).
      auto storage = make(cuda::allocate(nbytes, device), device, false, false);
      if (zeroed) cuda::zero(*storage);  // cudaMemset
      return storage;
    }
  }
  throw Error("Storage::allocate: invalid device kind");
}

std::shared_ptr<Storage> Storage::allocate(std::size_t nbytes, const SharedAllocator& pool, bool zeroed) {
  // Nothing to share: an empty storage needs no block and travels without one.
  if (nbytes == 0) return make(std::shared_ptr<Allocation>(), Device::SharedCpu, false, false);
  return make(pool.allocate(nbytes, zeroed), Device::SharedCpu, false, true);
}

std::shared_ptr<Storage> Storage::adopt(std::shared_ptr<Allocation> allocation, bool received) {
  const Device device = allocation ? allocation->device() : Device::Cpu;
  const bool shared = allocation != nullptr && allocation->shared_block() != nullptr;
  return make(std::move(allocation), device, received, shared);
}

void Storage::share_memory_slow(const SharedAllocator* pool) {
  const detail::MutexLock lock(share_mutex_);
  if (device_.kind == DeviceKind::SharedCpu) return;
  if (device_.kind == DeviceKind::Cuda) return;  // device memory is shared through CUDA IPC as it is
  if (device_.kind != DeviceKind::Cpu) {
    throw Error("share_memory: only CPU storages can be moved into shared memory, not " + device_.to_string());
  }
  const std::size_t size = nbytes();
  std::shared_ptr<Allocation> shared;
  if (size > 0) {
    shared = (pool != nullptr ? *pool : SharedAllocator::global()).allocate(size);
    std::memcpy(shared->data(), data(), size);
  }
  allocation_ = std::move(shared);
  device_ = Device::SharedCpu;
  shared_.store(allocation_ != nullptr, std::memory_order_release);
}

std::uint64_t sent_storage_deaths() noexcept { return g_sent_storage_deaths.load(std::memory_order_acquire); }

}  // namespace ferry
