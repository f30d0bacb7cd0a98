// The check that a (dtype, shape, strides, offset) view stays inside its storage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "ferry/dtype.hpp"
#include "ferry/tensor.hpp"

namespace ferry::detail {

/// Describes why a view of `storage_bytes` bytes with this layout would be invalid (too
/// many dimensions, a negative size/stride/offset, an element count or extent that
/// overflows, or an element outside the storage); std::nullopt when it is valid.
std::optional<std::string> view_bounds_problem(std::size_t storage_bytes, DType dtype, const Shape& shape,
                                               const Shape& strides, std::int64_t offset);

/// True when view_bounds_problem() finds nothing for `ndim` (at most kMaxDims) sizes and
/// strides: the same checks without building an answer, for the receiver of a frame (once
/// per tensor, in one pass); ask view_bounds_problem() why when it is false.
inline bool view_in_bounds(std::size_t storage_bytes, DType dtype, const std::int64_t* sizes,
                           const std::int64_t* strides, std::size_t ndim, std::int64_t offset) noexcept {
  if (offset < 0) return false;
  std::int64_t count = 1;
  std::int64_t last_index = offset;
  bool reach_overflows = false;  // matters only when the view has elements
  for (std::size_t i = 0; i < ndim; ++i) {
    if (sizes[i] < 0 || strides[i] < 0 || __builtin_mul_overflow(count, sizes[i], &count)) return false;
    std::int64_t reach = 0;
    reach_overflows |= __builtin_mul_overflow(sizes[i] - 1, strides[i], &reach);
    reach_overflows |= __builtin_add_overflow(last_index, reach, &last_index);
  }
  if (count == 0) return true;
  std::int64_t end_byte = 0;
  return !reach_overflows && !__builtin_add_overflow(last_index, 1, &end_byte) &&
         !__builtin_mul_overflow(end_byte, static_cast<std::int64_t>(dtype_size(dtype)), &end_byte) &&
         static_cast<std::uint64_t>(end_byte) <= storage_bytes;
}

/// view_in_bounds() of a shape and strides of equal length.
inline bool view_in_bounds(std::size_t storage_bytes, DType dtype, const Shape& shape, const Shape& strides,
                           std::int64_t offset) noexcept {
  if (shape.size() > kMaxDims || strides.size() != shape.size()) return false;
  return view_in_bounds(storage_bytes, dtype, shape.data(), strides.data(), shape.size(), offset);
}

}  // namespace ferry::detail
