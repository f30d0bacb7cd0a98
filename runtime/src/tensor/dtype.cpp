#include "ferry/dtype.hpp"

#include <bit>
#include <cmath>

#include "ferry/error.hpp"

namespace ferry {

namespace detail {
void throw_invalid_dtype(DType dtype) { throw Error("invalid dtype value " + std::to_string(static_cast<int>(dtype))); }
}  // namespace detail

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Bool: return "bool";
    case DType::UInt8: return "uint8";
    case DType::Int8: return "int8";
    case DType::Int16: return "int16";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
  }
  return "invalid";
}

// float32 <-> float16 conversion with round-to-nearest-even, handling subnormals,
// infinities and NaN.
Half::Half(float value) {
  const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (f >> 16) & 0x8000u;
  const std::uint32_t abs = f & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    bits = static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    return;
  }
  if (abs >= 0x477ff000u) {  // rounds to a value above the largest half: inf
    bits = static_cast<std::uint16_t>(sign | 0x7c00u);
    return;
  }
  if (abs < 0x38800000u) {  // subnormal half (or zero)
    const float magnitude = std::bit_cast<float>(abs);
    // Scale so that the subnormal's units land in the integer part, then round.
    const auto units = static_cast<std::uint32_t>(std::nearbyint(magnitude * 16777216.0f));
    bits = static_cast<std::uint16_t>(sign | units);
    return;
  }
  std::uint32_t mantissa = abs & 0x7fffffu;
  std::uint32_t exponent = (abs >> 23) - 112;
  std::uint32_t half = (exponent << 10) | (mantissa >> 13);
  const std::uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  bits = static_cast<std::uint16_t>(sign | half);
}

Half::operator float() const {
  const std::uint32_t sign = (static_cast<std::uint32_t>(bits) & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  const std::uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) / 16777216.0f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) {
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

BFloat16::BFloat16(float value) {
  const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
  if ((f & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a quiet NaN
    bits = static_cast<std::uint16_t>((f >> 16) | 0x40u);
    return;
  }
  const std::uint32_t rounding = 0x7fffu + ((f >> 16) & 1u);
  bits = static_cast<std::uint16_t>((f + rounding) >> 16);
}

BFloat16::operator float() const { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

}  // namespace ferry
