// ByteBuffer: the reusable buffer a message body is written into.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>

namespace ferry {

/// A growable array of bytes that keeps its memory across clear(). Unlike std::vector,
/// appending never zero-fills first, and an append that fits is small enough to inline,
/// so that writing a scalar field of a message costs a bounds check and a move.
class ByteBuffer {
 public:
  ByteBuffer() = default;
  ByteBuffer(const ByteBuffer&) = delete;
  ByteBuffer& operator=(const ByteBuffer&) = delete;

  /// Appends `size` bytes from `bytes`.
  void append(const void* bytes, std::size_t size) {
    if (size > capacity_ - size_) [[unlikely]] grow(size);
    if (size > 0) std::memcpy(data_.get() + size_, bytes, size);
    size_ += size;
  }
  /// Forgets the contents; keeps the memory.
  void clear() noexcept { size_ = 0; }
  const std::byte* data() const noexcept { return data_.get(); }
  std::size_t size() const noexcept { return size_; }

 private:
  [[gnu::noinline]] void grow(std::size_t more) {
    const std::size_t capacity = std::max({2 * capacity_, size_ + more, std::size_t{256}});
    std::unique_ptr<std::byte[]> bigger(new std::byte[capacity]);
    if (size_ > 0) std::memcpy(bigger.get(), data_.get(), size_);
    data_ = std::move(bigger);
    capacity_ = capacity;
  }

  std::unique_ptr<std::byte[]> data_;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

}  // namespace ferry
