#include "ferry/detail/frame_body.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace ferry {

void detail::FrameBody::make_room(std::size_t size) {
  if (!borrowed_.empty()) {
    // Bytes follow the borrowed ones: copy those in first, to keep the body in order.
    const std::span<const std::byte> borrowed = borrowed_;
    borrowed_ = {};
    update_fast_end();
    append(borrowed.data(), borrowed.size());
    if (size <= fast_end_ - size_) return;
  }
  if (size > std::numeric_limits<std::size_t>::max() - size_) throw std::length_error("frame body too large");
  const std::size_t needed = size_ + size;
  if (space_ != nullptr && needed >= kLendFrom) {
    const std::span<std::byte> lent = space_->lend(needed);
    if (lent.size() >= needed) {
      if (!lent_) {
        if (size_ > 0) std::memcpy(lent.data(), data_, size_);
        lent_ = true;
      } else if (lent.data() != data_) {
        throw std::logic_error("a BodySpace lent memory at a new address for the same frame");
      }
      data_ = lent.data();
      capacity_ = lent.size();
      update_fast_end();
      return;
    }
    // The transport cannot lend that much now: the body continues in private memory.
    space_ = nullptr;
  }
  if (lent_ || needed > own_.size()) {
    const bool was_lent = lent_;
    if (needed > own_.size()) {
      // Only grows: the buffer is reused by every later frame of the connection.
      const std::size_t grown = std::max({needed, 2 * own_.size(), std::size_t{256}});
      if (was_lent) {
        own_.clear();  // nothing to keep: the body is copied back from lent memory below
      }
      own_.resize(grown);
    }
    if (was_lent && size_ > 0) std::memcpy(own_.data(), data_, size_);
    data_ = own_.data();
    capacity_ = own_.size();
    lent_ = false;
  }
  update_fast_end();
}

}  // namespace ferry
