#include "ferry/value.hpp"

#include <cstring>
#include <iterator>
#include <string_view>
#include <unordered_set>

#include "ferry/detail/value_reader.hpp"
#include "ferry/tensor_wire.hpp"

namespace ferry {

// The wire record of a Value (little-endian as in memory, packed): the kind (u8), then
//   Bool: u8 (0 or 1); Int: i64; Float: f64; String, Bytes: length (u64) and the bytes;
//   Tensor: the tensor record of tensor_wire.cpp; List: count (u64) and the elements;
//   Map: count (u64) and, per entry, the key (as a String without kind byte) and the value.

std::string_view value_kind_name(ValueKind kind) {
  switch (kind) {
    case ValueKind::None: return "none";
    case ValueKind::Bool: return "bool";
    case ValueKind::Int: return "int";
    case ValueKind::Float: return "float";
    case ValueKind::String: return "string";
    case ValueKind::Bytes: return "bytes";
    case ValueKind::Tensor: return "tensor";
    case ValueKind::List: return "list";
    case ValueKind::Map: return "map";
  }
  return "invalid";
}

// ---- ValueMap ---------------------------------------------------------------------------

Value* ValueMap::find(std::string_view key) {
  for (Entry& entry : entries_) {
    if (entry.first == key) return &entry.second;
  }
  return nullptr;
}

const Value* ValueMap::find(std::string_view key) const {
  for (const Entry& entry : entries_) {
    if (entry.first == key) return &entry.second;
  }
  return nullptr;
}

Value& ValueMap::at(std::string_view key) {
  if (Value* value = find(key)) return *value;
  throw Error("the Value map has no key '" + std::string(key) + "'");
}

const Value& ValueMap::at(std::string_view key) const {
  if (const Value* value = find(key)) return *value;
  throw Error("the Value map has no key '" + std::string(key) + "'");
}

Value& ValueMap::operator[](std::string_view key) {
  if (Value* value = find(key)) return *value;
  return entries_.emplace_back(std::string(key), Value()).second;
}

void ValueMap::insert_or_assign(std::string key, Value value) {
  if (Value* present = find(key)) {
    *present = std::move(value);
    return;
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

// ---- Value --------------------------------------------------------------------------------

double Value::as_float() const {
  if (const auto* integer = std::get_if<std::int64_t>(&data_)) return static_cast<double>(*integer);
  return get<double>(ValueKind::Float);
}

const Value& Value::operator[](std::size_t index) const {
  const ValueList& list = as_list();
  if (index >= list.size()) {
    throw Error("index " + std::to_string(index) + " is out of range of a Value list of " +
                std::to_string(list.size()) + " elements");
  }
  return list[index];
}

Value& Value::operator[](std::size_t index) { return const_cast<Value&>(static_cast<const Value&>(*this)[index]); }

void Value::throw_wrong_kind(ValueKind wanted) const {
  throw Error("the Value holds " + std::string(value_kind_name(kind())) + ", not " +
              std::string(value_kind_name(wanted)));
}

void Value::throw_unsigned_overflow(std::uint64_t value) {
  throw Error("the unsigned integer " + std::to_string(value) + " does not fit in a Value's int64");
}

bool is_valid_utf8(std::string_view text) noexcept {
  const auto* at = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char* const end = at + text.size();
  while (at < end) {
    // ASCII, 8 bytes at a time (names and keys usually are): no byte with the top bit set.
    while (end - at >= 8) {
      std::uint64_t word;
      std::memcpy(&word, at, sizeof word);
      if ((word & 0x8080808080808080ull) != 0) break;
      at += 8;
    }
    if (at == end) break;
    const unsigned char lead = *at;
    if (lead < 0x80) {
      ++at;
      continue;
    }
    std::size_t length = 0;
    std::uint32_t code = 0;
    if ((lead & 0xE0) == 0xC0) {
      length = 2;
      code = lead & 0x1F;
    } else if ((lead & 0xF0) == 0xE0) {
      length = 3;
      code = lead & 0x0F;
    } else if ((lead & 0xF8) == 0xF0) {
      length = 4;
      code = lead & 0x07;
    } else {
      return false;
    }
    if (static_cast<std::size_t>(end - at) < length) return false;
    for (std::size_t i = 1; i < length; ++i) {
      if ((at[i] & 0xC0) != 0x80) return false;
      code = (code << 6) | (at[i] & 0x3F);
    }
    static constexpr std::uint32_t kSmallest[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < kSmallest[length] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
    at += length;
  }
  return true;
}

// ---- the wire -----------------------------------------------------------------------------

namespace {

// Counts the values of one tree against the limits, on both sides of the wire.
struct TreeBudget {
  std::size_t elements = 0;
};

void save_text(detail::FrameOutputArchive& archive, const std::string& text) {
  archive(static_cast<std::uint64_t>(text.size()));
  archive.save_bytes(text.data(), text.size());
}

void save_value(detail::FrameOutputArchive& archive, const Value& value, std::size_t depth, TreeBudget& budget) {
  if (depth > kMaxValueDepth) {
    throw Error("a Value nested deeper than " + std::to_string(kMaxValueDepth) +
                " levels cannot be sent (the receiver refuses it); flatten the message");
  }
  if (++budget.elements > kMaxValueElements) {
    throw Error("a Value of more than " + std::to_string(kMaxValueElements) +
                " elements cannot be sent (the receiver refuses it); put bulk data in a Tensor or Bytes");
  }
  archive(static_cast<std::uint8_t>(value.kind()));
  switch (value.kind()) {
    case ValueKind::None: return;
    case ValueKind::Bool: archive(static_cast<std::uint8_t>(value.as_bool() ? 1 : 0)); return;
    case ValueKind::Int: archive(value.as_int()); return;
    case ValueKind::Float: archive(value.as_float()); return;
    case ValueKind::String: save_text(archive, value.as_string()); return;
    case ValueKind::Bytes: save_text(archive, value.as_bytes().data); return;
    case ValueKind::Tensor: archive(value.as_tensor()); return;
    case ValueKind::List:
      archive(static_cast<std::uint64_t>(value.as_list().size()));
      for (const Value& element : value.as_list()) save_value(archive, element, depth + 1, budget);
      return;
    case ValueKind::Map:
      archive(static_cast<std::uint64_t>(value.as_map().size()));
      for (const auto& [key, element] : value.as_map()) {
        save_text(archive, key);
        save_value(archive, element, depth + 1, budget);
      }
      return;
  }
}

// Builds the received tree as ferry::Value, each value in place (returned by value into its
// parent's storage): no temporary Value is moved or assigned on the way.
class ValueBuilder {
 public:
  using Object = Value;
  using List = ValueList;
  struct Map {
    ValueMap entries;
    std::size_t count;
    std::unordered_set<std::string_view> keys;  // views of the keys in `entries`, for large maps
  };

  Value none() { return Value(); }
  Value boolean(bool flag) { return Value(flag); }
  Value integer(std::int64_t number) { return Value(number); }
  Value real(double number) { return Value(number); }
  Value string(std::string_view text) { return Value(std::string(text)); }
  Value bytes(std::string_view data) { return Value(Bytes{std::string(data)}); }
  Value tensor(Tensor&& tensor) { return Value(std::move(tensor)); }
  ValueList list(std::size_t count) {
    ValueList list;
    list.reserve(count);
    return list;
  }
  void append(ValueList& list, Value&& element) { list.push_back(std::move(element)); }
  Value finish(ValueList&& list) { return Value(std::move(list)); }
  Map map(std::size_t count) {
    Map map{ValueMap(), count, {}};
    map.entries.reserve(count);  // no reallocation below: the views in `keys` stay valid
    if (count > kLinearKeyCheck) map.keys.reserve(count);
    return map;
  }
  bool insert(Map& map, std::string_view key, Value&& element) {
    if (map.count > kLinearKeyCheck) {
      if (map.keys.contains(key)) return false;
    } else {
      for (const auto& entry : map.entries) {
        if (entry.first == key) return false;
      }
    }
    map.entries.append_unchecked(std::string(key), std::move(element));
    if (map.count > kLinearKeyCheck) map.keys.insert(std::prev(map.entries.end())->first);
    return true;
  }
  Value finish(Map&& map) { return Value(std::move(map.entries)); }

 private:
  // Maps up to this size look for a duplicate key among the keys before it (no
  // allocation); larger ones through a hash set, so that a hostile map cannot make
  // decoding quadratic.
  static constexpr std::size_t kLinearKeyCheck = 16;
};

}  // namespace

void CEREAL_SAVE_FUNCTION_NAME(detail::FrameOutputArchive& archive, const Value& value) {
  TreeBudget budget;
  save_value(archive, value, 1, budget);
}

void CEREAL_LOAD_FUNCTION_NAME(detail::FrameInputArchive& archive, Value& value) {
  detail::ValueBudget budget;
  ValueBuilder builder;
  value = detail::read_value(archive, builder, 1, budget);
}

namespace detail {

void throw_value_too_deep() {
  throw ProtocolError("received Value nests deeper than " + std::to_string(kMaxValueDepth) +
                      " levels (a hostile or broken sender)");
}

void throw_too_many_value_elements() {
  throw ProtocolError("received Value holds more than " + std::to_string(kMaxValueElements) + " elements");
}

void throw_value_count_above_body(const char* what, std::uint64_t count, std::size_t remaining) {
  throw ProtocolError("received Value " + std::string(what) + " claims " + std::to_string(count) +
                      " elements but only " + std::to_string(remaining) + " bytes remain");
}

void throw_value_children_above_budget(const char* what, std::uint64_t count) {
  throw ProtocolError("received Value " + std::string(what) + " claims " + std::to_string(count) +
                      " elements: with the values claimed before it, more than the " +
                      std::to_string(kMaxValueElements) + " elements a Value may hold");
}

void throw_invalid_value_utf8(const char* what) {
  throw ProtocolError("received Value " + std::string(what) + " is not valid UTF-8");
}

void throw_duplicate_value_key(std::string_view key) {
  throw ProtocolError("received Value map holds the key '" + std::string(key) + "' twice");
}

void throw_bad_value_byte(const char* what, unsigned byte) {
  throw ProtocolError("received Value has an invalid " + std::string(what) + " " + std::to_string(byte));
}

}  // namespace detail

}  // namespace ferry
