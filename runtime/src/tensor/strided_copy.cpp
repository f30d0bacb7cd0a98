#include <cstring>

#include "ferry/tensor.hpp"

namespace ferry {
namespace {

// Copies one element; fixed sizes compile to a single load and store.
inline void copy_element(std::byte* destination, const std::byte* source, std::size_t size) {
  switch (size) {
    case 1: *destination = *source; break;
    case 2: std::memcpy(destination, source, 2); break;
    case 4: std::memcpy(destination, source, 4); break;
    case 8: std::memcpy(destination, source, 8); break;
    default: std::memcpy(destination, source, size); break;
  }
}

}  // namespace

void copy_strided(std::byte* destination, const Shape& destination_strides, const std::byte* source,
                  const Shape& source_strides, const Shape& shape, std::size_t element_size) {
  const std::size_t ndim = shape.size();
  for (const std::int64_t extent : shape) {
    if (extent == 0) return;
  }
  if (ndim == 0) {
    copy_element(destination, source, element_size);
    return;
  }
  // The stride of a dimension of size 1 is never applied, and may be any number (a received
  // tensor's is): use 0, so that no product below can overflow. Every other stride times
  // its extent stays inside the tensor's storage.
  Shape out_strides = destination_strides;
  Shape in_strides = source_strides;
  for (std::size_t d = 0; d < ndim; ++d) {
    if (shape[d] == 1) out_strides[d] = in_strides[d] = 0;
  }
  const std::size_t inner = ndim - 1;
  const auto inner_extent = static_cast<std::size_t>(shape[inner]);
  const bool inner_dense = (out_strides[inner] == 1 && in_strides[inner] == 1) || inner_extent == 1;
  const auto step = static_cast<std::ptrdiff_t>(element_size);
  std::vector<std::int64_t> index(ndim, 0);
  while (true) {
    std::ptrdiff_t destination_offset = 0;
    std::ptrdiff_t source_offset = 0;
    for (std::size_t d = 0; d < inner; ++d) {
      destination_offset += index[d] * out_strides[d];
      source_offset += index[d] * in_strides[d];
    }
    std::byte* out = destination + destination_offset * step;
    const std::byte* in = source + source_offset * step;
    if (inner_dense) {
      std::memmove(out, in, inner_extent * element_size);
    } else {
      const std::ptrdiff_t out_step = out_strides[inner] * step;
      const std::ptrdiff_t in_step = in_strides[inner] * step;
      // Pointers never move past the last element (that would be undefined behaviour).
      for (std::size_t i = 0;;) {
        copy_element(out, in, element_size);
        if (++i == inner_extent) break;
        out += out_step;
        in += in_step;
      }
    }
    // Advance the outer index like an odometer.
    std::size_t d = inner;
    while (d-- > 0) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
    if (d == static_cast<std::size_t>(-1)) return;
  }
}

}  // namespace ferry
