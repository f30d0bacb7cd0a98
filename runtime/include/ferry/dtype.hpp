// Element types of tensors, and the C++ types that stand for them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ferry {

/// The element type of a tensor. The numeric values are part of the wire format.
enum class DType : std::uint8_t {
  Bool = 0,
  UInt8 = 1,
  Int8 = 2,
  Int16 = 3,
  Int32 = 4,
  Int64 = 5,
  Float16 = 6,
  BFloat16 = 7,
  Float32 = 8,
  Float64 = 9,
};

/// Number of DType values; a wire value at or above it is invalid.
inline constexpr int kDTypeCount = 10;

namespace detail {
[[noreturn]] void throw_invalid_dtype(DType dtype);
}  // namespace detail

/// Size in bytes of one element of `dtype`; throws Error for a value that is no DType.
inline std::size_t dtype_size(DType dtype) {
  // Inline: every view check and data_ptr() asks.
  static constexpr std::uint8_t kSizes[kDTypeCount] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8};
  const auto raw = static_cast<std::uint8_t>(dtype);
  if (raw >= kDTypeCount) [[unlikely]]
    detail::throw_invalid_dtype(dtype);
  return kSizes[raw];
}

/// Lower-case name of `dtype` ("float32", ...), for messages.
std::string_view dtype_name(DType dtype);

/// True when `raw` is the wire value of a DType.
constexpr bool is_valid_dtype(std::uint8_t raw) { return raw < kDTypeCount; }

/// IEEE 754 half precision number, stored as its 16 bits; converts to and from float.
struct Half {
  std::uint16_t bits = 0;
  Half() = default;
  Half(float value);       // NOLINT(google-explicit-constructor): numeric conversion
  operator float() const;  // NOLINT(google-explicit-constructor)
};

/// bfloat16 (the upper 16 bits of a float32), stored as its bits; converts to and from float.
struct BFloat16 {
  std::uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float value);   // NOLINT(google-explicit-constructor)
  operator float() const;  // NOLINT(google-explicit-constructor)
};

/// `dtype_of<T>` is the DType whose elements have C++ type T.
template <class T>
struct DTypeOf;
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::Bool;
};
template <>
struct DTypeOf<std::uint8_t> {
  static constexpr DType value = DType::UInt8;
};
template <>
struct DTypeOf<std::int8_t> {
  static constexpr DType value = DType::Int8;
};
template <>
struct DTypeOf<std::int16_t> {
  static constexpr DType value = DType::Int16;
};
template <>
struct DTypeOf<std::int32_t> {
  static constexpr DType value = DType::Int32;
};
template <>
struct DTypeOf<std::int64_t> {
  static constexpr DType value = DType::Int64;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::Float16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::BFloat16;
};
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::Float32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::Float64;
};

template <class T>
inline constexpr DType dtype_of = DTypeOf<T>::value;

}  // namespace ferry
