#include "ferry/tensor_wire.hpp"

#include <cstring>
#include <type_traits>

#include "ferry/detail/message_encoder.hpp"
#include "ferry/detail/view_bounds.hpp"

namespace ferry {
namespace {

// First byte of a tensor on the wire.
enum class TensorState : std::uint8_t {
  Undefined = 0,  // default-constructed Tensor
  NoStorage = 1,  // zero elements: travels without a storage or mapping
  Stored = 2,     // elements in the storage at `handle` of the frame's table
};

// The wire record of a tensor (unchanged since version 1; every field little-endian as in
// memory, packed): state (u8); then, unless Undefined, dtype (u8), device kind (u8), ndim
// (u32) and the ndim sizes (i64); then, when Stored, the ndim strides (i64), the storage
// offset (i64) and the storage's handle index (u32). Written in place in the body and read with
// one bounds check per part: a message of many small tensors pays per tensor, not per field.
constexpr std::size_t kAfterStateBytes = 2 + sizeof(std::uint32_t);
constexpr std::size_t kStorageTailBytes = sizeof(std::int64_t) + sizeof(std::uint32_t);

template <class T>
std::byte* put(std::byte* at, T value) noexcept {
  std::memcpy(at, &value, sizeof value);
  return at + sizeof value;
}

// Entry by entry: one memcpy of a variable size compiles to a call or `rep movs`, whose
// start-up costs more than the few moves of a small shape.
std::byte* put_entries(std::byte* at, const Shape& entries) noexcept {
  for (const std::int64_t entry : entries) at = put(at, entry);
  return at;
}

template <class T>
T get(const std::byte*& at) noexcept {
  T value;
  std::memcpy(&value, at, sizeof value);
  at += sizeof value;
  return value;
}

void get_entries(const std::byte* at, Shape& entries) noexcept {
  for (std::int64_t& entry : entries) entry = get<std::int64_t>(at);
}

}  // namespace

namespace detail {

// A friend of Tensor: a received view's sizes and strides are read straight into the
// tensor's own Shapes (no temporaries to make, move and destroy per tensor), checked, and
// only then joined to the storage. A view that fails the check leaves the tensor undefined.
struct ReceivedView {
  // `layout`: the ndim sizes, then the ndim strides, as on the wire. `Take`: the tensor takes
  // `storage` over (moved from: no count changes) instead of sharing it.
  template <bool Take>
  static void assign(Tensor& tensor,
                     std::conditional_t<Take, std::shared_ptr<Storage>&, const std::shared_ptr<Storage>&> storage,
                     DType dtype, std::uint32_t ndim, const std::byte* layout, std::int64_t offset) {
    // Undefined until the view passed its check (a Shape that must grow may throw bad_alloc).
    tensor.storage_.reset();
    tensor.defined_ = false;
    Shape& shape = tensor.shape_;
    Shape& strides = tensor.strides_;
    shape.resize_for_overwrite(ndim);
    get_entries(layout, shape);
    strides.resize_for_overwrite(ndim);
    get_entries(layout + std::size_t{ndim} * sizeof(std::int64_t), strides);
    if (!detail::view_in_bounds(storage->nbytes(), dtype, shape.data(), strides.data(), ndim, offset)) [[unlikely]] {
      std::string problem = detail::view_bounds_problem(storage->nbytes(), dtype, shape, strides, offset)
                                .value_or("tensor view is outside its storage");
      tensor = Tensor();
      throw ProtocolError("received " + problem);
    }
    tensor.device_ = storage->device();
    if constexpr (Take) {
      tensor.storage_ = std::move(storage);
    } else {
      tensor.storage_ = storage;
    }
    tensor.dtype_ = dtype;
    tensor.offset_ = offset;
    tensor.defined_ = true;
  }
};

}  // namespace detail

void CEREAL_SAVE_FUNCTION_NAME(detail::FrameOutputArchive& archive, const Tensor& tensor) {
  if (!tensor.defined()) {
    archive(static_cast<std::uint8_t>(TensorState::Undefined));
    return;
  }
  const std::size_t ndim = tensor.shape().size();
  if (ndim > kMaxDims) {  // no Tensor factory or view makes one; the record below has no room
    throw Error("a tensor with " + std::to_string(ndim) + " dimensions cannot be sent (at most " +
                std::to_string(kMaxDims) + ")");
  }
  const bool stored = tensor.numel() > 0;
  // Read before add_storage(), which moves a heap storage into shared memory (and so
  // changes its device): the record names the device the tensor had when it was sent.
  const auto device = static_cast<std::uint8_t>(tensor.device().kind);
  // The handle index before the record: add_storage() appends nothing to the body, but it may throw.
  const std::uint32_t handle = stored ? archive.encoder().add_storage(tensor.storage()) : 0;
  const std::size_t bytes = 1 + kAfterStateBytes + ndim * sizeof(std::int64_t) +
                            (stored ? ndim * sizeof(std::int64_t) + kStorageTailBytes : 0);
  std::byte* at = archive.extend(bytes);  // the record is written in place
  at = put(at, static_cast<std::uint8_t>(stored ? TensorState::Stored : TensorState::NoStorage));
  at = put(at, static_cast<std::uint8_t>(tensor.dtype()));
  at = put(at, device);
  at = put(at, static_cast<std::uint32_t>(ndim));
  at = put_entries(at, tensor.shape());
  if (stored) {
    at = put_entries(at, tensor.strides());
    at = put(at, tensor.storage_offset());
    put(at, handle);
  }
}

void CEREAL_LOAD_FUNCTION_NAME(detail::FrameInputArchive& archive, Tensor& tensor) {
  const auto state = static_cast<std::uint8_t>(*archive.take(1));
  if (state == static_cast<std::uint8_t>(TensorState::Undefined)) {
    tensor = Tensor();
    return;
  }
  if (state != static_cast<std::uint8_t>(TensorState::NoStorage) &&
      state != static_cast<std::uint8_t>(TensorState::Stored)) {
    throw ProtocolError("tensor has an invalid state byte " + std::to_string(state));
  }
  const std::byte* at = archive.take(kAfterStateBytes);
  const auto raw_dtype = get<std::uint8_t>(at);
  const auto raw_device = get<std::uint8_t>(at);
  const auto ndim = get<std::uint32_t>(at);
  if (!is_valid_dtype(raw_dtype)) throw ProtocolError("tensor has an invalid dtype value " + std::to_string(raw_dtype));
  if (ndim > kMaxDims) {
    throw ProtocolError("tensor has " + std::to_string(ndim) + " dimensions, above the limit of " +
                        std::to_string(kMaxDims));
  }
  const auto dtype = static_cast<DType>(raw_dtype);
  if (state == static_cast<std::uint8_t>(TensorState::NoStorage)) {
    Shape shape;
    shape.resize_for_overwrite(ndim);
    get_entries(archive.take(ndim, sizeof(std::int64_t)), shape);
    std::int64_t count = 1;
    for (const std::int64_t extent : shape) {
      if (extent < 0) throw ProtocolError("tensor has a negative size " + std::to_string(extent));
      if (__builtin_mul_overflow(count, extent, &count)) throw ProtocolError("tensor element count overflows");
    }
    if (count != 0) throw ProtocolError("tensor without storage claims " + std::to_string(count) + " elements");
    const Device device =
        raw_device == static_cast<std::uint8_t>(DeviceKind::SharedCpu) ? Device::SharedCpu : Device::Cpu;
    try {
      tensor = Tensor::empty(shape, dtype, device);  // no elements: allocates nothing
    } catch (const Error& error) {
      throw ProtocolError(std::string("received tensor without elements is invalid: ") + error.what());
    }
    return;
  }
  // Stored: the sizes, strides, offset and handle, read with one bounds check.
  const std::byte* layout = archive.take(2 * std::size_t{ndim} * sizeof(std::int64_t) + kStorageTailBytes);
  const std::byte* tail = layout + 2 * std::size_t{ndim} * sizeof(std::int64_t);
  const auto offset = get<std::int64_t>(tail);
  const auto handle = get<std::uint32_t>(tail);
  const auto storages = archive.storages();
  if (handle >= storages.size()) {
    throw ProtocolError("tensor handle index " + std::to_string(handle) + " is out of range: the frame has " +
                        std::to_string(storages.size()) + " storages");
  }
  // The record that ends the body takes the frame's reference over: a message of one tensor
  // changes no reference count here.
  if (std::shared_ptr<Storage>* frames = archive.storage_to_take(handle)) [[unlikely]] {
    detail::ReceivedView::assign<true>(tensor, *frames, dtype, ndim, layout, offset);
  } else {
    detail::ReceivedView::assign<false>(tensor, storages[handle], dtype, ndim, layout, offset);
  }
}

}  // namespace ferry
