// Tensor: a typed, strided view of a Storage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "ferry/device.hpp"
#include "ferry/dtype.hpp"
#include "ferry/error.hpp"
#include "ferry/shape.hpp"
#include "ferry/shared_allocator.hpp"
#include "ferry/storage.hpp"

namespace ferry {

namespace detail {
struct ReceivedView;
/// A value given to Tensor::fill, before its conversion to the tensor's dtype.
struct FillValue {
  enum class Kind : std::uint8_t { Bool, Signed, Unsigned, Floating };
  Kind kind = Kind::Signed;
  bool boolean = false;
  std::int64_t signed_value = 0;
  std::uint64_t unsigned_value = 0;
  double floating = 0;
};
template <class T>
FillValue fill_value(T value) {
  static_assert(std::is_arithmetic_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>,
                "Tensor::fill takes a number (bool, an integer, a floating type, Half or BFloat16)");
  FillValue result;
  if constexpr (std::is_same_v<T, bool>) {
    result.kind = FillValue::Kind::Bool;
    result.boolean = value;
  } else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    result.kind = FillValue::Kind::Signed;
    result.signed_value = value;
  } else if constexpr (std::is_integral_v<T>) {
    result.kind = FillValue::Kind::Unsigned;
    result.unsigned_value = value;
  } else if constexpr (std::is_floating_point_v<T>) {
    result.kind = FillValue::Kind::Floating;
    result.floating = static_cast<double>(value);
  } else {
    result.kind = FillValue::Kind::Floating;
    result.floating = static_cast<float>(value);
  }
  return result;
}
}  // namespace detail

/// The most dimensions a tensor may have.
inline constexpr std::size_t kMaxDims = 32;

/// A tensor: dtype, shape, strides (in elements) and an offset into a shared Storage.
/// Copying a Tensor copies the view, not the bytes; views made by slice/select/view/
/// transpose share the storage, so a write through one is seen through the others.
/// A tensor on Device::SharedCpu travels between processes without copying its bytes.
class Tensor {
 public:
  /// An undefined tensor (no storage, no shape); `defined()` is false.
  Tensor() = default;
  // The copies are out of line (tensor.cpp): a view's copy is a shared_ptr and two shapes,
  // which every translation unit that copies a tensor would otherwise compile again. The
  // moves and the destructor, which the receive path runs per tensor, stay inline.
  Tensor(const Tensor& other);
  Tensor(Tensor&& other) noexcept = default;
  Tensor& operator=(const Tensor& other);
  Tensor& operator=(Tensor&& other) noexcept = default;
  ~Tensor() = default;

  /// A contiguous tensor of `shape` whose elements are not initialised.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::Cpu);
  /// A contiguous tensor of `shape` in shared memory from `pool` (for example the pool of
  /// an isolated channel, see ChannelOptions::pool); its elements are not initialised.
  static Tensor empty(const Shape& shape, DType dtype, const SharedAllocator& pool);
  /// A contiguous tensor of `shape` filled with zeros.
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::Cpu);
  /// A contiguous tensor of `shape` filled with zeros, in shared memory from `pool`.
  static Tensor zeros(const Shape& shape, DType dtype, const SharedAllocator& pool);
  /// A contiguous tensor of `shape` holding a copy of `values` (row-major).
  template <class T>
  static Tensor from(std::span<const T> values, const Shape& shape, Device device = Device::Cpu);
  /// A contiguous tensor of `shape` holding a copy of `values` (row-major).
  template <class T>
  static Tensor from(const std::vector<T>& values, const Shape& shape, Device device = Device::Cpu) {
    return from(std::span<const T>(values.data(), values.size()), shape, device);
  }
  /// A 1-d tensor holding a copy of `values`.
  template <class T>
  static Tensor from(std::initializer_list<T> values, Device device = Device::Cpu) {
    return from(std::span<const T>(values.begin(), values.size()), Shape{static_cast<std::int64_t>(values.size())},
                device);
  }
  /// A view of `storage`; throws Error when the view would reach outside the storage.
  static Tensor from_storage(std::shared_ptr<Storage> storage, DType dtype, Shape shape, Shape strides,
                             std::int64_t storage_offset);

  bool defined() const noexcept { return defined_; }
  DType dtype() const noexcept { return dtype_; }
  Device device() const noexcept { return storage_ ? storage_->device() : device_; }
  std::int64_t dim() const noexcept { return static_cast<std::int64_t>(shape_.size()); }
  const Shape& shape() const noexcept { return shape_; }
  const Shape& strides() const noexcept { return strides_; }
  /// Size of dimension `d` (negative counts from the end).
  std::int64_t size(std::int64_t d) const { return shape_[wrap_dim(d)]; }
  /// Stride of dimension `d` in elements (negative counts from the end).
  std::int64_t stride(std::int64_t d) const { return strides_[wrap_dim(d)]; }
  /// Offset of element 0 into the storage, in elements.
  std::int64_t storage_offset() const noexcept { return offset_; }
  std::int64_t numel() const noexcept {
    std::int64_t count = 1;
    for (const std::int64_t extent : shape_) count *= extent;
    return count;
  }
  std::size_t element_size() const { return dtype_size(dtype_); }
  /// numel() * element_size(): the bytes of the elements, not of the storage.
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * element_size(); }
  /// True when the elements are laid out row-major without gaps.
  bool is_contiguous() const noexcept;
  /// True when the storage lives in shared memory (sending it copies no bytes).
  bool is_shared() const noexcept { return storage_ && storage_->is_shared(); }
  const std::shared_ptr<Storage>& storage() const noexcept { return storage_; }
  /// True when both tensors view the same storage.
  bool shares_storage_with(const Tensor& other) const noexcept {
    return storage_ != nullptr && storage_ == other.storage_;
  }

  /// Elements `start, start+step, ...` (< end) of dimension `dim`; a view.
  Tensor slice(std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step = 1) const;
  /// Index `index` of dimension `dim`, which is removed; a view.
  Tensor select(std::int64_t dim, std::int64_t index) const;
  /// Every index of dimension `dim` as a view, in order (torch.unbind): select(dim, i) for
  /// each i. Many small tensors that live and die together cost least this way: one
  /// storage to allocate and send, however many views a message holds.
  std::vector<Tensor> unbind(std::int64_t dim = 0) const;
  /// The same elements with another shape (one entry may be -1); needs a contiguous tensor.
  Tensor view(const Shape& shape) const;
  /// Like view(), but copies when the tensor is not contiguous.
  Tensor reshape(const Shape& shape) const;
  /// Dimensions `dim0` and `dim1` swapped; a view.
  Tensor transpose(std::int64_t dim0, std::int64_t dim1) const;
  /// This tensor when contiguous, else a contiguous copy on the same device.
  Tensor contiguous() const;
  /// A contiguous copy with its own storage, on `device` (default: the same device).
  /// `clone(Device::Cpu)` of a CUDA tensor is how its elements are read on the host.
  Tensor clone(std::optional<Device> device = std::nullopt) const;
  /// Copies the elements of `source` (same shape and dtype) into this tensor. Either may be
  /// on a CUDA device: the copy then goes through cudaMemcpy on the current stream (see
  /// ferry/cuda/runtime.hpp) and is finished when this returns.
  void copy_from(const Tensor& source);
  /// Moves the storage into shared memory in place, as torch's share_memory_(): every
  /// view of the storage follows. No-op when already shared. Returns *this.
  Tensor& share_memory();

  /// Address of element 0 (nullptr for a tensor without elements).
  // NOLINTNEXTLINE(bugprone-exception-escape): dtype_ is a valid DType (checked when made): dtype_size() cannot throw
  void* data_ptr() const noexcept {
    if (!storage_) return nullptr;
    std::byte* const base = storage_->data();  // once: a virtual call through the allocation
    if (base == nullptr || numel() == 0) return nullptr;
    return base + static_cast<std::size_t>(offset_) * dtype_size(dtype_);
  }
  /// Typed address of element 0; throws Error when T does not match dtype().
  template <class T>
  T* data() const {
    if (!defined_ || dtype_ != dtype_of<T> || !device().is_cpu()) [[unlikely]] {
      check_element_type(dtype_of<T>);
    }
    return static_cast<T*>(data_ptr());
  }
  /// The element at `index` (one entry per dimension); checks dtype and bounds.
  template <class T>
  T& at(std::initializer_list<std::int64_t> index) const {
    check_element_type(dtype_of<T>);
    return *reinterpret_cast<T*>(element_address(index));
  }
  /// All elements in row-major order.
  template <class T>
  std::vector<T> to_vector() const;
  /// Sets every element to `value` (any number: bool, an integer, a floating type, Half,
  /// BFloat16), converted to dtype() as torch's fill_() does: a floating value is truncated
  /// toward zero into an integer dtype, a negative integer wraps into uint8 (-1 is 255),
  /// anything non-zero is true, and infinities and NaN stay themselves in floating dtypes.
  /// Throws Error, changing nothing, when the value is outside the dtype's range (300 into
  /// uint8, 1e39 into float32, NaN into an integer dtype).
  template <class T>
  Tensor& fill(T value) {
    return fill_with(detail::fill_value(value));
  }

  /// "Tensor(float32, [2, 3], strides [3, 1], offset 0, shared_cpu)".
  std::string to_string() const;

 private:
  // The message decoder writes a received view's shape and strides in place
  // (serialization/src/tensor_wire.cpp).
  friend struct detail::ReceivedView;
  Tensor(std::shared_ptr<Storage> storage, DType dtype, Shape shape, Shape strides, std::int64_t offset, Device device);
  // A contiguous tensor of `shape` at offset 0: its shape and strides made in place.
  Tensor(std::shared_ptr<Storage>&& storage, DType dtype, const Shape& shape, Device device);
  std::size_t wrap_dim(std::int64_t d) const;
  Tensor& fill_with(const detail::FillValue& value);
  void check_element_type(DType requested) const;
  std::byte* element_address(std::initializer_list<std::int64_t> index) const;

  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::Float32;
  Shape shape_;
  Shape strides_;
  std::int64_t offset_ = 0;
  Device device_ = Device::Cpu;  // used only when there is no storage
  bool defined_ = false;
};

/// Row-major strides of a contiguous tensor of `shape`. Throws Error when a stride does
/// not fit in 64 bits (only possible for a shape with a zero extent, e.g. {0, 2^40, 2^40}).
Shape contiguous_strides(const Shape& shape);

/// Copies the elements of a strided source into a strided destination of the same shape.
void copy_strided(std::byte* destination, const Shape& destination_strides, const std::byte* source,
                  const Shape& source_strides, const Shape& shape, std::size_t element_size);

namespace detail {
/// Tensor::from()'s error, out of line (every element type instantiates it).
[[noreturn]] void throw_values_do_not_fill(std::size_t values, std::int64_t elements);
}  // namespace detail

template <class T>
Tensor Tensor::from(std::span<const T> values, const Shape& shape, Device device) {
  if (!device.is_cpu()) {  // device memory: fill a CPU tensor, then copy it over
    Tensor tensor = empty(shape, dtype_of<T>, device);
    tensor.copy_from(from(values, shape, Device::Cpu));
    return tensor;
  }
  Tensor tensor = empty(shape, dtype_of<T>, device);
  if (static_cast<std::size_t>(tensor.numel()) != values.size()) {
    detail::throw_values_do_not_fill(values.size(), tensor.numel());
  }
  if (!values.empty()) std::memcpy(tensor.data_ptr(), values.data(), values.size() * sizeof(T));
  return tensor;
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  check_element_type(dtype_of<T>);
  const Tensor dense = contiguous();
  std::vector<T> out(static_cast<std::size_t>(dense.numel()));
  if (!out.empty()) std::memcpy(out.data(), dense.data_ptr(), out.size() * sizeof(T));
  return out;
}

}  // namespace ferry
