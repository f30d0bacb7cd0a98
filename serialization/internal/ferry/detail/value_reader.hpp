// The decode of a received ferry::Value body, with every check against a hostile or broken
// peer (depth, element count, counts against the bytes left, bool bytes, UTF-8, duplicate
// keys), building what a Builder makes of each value: ferry::Value (value.cpp), or Python
// objects straight from the frame (the Python module), with no Value tree in between.
//
// A Builder provides Object, List and Map types and none(), boolean(b), integer(i),
// real(d), string(text), bytes(data), tensor(Tensor&&), list(count), append(List&, Object&&),
// finish(List&&), map(count), insert(Map&, key, Object&&) (false: the key is there already)
// and finish(Map&&). Text views point into the frame body, valid while the frame is read.
//
// Strings and map keys are checked as UTF-8 exactly once: by the reader, or by a Builder
// that declares `static constexpr bool kChecksUtf8 = true` (one that makes text objects
// whose own constructor checks anyway, such as Python's str). Such a Builder gets the text
// unchecked (in string() and insert()) and must refuse invalid UTF-8 with
// throw_invalid_value_utf8("string" or "map key").
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "ferry/detail/archive.hpp"
#include "ferry/error.hpp"
#include "ferry/tensor.hpp"
#include "ferry/tensor_wire.hpp"
#include "ferry/value.hpp"

namespace ferry::detail {

/// The values of one tree counted against kMaxValueElements: those read so far, and the
/// children every list and map read so far claimed (each value but the root is some
/// container's child, so an acceptable tree never claims more than kMaxValueElements - 1).
struct ValueBudget {
  std::size_t elements = 0;
  std::size_t claimed = 0;
};

[[noreturn]] void throw_value_too_deep();
[[noreturn]] void throw_too_many_value_elements();
[[noreturn]] void throw_value_count_above_body(const char* what, std::uint64_t count, std::size_t remaining);
[[noreturn]] void throw_value_children_above_budget(const char* what, std::uint64_t count);
[[noreturn]] void throw_invalid_value_utf8(const char* what);
[[noreturn]] void throw_duplicate_value_key(std::string_view key);
[[noreturn]] void throw_bad_value_byte(const char* what, unsigned byte);

template <class T>
T read_value_scalar(FrameInputArchive& archive) {
  T scalar;
  std::memcpy(&scalar, archive.take(sizeof(T)), sizeof(T));
  return scalar;
}

// The checks below run once per received value: inline, their failures out of line.

/// Counts one more value at `depth`; ProtocolError past kMaxValueDepth or kMaxValueElements.
inline void enter_received_value(std::size_t depth, ValueBudget& budget) {
  if (depth > kMaxValueDepth) [[unlikely]]
    throw_value_too_deep();
  if (++budget.elements > kMaxValueElements) [[unlikely]]
    throw_too_many_value_elements();
}

/// A count of elements that each take at least `min_bytes`; ProtocolError for a count
/// above what the body still holds (a lie that would make the decoder allocate without bound).
inline std::size_t read_value_count(FrameInputArchive& archive, std::size_t min_bytes, const char* what) {
  const auto count = read_value_scalar<std::uint64_t>(archive);
  if (count > archive.remaining() / min_bytes) [[unlikely]]
    throw_value_count_above_body(what, count, archive.remaining());
  return static_cast<std::size_t>(count);
}

/// The count of a list's or map's children, checked against the bytes left and against
/// what the element budget still allows, before the builder reserves room for them: all
/// the room a tree's containers reserve together stays under kMaxValueElements entries.
inline std::size_t read_value_children(FrameInputArchive& archive, std::size_t min_bytes, const char* what,
                                       ValueBudget& budget) {
  const std::size_t count = read_value_count(archive, min_bytes, what);
  // The root is the one value no container claims.
  if (count > kMaxValueElements - 1 - budget.claimed) [[unlikely]]
    throw_value_children_above_budget(what, count);
  budget.claimed += count;
  return count;
}

/// A length-prefixed text of the body, checked as UTF-8 when `utf8`.
inline std::string_view read_value_text(FrameInputArchive& archive, bool utf8, const char* what) {
  const std::size_t length = read_value_count(archive, 1, what);
  const std::string_view text(reinterpret_cast<const char*>(archive.take(length)), length);
  if (utf8 && !is_valid_utf8(text)) [[unlikely]]
    throw_invalid_value_utf8(what);
  return text;
}

/// Whether `Builder` checks the UTF-8 of strings and keys itself (see the top of this file).
template <class Builder>
constexpr bool builder_checks_utf8() {
  if constexpr (requires { Builder::kChecksUtf8; }) {
    return Builder::kChecksUtf8;
  } else {
    return false;
  }
}

template <class Builder>
typename Builder::Object read_value(FrameInputArchive& archive, Builder& builder, std::size_t depth,
                                    ValueBudget& budget) {
  constexpr bool kReaderChecksUtf8 = !builder_checks_utf8<Builder>();
  enter_received_value(depth, budget);
  const auto raw_kind = read_value_scalar<std::uint8_t>(archive);
  switch (static_cast<ValueKind>(raw_kind)) {
    case ValueKind::None: return builder.none();
    case ValueKind::Bool: {
      const auto raw = read_value_scalar<std::uint8_t>(archive);
      if (raw > 1) throw_bad_value_byte("bool byte", raw);
      return builder.boolean(raw == 1);
    }
    case ValueKind::Int: return builder.integer(read_value_scalar<std::int64_t>(archive));
    case ValueKind::Float: return builder.real(read_value_scalar<double>(archive));
    case ValueKind::String: return builder.string(read_value_text(archive, kReaderChecksUtf8, "string"));
    case ValueKind::Bytes: return builder.bytes(read_value_text(archive, false, "bytes"));
    case ValueKind::Tensor: {
      Tensor tensor;
      archive(tensor);
      return builder.tensor(std::move(tensor));
    }
    case ValueKind::List: {
      const std::size_t count = read_value_children(archive, 1, "list", budget);
      typename Builder::List list = builder.list(count);
      for (std::size_t i = 0; i < count; ++i) builder.append(list, read_value(archive, builder, depth + 1, budget));
      return builder.finish(std::move(list));
    }
    case ValueKind::Map: {
      // An entry takes at least a key length (8 bytes) and a kind byte.
      const std::size_t count = read_value_children(archive, sizeof(std::uint64_t) + 1, "map", budget);
      typename Builder::Map map = builder.map(count);
      for (std::size_t i = 0; i < count; ++i) {
        const std::string_view key = read_value_text(archive, kReaderChecksUtf8, "map key");
        if (!builder.insert(map, key, read_value(archive, builder, depth + 1, budget))) throw_duplicate_value_key(key);
      }
      return builder.finish(std::move(map));
    }
  }
  throw_bad_value_byte("kind byte", raw_kind);
}

}  // namespace ferry::detail
