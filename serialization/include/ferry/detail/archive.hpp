// ferry's cereal archives: binary archives that write a message body into a reusable
// buffer and carry the out-of-band state of one frame (its table of storages), so that a
// Tensor met while serializing writes metadata and a table index instead of its bytes.
#pragma once

#include <cereal/cereal.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "ferry/detail/frame_body.hpp"
#include "ferry/detail/pending_body.hpp"
#include "ferry/error.hpp"

namespace ferry {
class Storage;
}  // namespace ferry

namespace ferry::detail {

class MessageEncoder;

/// Output archive: appends to `body` (which may lie in memory a transport lent, see
/// FrameBody); tensors register their storages with `encoder`.
class FrameOutputArchive : public cereal::OutputArchive<FrameOutputArchive, cereal::AllowEmptyClassElision> {
 public:
  // Out of line (archive.cpp), as the input archive's and StorageCollector's: cereal's
  // archive state (hash tables, maps) is built and torn down there, not in every
  // translation unit that sends.
  FrameOutputArchive(FrameBody& body, MessageEncoder& encoder);
  ~FrameOutputArchive() override;

  void save_bytes(const void* data, std::size_t size) { body_.append(data, size); }
  /// Saves an array's bytes (cereal's binary_data): the bytes offered by offer_borrow()
  /// are appended borrowed (FrameBody::append_borrowed), any others copied.
  void save_binary(const void* data, std::size_t size) {
    if (data != offered_ || size != offered_size_ || data == nullptr) {
      body_.append(data, size);
      return;
    }
    offered_ = nullptr;
    body_.append_borrowed(data, size);
  }
  /// Marks the elements of the message being written (a byte message's own elements,
  /// alive until its frame is written: see detail::write_body) as bytes the body may leave
  /// in place; offer_borrow(nullptr, 0) withdraws the offer.
  void offer_borrow(const void* data, std::size_t size) noexcept {
    offered_ = data;
    offered_size_ = size;
  }
  /// Appends `size` bytes for the caller to write at the address returned (FrameBody::extend).
  std::byte* extend(std::size_t size) { return body_.extend(size); }
  MessageEncoder& encoder() noexcept { return encoder_; }
  /// True when the archive may serve the next frame as it is: none of cereal's own state
  /// (shared pointers met, polymorphic types named, class versions written, virtual bases,
  /// deferred data) was touched, so it is what a new archive would be. Making and dropping
  /// cereal's hash tables costs a small message more than serializing it, so an encoder
  /// keeps its archive while this holds (archive.cpp; false for a cereal whose members
  /// this build does not know).
  bool reusable() const noexcept;

 private:
  FrameBody& body_;
  MessageEncoder& encoder_;
  const void* offered_ = nullptr;  // offer_borrow()
  std::size_t offered_size_ = 0;
};

/// Input archive: reads from a received body; every read is bounds-checked and a short
/// body raises ProtocolError. Tensors resolve their table index through `storages`. A body
/// whose end is still in the transport (defer()) is read from there as the archive gets to
/// it: the elements of a large vector or string straight into its storage (read_out()).
class FrameInputArchive : public cereal::InputArchive<FrameInputArchive, cereal::AllowEmptyClassElision> {
 public:
  /// The fewest pending bytes that read_out() reads straight into their destination (fewer
  /// are read into place and copied).
  static constexpr std::size_t kReadOutFrom = std::size_t{4} << 10;

  FrameInputArchive(std::span<const std::byte> body, std::span<const std::shared_ptr<Storage>> storages);
  ~FrameInputArchive() override;
  /// Starts over on another body, for an archive that is reusable().
  void restart(std::span<const std::byte> body, std::span<const std::shared_ptr<Storage>> storages) noexcept {
    body_ = body;
    position_ = 0;
    storages_ = storages;
    takeable_ = nullptr;
    pending_ = nullptr;
    ready_ = body.size();
  }
  /// restart(), on `storages` that are a frame's own references, dropped after the body:
  /// the tensor whose record ends the body may take its storage's over (storage_to_take()).
  void restart_on_frame(std::span<const std::byte> body, std::span<std::shared_ptr<Storage>> storages) noexcept {
    restart(body, storages);
    takeable_ = storages.data();
  }
  /// The body's bytes after pending->ready() are still in the transport: read them from
  /// `pending` as the archive gets to them (for the body last given; null: none are).
  void defer(PendingBody* pending) noexcept {
    pending_ = pending;
    ready_ = pending != nullptr ? pending->ready() : body_.size();
  }
  /// As FrameOutputArchive::reusable(): reading the last body touched none of cereal's
  /// state, so the archive may read the next one.
  bool reusable() const noexcept;

  void load_bytes(void* data, std::size_t size) {
    const std::byte* bytes = take(size);
    if (size > 0) std::memcpy(data, bytes, size);
  }
  /// Consumes the next `count` elements of `element_size` bytes and returns where they
  /// lie; ProtocolError when fewer bytes remain. They may lie in memory the peer can still
  /// write (a ring): copy them out once, then check the copy.
  const std::byte* take(std::uint64_t count, std::size_t element_size = 1) {
    if (count > remaining() / element_size) throw_truncated(count, element_size);
    const std::byte* bytes = body_.data() + position_;
    position_ += static_cast<std::size_t>(count) * element_size;
    if (position_ > ready_) [[unlikely]]
      ready_ = pending_->fill(position_);
    return bytes;
  }
  /// True when the next `count` elements of `element_size` bytes are in the body and at
  /// least kReadOutFrom of their bytes are still in the transport (see read_out()).
  bool pending_elements(std::uint64_t count, std::size_t element_size) const noexcept {
    return pending_ != nullptr && count <= remaining() / element_size &&
           position_ + static_cast<std::size_t>(count) * element_size >= ready_ + kReadOutFrom;
  }
  /// Consumes the next `size` bytes into `into`: those already read by copying, the rest
  /// straight from the transport. Only after pending_elements() said so for them.
  void read_out(void* into, std::size_t size) {
    auto* out = static_cast<std::byte*>(into);
    const std::size_t in_place = ready_ - position_;
    if (in_place > 0) std::memcpy(out, body_.data() + position_, in_place);
    pending_->read_out(out + in_place, size - in_place);
    position_ += size;
    ready_ = position_;
  }
  std::size_t remaining() const noexcept { return body_.size() - position_; }
  std::span<const std::shared_ptr<Storage>> storages() const noexcept { return storages_; }
  /// The reference to storages()[index] (index in range) that a tensor may take over
  /// (moved from): for the record that ends the body, as no later record can name the
  /// storage, of a frame's own storages (restart_on_frame()). Null otherwise.
  std::shared_ptr<Storage>* storage_to_take(std::size_t index) const noexcept {
    return takeable_ != nullptr && remaining() == 0 ? takeable_ + index : nullptr;
  }

 private:
  // Out of line (archive.cpp), so that take() stays small enough to inline everywhere.
  [[noreturn]] void throw_truncated(std::uint64_t count, std::size_t element_size) const;

  std::span<const std::byte> body_;
  std::size_t position_ = 0;
  std::span<const std::shared_ptr<Storage>> storages_;
  std::shared_ptr<Storage>* takeable_ = nullptr;  // storages_, when they are the frame's own
  PendingBody* pending_ = nullptr;                // defer(); null when the whole body is in place
  std::size_t ready_ = 0;                         // bytes of the body in place (or read out); position_ <= ready_
};

/// The check of a received container's size (cereal's SizeTag, below) failed: out of line,
/// so that every container's load does not carry the message's construction.
[[noreturn]] void throw_container_size_above_body(std::uint64_t size, std::size_t remaining);

}  // namespace ferry::detail

// Serialization of the primitives that cereal's containers reduce to, for ferry's archives
// (the same set cereal's own binary archive provides).
namespace cereal {

template <class T>
inline std::enable_if_t<std::is_arithmetic_v<T>> CEREAL_SAVE_FUNCTION_NAME(ferry::detail::FrameOutputArchive& ar,
                                                                           const T& value) {
  ar.save_bytes(std::addressof(value), sizeof(value));
}

template <class T>
inline std::enable_if_t<std::is_arithmetic_v<T>> CEREAL_LOAD_FUNCTION_NAME(ferry::detail::FrameInputArchive& ar,
                                                                           T& value) {
  ar.load_bytes(std::addressof(value), sizeof(value));
  if constexpr (std::is_same_v<T, bool>) {
    // A byte other than 0 or 1 is not a valid bool: reading it would be undefined behaviour.
    unsigned char raw = 0;
    std::memcpy(&raw, std::addressof(value), 1);
    if (raw > 1) throw ferry::ProtocolError("message body holds a bool that is neither 0 nor 1");
  }
}

template <class Archive, class T>
inline CEREAL_ARCHIVE_RESTRICT(ferry::detail::FrameInputArchive, ferry::detail::FrameOutputArchive)
    CEREAL_SERIALIZE_FUNCTION_NAME(Archive& ar, NameValuePair<T>& pair) {
  ar(pair.value);
}

template <class T>
inline void CEREAL_SAVE_FUNCTION_NAME(ferry::detail::FrameOutputArchive& ar, const SizeTag<T>& tag) {
  ar(tag.size);
}

template <class T>
inline void CEREAL_LOAD_FUNCTION_NAME(ferry::detail::FrameInputArchive& ar, SizeTag<T>& tag) {
  ar(tag.size);
  // Every element takes at least one byte, so a count above the bytes left is a lie that
  // would make the container allocate without bound.
  if (static_cast<std::uint64_t>(tag.size) > ar.remaining()) {
    ferry::detail::throw_container_size_above_body(static_cast<std::uint64_t>(tag.size), ar.remaining());
  }
}

namespace detail {

// Copies `count` elements of T from the input body into `out`, a vector or a string, with
// one copy: assign() from a contiguous range of a trivially copyable type is a memmove into
// fresh storage, where cereal's resize() would zero-fill every element first. A range not
// aligned for T (a body's fields are packed) is read with resize() and memcpy instead.
//
// Elements still in the transport (FrameInputArchive::read_out()) are read straight into
// the container's storage, zero-filled first by resize() (a fill costs a fraction of a copy).
template <class T, class Container>
void assign_elements(ferry::detail::FrameInputArchive& ar, Container& out, std::uint64_t count) {
  static_assert(std::is_trivially_copyable_v<T>);
  const auto n = static_cast<std::size_t>(count);
  if (ar.pending_elements(count, sizeof(T))) [[unlikely]] {
    out.resize(n);
    ar.read_out(out.data(), n * sizeof(T));
    return;
  }
  const std::byte* bytes = ar.take(count, sizeof(T));
  if (reinterpret_cast<std::uintptr_t>(bytes) % alignof(T) == 0) {
    const auto* first = reinterpret_cast<const T*>(bytes);
    out.assign(first, first + n);
  } else {
    out.resize(n);
    if (n > 0) std::memcpy(out.data(), bytes, n * sizeof(T));
  }
}

}  // namespace detail

// A vector of numbers and a string: copied once from the body (see detail::assign_elements),
// same wire format as cereal's own (a size tag, then the elements' bytes). More specialized
// than cereal's templates, so these are the ones chosen for ferry's input archive.
template <class T, class A>
inline std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, bool>> CEREAL_LOAD_FUNCTION_NAME(
    ferry::detail::FrameInputArchive& ar, std::vector<T, A>& vector) {
  size_type count = 0;
  ar(make_size_tag(count));
  detail::assign_elements<T>(ar, vector, count);
}

template <class CharT, class Traits, class Alloc>
inline void CEREAL_LOAD_FUNCTION_NAME(ferry::detail::FrameInputArchive& ar,
                                      std::basic_string<CharT, Traits, Alloc>& string) {
  size_type count = 0;
  ar(make_size_tag(count));
  detail::assign_elements<CharT>(ar, string, count);
}

template <class T>
inline void CEREAL_SAVE_FUNCTION_NAME(ferry::detail::FrameOutputArchive& ar, const BinaryData<T>& data) {
  ar.save_binary(data.data, static_cast<std::size_t>(data.size));
}

template <class T>
inline void CEREAL_LOAD_FUNCTION_NAME(ferry::detail::FrameInputArchive& ar, BinaryData<T>& data) {
  ar.load_bytes(data.data, static_cast<std::size_t>(data.size));
}

}  // namespace cereal

CEREAL_REGISTER_ARCHIVE(ferry::detail::FrameOutputArchive)
CEREAL_REGISTER_ARCHIVE(ferry::detail::FrameInputArchive)
CEREAL_SETUP_ARCHIVE_TRAITS(ferry::detail::FrameInputArchive, ferry::detail::FrameOutputArchive)
