// Storage: one block of tensor memory, shared by every view (Tensor) of it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "ferry/allocation.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/device.hpp"

namespace ferry {

class SharedAllocator;

/// Heap memory private to this process, 64-byte aligned.
class HeapAllocation final : public Allocation {
 public:
  explicit HeapAllocation(std::size_t size);
  ~HeapAllocation() override;
  HeapAllocation(const HeapAllocation&) = delete;
  HeapAllocation& operator=(const HeapAllocation&) = delete;
  std::byte* data() const noexcept override { return data_; }
  std::size_t size() const noexcept override { return size_; }
  Device device() const noexcept override { return Device::Cpu; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// A contiguous block of bytes that tensors view. Always owned through std::shared_ptr;
/// views of one storage share it, and it dies with its last view. (Not derived from
/// enable_shared_from_this: its weak reference would cost two atomic operations per storage.)
class Storage {
 public:
  /// Allocates `nbytes` on `device`. Shared memory comes from the process's caching
  /// allocator (SharedAllocator::global()); CUDA memory from ferry's caching device
  /// allocator (ferry/cuda/block_pool.hpp; CudaError when that fails, Error in a build
  /// without CUDA). With `zeroed`, the bytes are zero; otherwise their value is unspecified
  /// (a recycled block keeps old contents).
  static std::shared_ptr<Storage> allocate(std::size_t nbytes, Device device, bool zeroed = false);
  /// Allocates `nbytes` of shared memory from `pool`.
  static std::shared_ptr<Storage> allocate(std::size_t nbytes, const SharedAllocator& pool, bool zeroed = false);
  /// Wraps an allocation; several Storage objects may share one (a storage sent back to
  /// the process that created it, once the creator's Storage object died).
  static std::shared_ptr<Storage> adopt(std::shared_ptr<Allocation> allocation, bool received = false);

  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  /// First byte of the storage (nullptr when it has no bytes).
  std::byte* data() const noexcept { return allocation_ ? allocation_->data() : nullptr; }
  /// Size of the storage in bytes (a shared block's requested size, not its class size).
  std::size_t nbytes() const noexcept { return allocation_ ? allocation_->size() : 0; }
  /// Where the bytes live.
  Device device() const noexcept { return device_; }
  /// Unique within this process for the process's lifetime (never reused).
  std::uint64_t id() const noexcept { return id_; }
  /// The shared block behind the storage (segment, offset, size), or nullptr.
  const SharedBlock* shared_block() const noexcept { return allocation_ ? allocation_->shared_block() : nullptr; }
  /// True once the storage lives in shared memory (lock-free: safe to ask while another
  /// thread shares it).
  bool is_shared() const noexcept { return shared_.load(std::memory_order_acquire); }
  /// True when the storage was received from another process.
  bool received() const noexcept { return received_; }

  /// Moves a heap storage's bytes into shared memory (a block of `pool`, by default the
  /// process's caching allocator), in place: every tensor that views this storage
  /// follows. No-op when already shared, and for CUDA storages (which travel through CUDA
  /// IPC as they are). Not safe while another thread reads or writes the
  /// storage's bytes. (Inline check first: an encoder asks for every storage it sends.)
  void share_memory() {
    if (!is_shared()) share_memory_slow(nullptr);
  }
  void share_memory(const SharedAllocator& pool) {
    if (!is_shared()) share_memory_slow(&pool);
  }

  /// Records that the storage went into a frame, so that its death is announced to the
  /// channels that track what their receivers hold (see sent_storage_deaths()).
  void mark_sent() noexcept { sent_.store(true, std::memory_order_relaxed); }
  /// True once the storage was passed to another process (mark_sent()).
  bool was_sent() const noexcept { return sent_.load(std::memory_order_relaxed); }
  /// Counts as a death for sent_storage_deaths() when the storage was sent: a receiver
  /// calls it when the user dropped every handle of a storage the receiver keeps alive.
  void announce_dropped() noexcept;

  /// The underlying allocation (for transports that need its concrete type).
  const Allocation* allocation() const noexcept { return allocation_.get(); }
  /// Shared ownership of the underlying allocation (keeps the memory, not this Storage).
  std::shared_ptr<Allocation> shared_allocation() const noexcept { return allocation_; }

 private:
  struct Constructor;
  // `shared`: the allocation is a shared block (known to every caller, so no virtual call).
  // `A`: Allocation or a subclass. A new block's pointer is converted in the constructor,
  // not before the call: read back right after the allocator wrote it, the pointer pair
  // would wait for those stores (a failed store-to-load forwarding) on every storage.
  template <class A>
  Storage(std::shared_ptr<A>&& allocation, Device device, bool received, bool shared);
  template <class A>
  static std::shared_ptr<Storage> make(std::shared_ptr<A>&& allocation, Device device, bool received, bool shared);
  // `pool` null: the process's caching allocator.
  void share_memory_slow(const SharedAllocator* pool);

  std::shared_ptr<Allocation> allocation_;
  Device device_;
  std::uint64_t id_;
  bool received_;
  std::atomic<bool> sent_{false};
  std::atomic<bool> shared_{false};  // set once the allocation is shared memory
  detail::Mutex share_mutex_;
};

/// Counts the deaths of storages that were ever sent. A channel compares it with the value
/// it saw last to decide cheaply whether its table of sent storages has dead entries.
std::uint64_t sent_storage_deaths() noexcept;

}  // namespace ferry
