// The body of the frame being encoded, and the memory a transport may lend for it so that a
// large body is written once, straight where the receiver reads it.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

namespace ferry::detail {

/// Memory that a transport lends for the body of the frame being encoded (the shared-memory
/// ring lends free ring space): a large body serialized there needs no second copy into the
/// transport. Nothing in lent memory is visible to the receiver before the frame is written.
class BodySpace {
 public:
  /// Writable memory for a body of at least `bytes` bytes; it starts where memory lent
  /// earlier for the same frame starts (what was written there stays), and may be larger
  /// than asked. Empty when the transport cannot lend that much now: the body then stays
  /// in private memory. Valid until the frame is written or the next frame is started.
  virtual std::span<std::byte> lend(std::size_t bytes) = 0;

 protected:
  ~BodySpace() = default;
};

/// A frame body under construction: the output archive appends to it. Bytes go into a
/// private buffer, reused from frame to frame; a body given a BodySpace moves into lent
/// memory once it reaches kLendFrom bytes (small bodies never do: the extra bookkeeping
/// would cost more than the copy it saves).
///
/// Borrowing (allow_borrowing()): a body without a BodySpace may end with bytes that stay
/// where the message holds them (append_borrowed()), written from there: the frame is then
/// valid only while the message lives unchanged.
class FrameBody {
 public:
  static constexpr std::size_t kLendFrom = std::size_t{16} << 10;
  /// The fewest bytes append_borrowed() leaves in place (fewer are copied in).
  static constexpr std::size_t kBorrowFrom = kLendFrom;

  /// Empties the body; `space` (may be null) lends memory once the body grows large.
  void reset(BodySpace* space) noexcept {
    data_ = own_.data();
    size_ = 0;
    capacity_ = own_.size();
    space_ = space;
    lent_ = false;
    borrowed_ = {};
    update_fast_end();
  }
  /// Whether append_borrowed() may leave bytes in place, for every later body (off at
  /// first): only for a caller that writes each frame before its message can change or die.
  void allow_borrowing(bool allowed) noexcept { borrowing_allowed_ = allowed; }
  /// Appends `size` bytes that the message holds: left in place (borrowed()) when borrowing
  /// is allowed, the body has no BodySpace and borrowed nothing yet, and they are at least
  /// kBorrowFrom bytes; copied in otherwise. Bytes appended after them are copied in after
  /// them, and then these are copied in first.
  void append_borrowed(const void* bytes, std::size_t size) {
    if (!borrowing_allowed_ || space_ != nullptr || size < kBorrowFrom || !borrowed_.empty()) {
      append(bytes, size);
      return;
    }
    borrowed_ = {static_cast<const std::byte*>(bytes), size};
    update_fast_end();  // whatever follows goes through make_room()
  }
  /// Appends `size` bytes.
  void append(const void* bytes, std::size_t size) {
    if (size > fast_end_ - size_) make_room(size);
    if (size > 0) std::memcpy(data_ + size_, bytes, size);
    size_ += size;
  }
  /// Appends `size` bytes that the caller writes at the address returned, before the next
  /// call (a record written in place instead of copied in).
  std::byte* extend(std::size_t size) {
    if (size > fast_end_ - size_) make_room(size);
    std::byte* const at = data_ + size_;
    size_ += size;
    return at;
  }
  /// The body's bytes in its buffer (or lent memory); borrowed() follows them.
  std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  /// The bytes left where the message holds them, after bytes() (empty: none).
  std::span<const std::byte> borrowed() const noexcept { return borrowed_; }
  /// The whole body: bytes() and borrowed().
  std::size_t size() const noexcept { return size_ + borrowed_.size(); }
  /// True when the body lies in memory lent by the BodySpace.
  bool lent() const noexcept { return lent_; }

 private:
  // Makes room for `size` more bytes: copies borrowed bytes in, moves into lent memory,
  // grows it, or grows (or moves back into) the private buffer.
  void make_room(std::size_t size);
  // The size up to which append() needs no decision: the capacity, or just below kLendFrom
  // while the body may still move into lent memory, or none while bytes are borrowed.
  void update_fast_end() noexcept {
    fast_end_ = !borrowed_.empty()                                      ? size_
                : space_ != nullptr && !lent_ && capacity_ >= kLendFrom ? kLendFrom - 1
                                                                        : capacity_;
  }

  std::vector<std::byte> own_;  // the private buffer; its whole size is usable
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  std::size_t fast_end_ = 0;
  BodySpace* space_ = nullptr;
  bool lent_ = false;
  std::span<const std::byte> borrowed_;
  bool borrowing_allowed_ = false;
};

}  // namespace ferry::detail
