// View operations of Tensor: slice, select, view/reshape, transpose, and the copies
// (contiguous, clone, copy_from).
#include <algorithm>

#include "cuda/memory.hpp"
#include "ferry/tensor.hpp"

namespace ferry {

Tensor Tensor::slice(std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step) const {
  const std::size_t d = wrap_dim(dim);
  if (step <= 0) throw Error("slice: step must be positive, got " + std::to_string(step));
  const std::int64_t extent = shape_[d];
  auto clamp = [extent](std::int64_t i) { return std::clamp(i < 0 ? i + extent : i, std::int64_t{0}, extent); };
  const std::int64_t first = clamp(start);
  const std::int64_t last = std::max(first, clamp(end));
  Tensor out = *this;
  out.offset_ = offset_ + first * strides_[d];
  out.shape_[d] = (last - first + step - 1) / step;
  // With two elements or more, stride * step stays inside the storage; with fewer the stride
  // is never applied, and the product could overflow (a huge step, a received stride).
  if (out.shape_[d] > 1) out.strides_[d] = strides_[d] * step;
  if (out.shape_[d] == 0) out.offset_ = offset_;
  return out;
}

Tensor Tensor::select(std::int64_t dim, std::int64_t index) const {
  const std::size_t d = wrap_dim(dim);
  const std::int64_t wrapped = index < 0 ? index + shape_[d] : index;
  if (wrapped < 0 || wrapped >= shape_[d]) {
    throw Error("select: index " + std::to_string(index) + " out of range for dim " + std::to_string(d) + " of size " +
                std::to_string(shape_[d]));
  }
  Tensor out = *this;
  out.offset_ = offset_ + wrapped * strides_[d];
  out.shape_.erase(out.shape_.begin() + static_cast<std::ptrdiff_t>(d));
  out.strides_.erase(out.strides_.begin() + static_cast<std::ptrdiff_t>(d));
  return out;
}

std::vector<Tensor> Tensor::unbind(std::int64_t dim) const {
  const std::size_t d = wrap_dim(dim);
  // The views differ only in their offset: the rest of select() is done once.
  Tensor first = *this;
  first.shape_.erase(first.shape_.begin() + static_cast<std::ptrdiff_t>(d));
  first.strides_.erase(first.strides_.begin() + static_cast<std::ptrdiff_t>(d));
  std::vector<Tensor> out(static_cast<std::size_t>(shape_[d]), first);
  for (std::size_t i = 0; i < out.size(); ++i) out[i].offset_ = offset_ + static_cast<std::int64_t>(i) * strides_[d];
  return out;
}

namespace {

// Resolves a single -1 in `requested` so that the element count is `count`.
Shape infer_shape(const Shape& requested, std::int64_t count) {
  Shape shape = requested;
  std::int64_t known = 1;
  std::optional<std::size_t> inferred;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (inferred) throw Error("view: only one dimension can be -1");
      inferred = i;
    } else if (shape[i] < 0) {
      throw Error("view: invalid size " + std::to_string(shape[i]));
    } else {
      known *= shape[i];
    }
  }
  if (inferred) {
    if (known == 0 || count % known != 0) throw Error("view: cannot infer the size of dimension -1");
    shape[*inferred] = count / known;
    known *= shape[*inferred];
  }
  if (known != count) {
    throw Error("view: shape of " + std::to_string(known) + " elements does not match " + std::to_string(count) +
                " elements");
  }
  return shape;
}

}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  if (!is_contiguous()) throw Error("view: tensor is not contiguous; use reshape() or contiguous() first");
  Tensor out = *this;
  out.shape_ = infer_shape(shape, numel());
  out.strides_ = contiguous_strides(out.shape_);
  return out;
}

Tensor Tensor::reshape(const Shape& shape) const { return is_contiguous() ? view(shape) : contiguous().view(shape); }

Tensor Tensor::transpose(std::int64_t dim0, std::int64_t dim1) const {
  const std::size_t a = wrap_dim(dim0);
  const std::size_t b = wrap_dim(dim1);
  Tensor out = *this;
  std::swap(out.shape_[a], out.shape_[b]);
  std::swap(out.strides_[a], out.strides_[b]);
  return out;
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone(std::optional<Device> device) const {
  if (!defined_) return Tensor();
  Tensor out = empty(shape_, dtype_, device.value_or(this->device()));
  out.copy_from(*this);
  return out;
}

void Tensor::copy_from(const Tensor& source) {
  if (!defined_ || !source.defined_) throw Error("copy_from: undefined tensor");
  if (source.shape_ != shape_ || source.dtype_ != dtype_) {
    throw Error("copy_from: source " + source.to_string() + " does not match destination " + to_string());
  }
  if (numel() == 0) return;
  if (!device().is_cpu() || !source.device().is_cpu()) {
    cuda::copy(*this, source);  // cudaMemcpy between the CPU and CUDA devices
    return;
  }
  copy_strided(static_cast<std::byte*>(data_ptr()), strides_, static_cast<const std::byte*>(source.data_ptr()),
               source.strides_, shape_, element_size());
}

}  // namespace ferry
