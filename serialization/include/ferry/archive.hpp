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
#include <type_traits>
#include <vector>

#include "ferry/byte_buffer.hpp"
#include "ferry/error.hpp"

namespace ferry {

class MessageEncoder;
class Storage;

/// Output archive: appends to `body`; tensors register their storages with `encoder`.
class FrameOutputArchive : public cereal::OutputArchive<FrameOutputArchive, cereal::AllowEmptyClassElision> {
 public:
  FrameOutputArchive(ByteBuffer& body, MessageEncoder& encoder) : OutputArchive(this), body_(body), encoder_(encoder) {}

  void save_bytes(const void* data, std::size_t size) { body_.append(data, size); }
  MessageEncoder& encoder() noexcept { return encoder_; }

 private:
  ByteBuffer& body_;
  MessageEncoder& encoder_;
};

/// Input archive: reads from a received body; every read is bounds-checked and a short
/// body raises ProtocolError. Tensors resolve their table index through `storages`.
class FrameInputArchive : public cereal::InputArchive<FrameInputArchive, cereal::AllowEmptyClassElision> {
 public:
  FrameInputArchive(std::span<const std::byte> body, std::span<const std::shared_ptr<Storage>> storages)
      : InputArchive(this), body_(body), storages_(storages) {}

  void load_bytes(void* data, std::size_t size) {
    // Small enough to inline: a read of a scalar becomes a bounds check and a move.
    if (size > remaining()) [[unlikely]] throw_truncated(size);
    if (size > 0) std::memcpy(data, body_.data() + position_, size);
    position_ += size;
  }
  std::size_t remaining() const noexcept { return body_.size() - position_; }
  std::span<const std::shared_ptr<Storage>> storages() const noexcept { return storages_; }

 private:
  [[noreturn, gnu::noinline, gnu::cold]] void throw_truncated(std::size_t size) const {
    throw ProtocolError("message body is truncated: needed " + std::to_string(size) + " more bytes at offset " +
                        std::to_string(position_) + " of " + std::to_string(body_.size()));
  }

  std::span<const std::byte> body_;
  std::size_t position_ = 0;
  std::span<const std::shared_ptr<Storage>> storages_;
};

}  // namespace ferry

// Serialization of the primitives that cereal's containers reduce to, for ferry's archives
// (the same set cereal's own binary archive provides).
namespace cereal {

template <class T>
inline std::enable_if_t<std::is_arithmetic_v<T>> CEREAL_SAVE_FUNCTION_NAME(ferry::FrameOutputArchive& ar,
                                                                            const T& value) {
  ar.save_bytes(std::addressof(value), sizeof(value));
}

template <class T>
inline std::enable_if_t<std::is_arithmetic_v<T>> CEREAL_LOAD_FUNCTION_NAME(ferry::FrameInputArchive& ar, T& value) {
  ar.load_bytes(std::addressof(value), sizeof(value));
  if constexpr (std::is_same_v<T, bool>) {
    // A byte other than 0 or 1 is not a valid bool: reading it would be undefined behaviour.
    unsigned char raw = 0;
    std::memcpy(&raw, std::addressof(value), 1);
    if (raw > 1) throw ferry::ProtocolError("message body holds a bool that is neither 0 nor 1");
  }
}

template <class Archive, class T>
inline CEREAL_ARCHIVE_RESTRICT(ferry::FrameInputArchive, ferry::FrameOutputArchive)
    CEREAL_SERIALIZE_FUNCTION_NAME(Archive& ar, NameValuePair<T>& pair) {
  ar(pair.value);
}

template <class T>
inline void CEREAL_SAVE_FUNCTION_NAME(ferry::FrameOutputArchive& ar, const SizeTag<T>& tag) {
  ar(tag.size);
}

template <class T>
inline void CEREAL_LOAD_FUNCTION_NAME(ferry::FrameInputArchive& ar, SizeTag<T>& tag) {
  ar(tag.size);
  // Every element takes at least one byte, so a count above the bytes left is a lie that
  // would make the container allocate without bound.
  if (static_cast<std::uint64_t>(tag.size) > ar.remaining()) {
    throw ferry::ProtocolError("message body holds a container size of " + std::to_string(tag.size) +
                               " elements but only " + std::to_string(ar.remaining()) + " bytes remain");
  }
}

template <class T>
inline void CEREAL_SAVE_FUNCTION_NAME(ferry::FrameOutputArchive& ar, const BinaryData<T>& data) {
  ar.save_bytes(data.data, static_cast<std::size_t>(data.size));
}

template <class T>
inline void CEREAL_LOAD_FUNCTION_NAME(ferry::FrameInputArchive& ar, BinaryData<T>& data) {
  ar.load_bytes(data.data, static_cast<std::size_t>(data.size));
}

}  // namespace cereal

CEREAL_REGISTER_ARCHIVE(ferry::FrameOutputArchive)
CEREAL_REGISTER_ARCHIVE(ferry::FrameInputArchive)
CEREAL_SETUP_ARCHIVE_TRAITS(ferry::FrameInputArchive, ferry::FrameOutputArchive)
