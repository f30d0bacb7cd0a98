// The shared segment behind a ring: a sealed memfd holding a RingHeader and the data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "ferry/detail/mapping.hpp"
#include "ferry/detail/unique_fd.hpp"
#include "ring/ring_layout.hpp"

namespace ferry {

/// One process's mapping of a ring segment (see ring_layout.hpp). Move-only; owns the
/// memfd and the mapping. The memfd has no name in any file system, so nothing is left
/// behind when every process holding it exits, however it exits.
class RingSegment {
 public:
  RingSegment() = default;
  /// Creates a segment whose data holds ring_capacity_for(`capacity`) bytes. Its pages are
  /// reserved at once (OutOfSharedMemory when memory is short, never SIGBUS later).
  static RingSegment create(std::size_t capacity);
  /// Maps a segment created by another process (passed as an inherited fd), after checking
  /// that it is a sealed memfd whose header and size describe a valid ring; throws
  /// ProtocolError naming the failed check.
  static RingSegment attach(detail::UniqueFd fd);

  RingSegment(RingSegment&& other) noexcept;
  RingSegment& operator=(RingSegment&& other) noexcept;
  RingSegment(const RingSegment&) = delete;
  RingSegment& operator=(const RingSegment&) = delete;
  ~RingSegment() = default;

  RingHeader& header() const noexcept { return *header_; }
  /// The data, mapped twice in a row: data()[i] and data()[i + capacity()] are the same
  /// byte, so `capacity()` bytes from any offset below capacity() are contiguous.
  std::byte* data() const noexcept { return data_; }
  /// Bytes of data; a power of two. This process's own copy, never re-read from the segment.
  std::uint64_t capacity() const noexcept { return capacity_; }
  int fd() const noexcept { return fd_.get(); }
  explicit operator bool() const noexcept { return header_ != nullptr; }
  /// Unmaps the segment and closes the memfd.
  void reset() noexcept;

 private:
  RingSegment(detail::UniqueFd fd, detail::Mapping mapping, std::uint64_t capacity);

  detail::UniqueFd fd_;
  detail::Mapping mapping_;
  RingHeader* header_ = nullptr;
  std::byte* data_ = nullptr;
  std::uint64_t capacity_ = 0;
};

}  // namespace ferry
