// The check that a (dtype, shape, strides, offset) view stays inside its storage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "ferry/dtype.hpp"
#include "ferry/tensor.hpp"

namespace ferry {

/// Describes why a view of `storage_bytes` bytes with this layout would be invalid (too
/// many dimensions, a negative size/stride/offset, an element count or extent that
/// overflows, or an element outside the storage); std::nullopt when it is valid.
std::optional<std::string> view_bounds_problem(std::size_t storage_bytes, DType dtype, const Shape& shape,
                                               const Shape& strides, std::int64_t offset);

}  // namespace ferry
