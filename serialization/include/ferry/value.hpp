// ferry::Value: the one message type that C++ and Python both speak. A dynamically typed
// tree of None, bool, int64, float64, UTF-8 string, bytes, Tensor, list and string-keyed
// map (insertion order kept). It travels through ferry's archives like any other member,
// so `Sender<Value>` works on every transport and C++ structs may hold Value members.
// A received Value is checked: at most kMaxValueDepth levels of nesting and
// kMaxValueElements values in one tree, valid UTF-8 in strings and keys (ProtocolError).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "ferry/detail/archive.hpp"
#include "ferry/detail/type_name.hpp"
#include "ferry/tensor.hpp"

namespace ferry {

/// The most levels of nesting a Value may have (a scalar at the top is depth 1).
inline constexpr std::size_t kMaxValueDepth = 64;
/// The most values (scalars, lists, maps, tensors, counted once each) one Value tree may hold.
inline constexpr std::size_t kMaxValueElements = std::size_t{1} << 20;

/// What a Value holds. The numeric values are part of the wire format.
enum class ValueKind : std::uint8_t {
  None = 0,
  Bool = 1,
  Int = 2,
  Float = 3,
  String = 4,
  Bytes = 5,
  Tensor = 6,
  List = 7,
  Map = 8,
};

/// "none", "bool", "int", "float", "string", "bytes", "tensor", "list" or "map".
std::string_view value_kind_name(ValueKind kind);

/// A byte string (Python `bytes`), distinct from a UTF-8 string.
struct Bytes {
  std::string data;
  friend bool operator==(const Bytes&, const Bytes&) = default;
};

class Value;

/// A list of values (Python `list`; a tuple arrives as a list).
using ValueList = std::vector<Value>;

/// A map from strings to values that keeps insertion order (Python `dict`). Lookups are
/// linear: messages hold a handful of keys.
class ValueMap {
 public:
  using Entry = std::pair<std::string, Value>;

  ValueMap() = default;
  ValueMap(std::initializer_list<Entry> entries);

  /// The value at `key`, or nullptr.
  Value* find(std::string_view key);
  const Value* find(std::string_view key) const;
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  /// The value at `key`; throws Error naming the key when it is absent.
  Value& at(std::string_view key);
  const Value& at(std::string_view key) const;
  /// The value at `key`, inserted as None at the end when absent.
  Value& operator[](std::string_view key);
  /// Sets `key` to `value` (in place when present, else at the end).
  void insert_or_assign(std::string key, Value value);

  // Defined after Value: std::pair<std::string, Value> needs a complete Value.
  using iterator = std::vector<Entry>::iterator;
  using const_iterator = std::vector<Entry>::const_iterator;
  std::size_t size() const noexcept;
  bool empty() const noexcept;
  void reserve(std::size_t count);
  iterator begin() noexcept;
  iterator end() noexcept;
  const_iterator begin() const noexcept;
  const_iterator end() const noexcept;

  /// Appends without looking for `key` first: the caller knows it is new (the decoder
  /// checks for duplicates itself).
  void append_unchecked(std::string key, Value value);

 private:
  std::vector<Entry> entries_;
};

/// One value of the cross-language message type. Copying a Value copies the tree; the
/// tensors in it are views (their bytes are shared, as when copying a Tensor).
class Value {
 public:
  /// None.
  Value() = default;
  Value(std::nullptr_t) {}             // NOLINT(google-explicit-constructor): Value v = nullptr;
  Value(bool value) : data_(value) {}  // NOLINT(google-explicit-constructor)
  /// Any integer type but bool; throws Error when an unsigned value does not fit in int64.
  template <class I, std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool>, int> = 0>
  Value(I value) : data_(to_int64(value)) {}                  // NOLINT(google-explicit-constructor)
  Value(double value) : data_(value) {}                       // NOLINT(google-explicit-constructor)
  Value(float value) : data_(static_cast<double>(value)) {}   // NOLINT(google-explicit-constructor)
  Value(const char* text) : data_(std::string(text)) {}       // NOLINT(google-explicit-constructor)
  Value(std::string text) : data_(std::move(text)) {}         // NOLINT(google-explicit-constructor)
  Value(std::string_view text) : data_(std::string(text)) {}  // NOLINT(google-explicit-constructor)
  Value(Bytes bytes) : data_(std::move(bytes)) {}             // NOLINT(google-explicit-constructor)
  Value(Tensor tensor) : data_(std::move(tensor)) {}          // NOLINT(google-explicit-constructor)
  Value(ValueList list) : data_(std::move(list)) {}           // NOLINT(google-explicit-constructor)
  Value(ValueMap map) : data_(std::move(map)) {}              // NOLINT(google-explicit-constructor)

  ValueKind kind() const noexcept { return static_cast<ValueKind>(data_.index()); }
  bool is_none() const noexcept { return kind() == ValueKind::None; }
  bool is_bool() const noexcept { return kind() == ValueKind::Bool; }
  bool is_int() const noexcept { return kind() == ValueKind::Int; }
  bool is_float() const noexcept { return kind() == ValueKind::Float; }
  bool is_string() const noexcept { return kind() == ValueKind::String; }
  bool is_bytes() const noexcept { return kind() == ValueKind::Bytes; }
  bool is_tensor() const noexcept { return kind() == ValueKind::Tensor; }
  bool is_list() const noexcept { return kind() == ValueKind::List; }
  bool is_map() const noexcept { return kind() == ValueKind::Map; }

  // Accessors: each throws Error ("Value holds a list, not a map") for another kind.
  bool as_bool() const { return get<bool>(ValueKind::Bool); }
  std::int64_t as_int() const { return get<std::int64_t>(ValueKind::Int); }
  /// The float, or an int converted to double.
  double as_float() const;
  const std::string& as_string() const { return get<std::string>(ValueKind::String); }
  const Bytes& as_bytes() const { return get<Bytes>(ValueKind::Bytes); }
  const Tensor& as_tensor() const { return get<Tensor>(ValueKind::Tensor); }
  Tensor& as_tensor() { return get<Tensor>(ValueKind::Tensor); }
  const ValueList& as_list() const { return get<ValueList>(ValueKind::List); }
  ValueList& as_list() { return get<ValueList>(ValueKind::List); }
  const ValueMap& as_map() const { return get<ValueMap>(ValueKind::Map); }
  ValueMap& as_map() { return get<ValueMap>(ValueKind::Map); }

  /// The map's value at `key` (Error when this is no map or the key is absent).
  const Value& operator[](std::string_view key) const { return as_map().at(key); }
  Value& operator[](std::string_view key) { return as_map().at(key); }
  /// The list's element `index` (Error when this is no list or the index is out of range).
  const Value& operator[](std::size_t index) const;
  Value& operator[](std::size_t index);

 private:
  template <class T>
  const T& get(ValueKind wanted) const {
    if (const T* held = std::get_if<T>(&data_)) return *held;
    throw_wrong_kind(wanted);
  }
  template <class T>
  T& get(ValueKind wanted) {
    if (T* held = std::get_if<T>(&data_)) return *held;
    throw_wrong_kind(wanted);
  }
  [[noreturn]] void throw_wrong_kind(ValueKind wanted) const;
  template <class I>
  static std::int64_t to_int64(I value) {
    if constexpr (std::is_unsigned_v<I> && sizeof(I) >= sizeof(std::int64_t)) {
      if (value > static_cast<I>(INT64_MAX)) throw_unsigned_overflow(static_cast<std::uint64_t>(value));
    }
    return static_cast<std::int64_t>(value);
  }
  [[noreturn]] static void throw_unsigned_overflow(std::uint64_t value);

  // The alternatives' order is ValueKind's.
  std::variant<std::monostate, bool, std::int64_t, double, std::string, Bytes, Tensor, ValueList, ValueMap> data_;
};

}  // namespace ferry

namespace ferry::detail {
/// Value's name on the wire, the same whatever compiler built each peer (GCC and Clang
/// spell type names differently): a C++ loader and the Python module must agree on it.
template <>
constexpr std::string_view type_name<Value>() {
  return "ferry::Value";
}
}  // namespace ferry::detail

namespace ferry {

inline ValueMap::ValueMap(std::initializer_list<Entry> entries) {
  entries_.reserve(entries.size());
  for (const Entry& entry : entries) insert_or_assign(entry.first, entry.second);
}

inline std::size_t ValueMap::size() const noexcept { return entries_.size(); }
inline bool ValueMap::empty() const noexcept { return entries_.empty(); }
inline void ValueMap::reserve(std::size_t count) { entries_.reserve(count); }
inline ValueMap::iterator ValueMap::begin() noexcept { return entries_.begin(); }
inline ValueMap::iterator ValueMap::end() noexcept { return entries_.end(); }
inline ValueMap::const_iterator ValueMap::begin() const noexcept { return entries_.begin(); }
inline ValueMap::const_iterator ValueMap::end() const noexcept { return entries_.end(); }

inline void ValueMap::append_unchecked(std::string key, Value value) {
  entries_.emplace_back(std::move(key), std::move(value));
}

/// Writes `value`: a kind byte, then its payload (tensors as in tensor_wire.hpp). Throws
/// Error, writing nothing the receiver would accept, when the tree is deeper than
/// kMaxValueDepth or holds more than kMaxValueElements values.
void CEREAL_SAVE_FUNCTION_NAME(detail::FrameOutputArchive& archive, const Value& value);

/// Reads a value; ProtocolError for a bad kind byte, nesting deeper than kMaxValueDepth,
/// more than kMaxValueElements values, a count larger than the bytes left, invalid UTF-8,
/// a duplicate map key, or an invalid tensor.
void CEREAL_LOAD_FUNCTION_NAME(detail::FrameInputArchive& archive, Value& value);

/// True when `text` is valid UTF-8 (no overlong forms, surrogates or code points above U+10FFFF).
bool is_valid_utf8(std::string_view text) noexcept;

}  // namespace ferry
