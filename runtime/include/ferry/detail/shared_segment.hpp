// A shared segment as this process sees it (the blocks storages occupy in it: ferry/allocation.hpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ferry/detail/shared_memory.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/device.hpp"

namespace ferry {
class Storage;
class SharedBlock;
}  // namespace ferry

namespace ferry::detail {

class ReturnBoard;

/// A sealed memfd segment mapped in this process: one created by a SharedAllocator (which
/// carves blocks from it) or one received from another process. Always owned through
/// std::shared_ptr; every block in it keeps it mapped. Thread-safe.
class SharedSegment {
 public:
  /// Creates a segment of `size` bytes that belongs to `owner` (the allocator carving it).
  /// Throws OutOfSharedMemory or SystemError (see SharedMemory::create).
  static std::shared_ptr<SharedSegment> create(std::size_t size, const void* owner);
  /// Wraps a segment received from another process (already checked and mapped).
  static std::shared_ptr<SharedSegment> adopt(SharedMemory memory);

  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  /// First byte of the segment in this process.
  std::byte* data() const noexcept { return memory_.data(); }
  /// Size of the segment in bytes.
  std::size_t size() const noexcept { return memory_.size(); }
  /// The memfd (for passing the segment to another process).
  int fd() const noexcept { return memory_.fd(); }
  /// Identity of the memfd: equal in every process that maps the segment.
  const FileIdentity& identity() const noexcept { return memory_.identity(); }
  /// Unique within this process for the process's lifetime (never reused).
  std::uint64_t id() const noexcept { return id_; }
  /// The allocator that carves this segment, or nullptr for a received segment.
  const void* owner() const noexcept { return owner_; }
  /// True for a segment an allocator of this process created: not a received one, nor one
  /// a forked child inherited (its parent carves it, and pins what it sends of it).
  bool created_in_this_process() const noexcept;

  /// Records that the segment was passed to another process, so that its death is
  /// announced to the channels that passed it (see sent_segment_deaths()).
  void mark_sent() noexcept { sent_.store(true, std::memory_order_relaxed); }

  /// Remembers sent storages whose blocks lie in this segment, so that a block coming back
  /// (from a receiver that forwards it) resolves to the storage that was sent.
  void remember_storages(std::span<const std::shared_ptr<Storage>* const> storages);
  /// The live storage remembered for exactly this block, or nullptr.
  std::shared_ptr<Storage> find_storage(std::uint64_t offset, std::uint64_t nbytes);

 private:
  SharedSegment(SharedMemory memory, const void* owner);

  struct Remembered {
    std::uint64_t offset = kNoOffset;  // kNoOffset: empty
    std::uint64_t nbytes = 0;
    std::weak_ptr<Storage> storage;
  };
  static constexpr std::uint64_t kNoOffset = ~std::uint64_t{0};
  // The entry for `offset` (the empty one where it would go if there is none). Locked.
  inline Remembered& remembered_at(std::uint64_t offset) noexcept FERRY_REQUIRES(mutex_);

  SharedMemory memory_;
  const void* owner_;
  std::uint64_t generation_;  // fork generation that created or received it
  std::uint64_t id_;
  std::atomic<bool> sent_{false};
  std::atomic<bool> any_remembered_{false};
  detail::Mutex mutex_;
  // Open addressing by block offset (a power of two of entries, at most half full). A
  // recycled block overwrites its entry, so the table never holds more entries than the
  // segment has blocks, and entries are never removed.
  std::vector<Remembered> remembered_ FERRY_GUARDED_BY(mutex_);
  std::size_t remembered_count_ FERRY_GUARDED_BY(mutex_) = 0;
};

/// Counts the deaths of segments that were ever sent. A channel compares it with the value
/// it saw last to decide cheaply whether a segment it passed has died.
std::uint64_t sent_segment_deaths() noexcept;

}  // namespace ferry::detail
