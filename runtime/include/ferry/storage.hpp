// Storage: one block of tensor memory, shared by every view (Tensor) of it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "ferry/device.hpp"
#include "ferry/shared_memory.hpp"

namespace ferry {

/// Owns the bytes behind a Storage. Subclasses: private heap memory, a shared memfd
/// segment, and (with CUDA) device memory.
class Allocation {
 public:
  virtual ~Allocation() = default;
  virtual std::byte* data() const noexcept = 0;
  virtual std::size_t size() const noexcept = 0;
  virtual Device device() const noexcept = 0;
  /// The shared segment behind this allocation, or nullptr when it is not shared memory.
  virtual const SharedMemory* shared_memory() const noexcept { return nullptr; }
};

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

/// A whole sealed memfd segment.
class SharedMemoryAllocation final : public Allocation {
 public:
  explicit SharedMemoryAllocation(SharedMemory segment) : segment_(std::move(segment)) {}
  std::byte* data() const noexcept override { return segment_.data(); }
  std::size_t size() const noexcept override { return segment_.size(); }
  Device device() const noexcept override { return Device::SharedCpu; }
  const SharedMemory* shared_memory() const noexcept override { return &segment_; }

 private:
  SharedMemory segment_;
};

/// A contiguous block of bytes that tensors view. Always owned through std::shared_ptr;
/// views of one storage share it, and it dies with its last view.
class Storage : public std::enable_shared_from_this<Storage> {
 public:
  /// Allocates `nbytes` on `device`. Shared memory is registered in the process's handle
  /// cache so that a storage sent back to us is recognised; CUDA memory comes from ferry's
  /// caching device allocator (ferry/cuda/block_pool.hpp; CudaError when that fails, Error
  /// in a build without CUDA).
  static std::shared_ptr<Storage> allocate(std::size_t nbytes, Device device);
  /// Wraps an allocation; several Storage objects may share one (a receiver's lease keeps
  /// the allocation, not the Storage, alive).
  static std::shared_ptr<Storage> adopt(std::shared_ptr<Allocation> allocation, bool received = false);

  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  std::byte* data() const noexcept { return allocation_ ? allocation_->data() : nullptr; }
  std::size_t nbytes() const noexcept { return allocation_ ? allocation_->size() : 0; }
  Device device() const noexcept { return device_; }
  /// Unique within this process for the process's lifetime (never reused).
  std::uint64_t id() const noexcept { return id_; }
  /// The shared segment behind the storage, or nullptr.
  const SharedMemory* shared_memory() const noexcept {
    return allocation_ ? allocation_->shared_memory() : nullptr;
  }
  bool is_shared() const noexcept { return shared_.load(std::memory_order_acquire); }
  /// True when the storage was received from another process.
  bool received() const noexcept { return received_; }

  /// Moves a heap storage's bytes into a new shared segment, in place: every tensor that
  /// views this storage follows. No-op when already shared, and for CUDA storages (which
  /// travel through CUDA IPC as they are). Not safe while another thread reads or writes
  /// the storage's bytes.
  void share_memory();

  /// Records that the storage went into a frame, so that its death is announced to the
  /// channels that track what their receivers hold (see sent_storage_deaths()).
  void mark_sent() noexcept { sent_.store(true, std::memory_order_relaxed); }
  /// Counts as a death for sent_storage_deaths() when the storage was sent: a receiver
  /// calls it when the user dropped every handle of a storage the receiver keeps alive.
  void announce_dropped() noexcept;

  /// The underlying allocation (for transports that need its concrete type).
  const Allocation* allocation() const noexcept { return allocation_.get(); }
  /// Shared ownership of the underlying allocation (keeps the memory, not this Storage).
  std::shared_ptr<Allocation> shared_allocation() const noexcept { return allocation_; }

 private:
  Storage(std::shared_ptr<Allocation> allocation, Device device, bool received);

  std::shared_ptr<Allocation> allocation_;
  Device device_;
  std::uint64_t id_;
  bool received_;
  std::atomic<bool> sent_{false};
  std::atomic<bool> shared_{false};  // set once the allocation is shared memory
  std::mutex share_mutex_;
};

/// Counts the deaths of storages that were ever sent. A channel compares it with the value
/// it saw last to decide cheaply whether its table of sent storages has dead entries.
std::uint64_t sent_storage_deaths() noexcept;

}  // namespace ferry
