// The memory behind a Storage: an Allocation, and the SharedBlock of a shared segment that
// every Device::SharedCpu storage occupies (what SharedAllocator::allocate() returns).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "ferry/detail/shared_segment.hpp"
#include "ferry/device.hpp"

namespace ferry {

/// Owns the bytes behind a Storage. Subclasses: private heap memory, a block of a shared
/// segment, and (with CUDA) device memory.
class Allocation {
 public:
  virtual ~Allocation() = default;
  /// First byte of the allocation (nullptr for an empty heap allocation).
  virtual std::byte* data() const noexcept = 0;
  /// Bytes usable by the storage.
  virtual std::size_t size() const noexcept = 0;
  /// Where the bytes live.
  virtual Device device() const noexcept = 0;
  /// The shared block behind this allocation, or nullptr when it is not shared memory.
  virtual const SharedBlock* shared_block() const noexcept { return nullptr; }
};

/// `size` bytes at `offset` in a shared segment: the memory behind every Device::SharedCpu
/// storage. Subclasses decide what happens when the block dies: an allocator's block goes
/// back to its free list, a received block is returned to the process that sent it.
class SharedBlock : public Allocation {
 public:
  /// The block of `size` bytes at `offset` in `segment` (the caller checked the bounds).
  SharedBlock(std::shared_ptr<detail::SharedSegment> segment, std::size_t offset, std::size_t size)
      : segment_(std::move(segment)), offset_(offset), size_(size) {}
  std::byte* data() const noexcept override { return segment_->data() + offset_; }
  std::size_t size() const noexcept override { return size_; }
  Device device() const noexcept override { return Device::SharedCpu; }
  const SharedBlock* shared_block() const noexcept override { return this; }

  /// The segment the block lies in.
  const std::shared_ptr<detail::SharedSegment>& segment() const noexcept { return segment_; }
  /// Offset of the block's first byte in its segment.
  std::size_t offset() const noexcept { return offset_; }
  /// For a block received from another process: appends the return boards of the
  /// connections it came through (the one it arrived on first, then those it was forwarded
  /// from), so that a process it is forwarded to can register as a holder on each of them
  /// (a sender upstream then keeps the block while that process lives, even when the
  /// forwarder dies). Appends nothing for a block of this process's own allocator.
  virtual void append_return_boards(std::vector<std::shared_ptr<detail::ReturnBoard>>& /*out*/) const {}
  /// True for a block received from another process (one that may have return boards to
  /// append): a sender asks before it looks for them, once per new storage it passes.
  bool received() const noexcept { return received_; }

 protected:
  /// For the block class of received blocks (append_return_boards()).
  void mark_received() noexcept { received_ = true; }

 private:
  std::shared_ptr<detail::SharedSegment> segment_;
  std::size_t offset_;
  std::size_t size_;
  bool received_ = false;
};

}  // namespace ferry
