#include "ferry/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "cuda/memory.hpp"
#include "ferry/detail/view_bounds.hpp"

namespace ferry {

Tensor::Tensor(const Tensor& other) = default;
Tensor& Tensor::operator=(const Tensor& other) = default;

Tensor::Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, Shape strides, std::int64_t offset,
               Device device)
    : storage_(std::move(storage)),
      dtype_(dtype),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      offset_(offset),
      device_(device),
      defined_(true) {}

Tensor::Tensor(std::shared_ptr<Storage>&& storage, DType dtype, const Shape& shape, Device device)
    : storage_(std::move(storage)),
      dtype_(dtype),
      shape_(shape),
      strides_(contiguous_strides(shape)),
      device_(device),
      defined_(true) {}

namespace detail {

void throw_values_do_not_fill(std::size_t values, std::int64_t elements) {
  throw Error("Tensor::from: " + std::to_string(values) + " values do not fill shape of " + std::to_string(elements) +
              " elements");
}

}  // namespace detail

Shape contiguous_strides(const Shape& shape) {
  Shape strides;
  strides.resize_for_overwrite(shape.size());  // every entry is written below
  std::int64_t running = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = running;
    // Only a shape with a zero extent can get here with a product that overflows (the
    // element count of any other shape was checked); its strides must still be numbers.
    if (i > 0 && __builtin_mul_overflow(running, std::max<std::int64_t>(shape[i], 1), &running)) {
      throw Error("the strides of a tensor of " + std::to_string(shape.size()) + " dimensions with sizes up to " +
                  std::to_string(*std::max_element(shape.begin(), shape.end())) +
                  " overflow 64 bits; use smaller sizes");
    }
  }
  return strides;
}

std::optional<std::string> detail::view_bounds_problem(std::size_t storage_bytes, DType dtype, const Shape& shape,
                                                       const Shape& strides, std::int64_t offset) {
  if (shape.size() > kMaxDims) {
    return "tensor has " + std::to_string(shape.size()) + " dimensions, more than the limit of " +
           std::to_string(kMaxDims);
  }
  if (strides.size() != shape.size()) return std::string("tensor has a different number of strides and sizes");
  if (offset < 0) return "tensor storage offset " + std::to_string(offset) + " is negative";
  std::int64_t count = 1;
  std::int64_t last_index = offset;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0)
      return "tensor size " + std::to_string(shape[i]) + " of dim " + std::to_string(i) + " is negative";
    if (strides[i] < 0) {
      return "tensor stride " + std::to_string(strides[i]) + " of dim " + std::to_string(i) + " is negative";
    }
    if (__builtin_mul_overflow(count, shape[i], &count)) return std::string("tensor element count overflows");
  }
  if (count == 0) return std::nullopt;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    std::int64_t reach = 0;
    if (__builtin_mul_overflow(shape[i] - 1, strides[i], &reach) ||
        __builtin_add_overflow(last_index, reach, &last_index)) {
      return "tensor extent overflows in dim " + std::to_string(i);
    }
  }
  const auto item = static_cast<std::int64_t>(dtype_size(dtype));
  std::int64_t end_byte = 0;
  if (__builtin_add_overflow(last_index, 1, &end_byte) || __builtin_mul_overflow(end_byte, item, &end_byte)) {
    return std::string("tensor byte extent overflows");
  }
  if (static_cast<std::uint64_t>(end_byte) > storage_bytes) {
    return "tensor reaches byte " + std::to_string(end_byte) + " but its storage has only " +
           std::to_string(storage_bytes) + " bytes";
  }
  return std::nullopt;
}

namespace {

// Bytes of a contiguous tensor of `shape`; throws Error naming the problem.
std::size_t contiguous_bytes(const char* function, const Shape& shape, DType dtype) {
  auto fail = [function](const std::string& problem) { throw Error(std::string(function) + ": " + problem); };
  if (!is_valid_dtype(static_cast<std::uint8_t>(dtype))) fail("invalid dtype");
  if (shape.size() > kMaxDims) {
    fail(std::to_string(shape.size()) + " dimensions, more than " + std::to_string(kMaxDims));
  }
  std::int64_t count = 1;
  for (const std::int64_t extent : shape) {
    if (extent < 0) fail("negative size " + std::to_string(extent));
    if (__builtin_mul_overflow(count, extent, &count)) fail("element count overflows");
  }
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(count), dtype_size(dtype), &bytes)) {
    fail("byte size overflows");
  }
  return bytes;
}

// ---- Tensor::fill: the conversion of a value to a dtype, as torch's fill_() does it --------

using FillKind = detail::FillValue::Kind;

std::string fill_value_text(const detail::FillValue& value) {
  switch (value.kind) {
    case FillKind::Bool: return value.boolean ? "true" : "false";
    case FillKind::Signed: return std::to_string(value.signed_value);
    case FillKind::Unsigned: return std::to_string(value.unsigned_value);
    case FillKind::Floating: break;
  }
  std::ostringstream text;
  text.precision(17);
  text << value.floating;
  return text.str();
}

[[noreturn]] void throw_fill_overflow(const detail::FillValue& value, DType dtype) {
  throw Error("Tensor::fill: the value " + fill_value_text(value) + " cannot be converted to " +
              std::string(dtype_name(dtype)) +
              " without overflow (torch's fill_() refuses it too); pass a value "
              "in the dtype's range, or fill a tensor of a wider dtype");
}

bool fill_as_bool(const detail::FillValue& value) {
  switch (value.kind) {
    case FillKind::Bool: return value.boolean;
    case FillKind::Signed: return value.signed_value != 0;
    case FillKind::Unsigned: return value.unsigned_value != 0;
    case FillKind::Floating: break;
  }
  return value.floating != 0;  // NaN too is true
}

// An integer dtype's element: a floating value is truncated toward zero, a negative
// integer wraps into an unsigned dtype as long as its magnitude fits.
template <class To>
To fill_as_integer(const detail::FillValue& value, DType dtype) {
  using Limits = std::numeric_limits<To>;
  switch (value.kind) {
    case FillKind::Bool: return static_cast<To>(value.boolean ? 1 : 0);
    case FillKind::Signed: {
      const std::int64_t x = value.signed_value;
      bool fits = false;
      if constexpr (Limits::is_signed) {
        fits = x >= std::int64_t{Limits::min()} && x <= std::int64_t{Limits::max()};
      } else {
        const std::uint64_t magnitude =
            x < 0 ? static_cast<std::uint64_t>(-(x + 1)) + 1 : static_cast<std::uint64_t>(x);
        fits = magnitude <= std::uint64_t{Limits::max()};
      }
      if (!fits) throw_fill_overflow(value, dtype);
      return static_cast<To>(x);
    }
    case FillKind::Unsigned:
      if (value.unsigned_value > static_cast<std::uint64_t>(Limits::max())) throw_fill_overflow(value, dtype);
      return static_cast<To>(value.unsigned_value);
    case FillKind::Floating: break;
  }
  const double x = value.floating;
  // NaN fails both comparisons; 2^63 is int64's max as a double, but does not fit.
  if (!(x >= static_cast<double>(Limits::lowest()) && x <= static_cast<double>(Limits::max())) || x >= 0x1p63) {
    throw_fill_overflow(value, dtype);
  }
  return static_cast<To>(x);
}

// A floating dtype's element as a double: finite values above `max` in magnitude overflow.
double fill_as_floating(const detail::FillValue& value, double max, DType dtype) {
  double x = 0;
  switch (value.kind) {
    case FillKind::Bool: x = value.boolean ? 1 : 0; break;
    case FillKind::Signed: x = static_cast<double>(value.signed_value); break;
    case FillKind::Unsigned: x = static_cast<double>(value.unsigned_value); break;
    case FillKind::Floating: x = value.floating; break;
  }
  if (std::isfinite(x) && std::fabs(x) > max) throw_fill_overflow(value, dtype);
  return x;
}

constexpr double kLargestHalf = 65504.0;
constexpr double kLargestBFloat16 = 0x1.fep127;  // 0x7f7f: (2 - 2^-7) * 2^127

}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  auto storage = Storage::allocate(contiguous_bytes("Tensor::empty", shape, dtype), device);
  return Tensor(std::move(storage), dtype, shape, device);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, const SharedAllocator& pool) {
  auto storage = Storage::allocate(contiguous_bytes("Tensor::empty", shape, dtype), pool);
  return Tensor(std::move(storage), dtype, shape, Device::SharedCpu);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  // Fresh shared memory is zero already: only a recycled block or heap memory is cleared.
  auto storage = Storage::allocate(contiguous_bytes("Tensor::zeros", shape, dtype), device, true);
  return Tensor(std::move(storage), dtype, shape, device);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, const SharedAllocator& pool) {
  auto storage = Storage::allocate(contiguous_bytes("Tensor::zeros", shape, dtype), pool, true);
  return Tensor(std::move(storage), dtype, shape, Device::SharedCpu);
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, DType dtype, Shape shape, Shape strides,
                            std::int64_t storage_offset) {
  if (!is_valid_dtype(static_cast<std::uint8_t>(dtype))) throw Error("Tensor::from_storage: invalid dtype");
  const std::size_t bytes = storage ? storage->nbytes() : 0;
  if (auto problem = detail::view_bounds_problem(bytes, dtype, shape, strides, storage_offset)) {
    throw Error("Tensor::from_storage: " + *problem);
  }
  const Device device = storage ? storage->device() : Device::Cpu;
  return Tensor(std::move(storage), dtype, std::move(shape), std::move(strides), storage_offset, device);
}

bool Tensor::is_contiguous() const noexcept {
  std::int64_t expected = 1;
  for (std::size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;
    if (shape_[i] == 0) return true;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

std::size_t Tensor::wrap_dim(std::int64_t d) const {
  const std::int64_t n = dim();
  const std::int64_t wrapped = d < 0 ? d + n : d;
  if (wrapped < 0 || wrapped >= n) {
    throw Error("dimension " + std::to_string(d) + " is out of range for a " + std::to_string(n) + "-d tensor");
  }
  return static_cast<std::size_t>(wrapped);
}

Tensor& Tensor::fill_with(const detail::FillValue& value) {
  if (!defined_) throw Error("Tensor::fill on an undefined tensor");
  alignas(8) std::byte element[8] = {};
  const auto put = [&element](auto converted) {
    static_assert(sizeof converted <= sizeof element);
    std::memcpy(element, &converted, sizeof converted);
  };
  switch (dtype_) {
    case DType::Bool: put(fill_as_bool(value)); break;
    case DType::UInt8: put(fill_as_integer<std::uint8_t>(value, dtype_)); break;
    case DType::Int8: put(fill_as_integer<std::int8_t>(value, dtype_)); break;
    case DType::Int16: put(fill_as_integer<std::int16_t>(value, dtype_)); break;
    case DType::Int32: put(fill_as_integer<std::int32_t>(value, dtype_)); break;
    case DType::Int64: put(fill_as_integer<std::int64_t>(value, dtype_)); break;
    case DType::Float16: put(Half(static_cast<float>(fill_as_floating(value, kLargestHalf, dtype_)))); break;
    case DType::BFloat16: put(BFloat16(static_cast<float>(fill_as_floating(value, kLargestBFloat16, dtype_)))); break;
    case DType::Float32:
      put(static_cast<float>(fill_as_floating(value, std::numeric_limits<float>::max(), dtype_)));
      break;
    case DType::Float64: put(fill_as_floating(value, std::numeric_limits<double>::infinity(), dtype_)); break;
    default: detail::throw_invalid_dtype(dtype_);
  }
  if (numel() == 0) return *this;
  if (!device().is_cpu())
    throw Error("Tensor::fill of a " + device().to_string() + " tensor; fill a CPU tensor and copy_from() it");
  // Broadcast the single element through a zero-stride view.
  const Shape zero_strides(shape_.size(), 0);
  copy_strided(static_cast<std::byte*>(data_ptr()), strides_, element, zero_strides, shape_, element_size());
  return *this;
}

void Tensor::check_element_type(DType requested) const {
  if (!defined_) throw Error("element access on an undefined tensor");
  if (requested != dtype_) {
    throw Error("element type " + std::string(dtype_name(requested)) + " requested from a " +
                std::string(dtype_name(dtype_)) + " tensor");
  }
  if (!device().is_cpu()) throw Error("element access on a " + device().to_string() + " tensor; copy it to the CPU");
}

std::byte* Tensor::element_address(std::initializer_list<std::int64_t> index) const {
  if (static_cast<std::int64_t>(index.size()) != dim()) {
    throw Error("at: " + std::to_string(index.size()) + " indices for a " + std::to_string(dim()) + "-d tensor");
  }
  std::int64_t element = offset_;
  std::size_t d = 0;
  for (const std::int64_t i : index) {
    if (i < 0 || i >= shape_[d]) {
      throw Error("at: index " + std::to_string(i) + " out of range for dim " + std::to_string(d) + " of size " +
                  std::to_string(shape_[d]));
    }
    element += i * strides_[d];
    ++d;
  }
  return storage_->data() + static_cast<std::size_t>(element) * element_size();
}

Tensor& Tensor::share_memory() {
  if (storage_) storage_->share_memory();
  device_ = Device::SharedCpu;
  return *this;
}

std::string Tensor::to_string() const {
  if (!defined_) return "Tensor(undefined)";
  std::ostringstream out;
  auto list = [&out](const Shape& values) {
    out << '[';
    for (std::size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
    out << ']';
  };
  out << "Tensor(" << dtype_name(dtype_) << ", ";
  list(shape_);
  out << ", strides ";
  list(strides_);
  out << ", offset " << offset_ << ", " << device().to_string() << ')';
  return out.str();
}

}  // namespace ferry
