#include "ferry/tensor_wire.hpp"

#include <cstring>

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
// offset (i64) and the storage's handle index (u32). Written with one append and read with
// one bounds check per part: a message of many small tensors pays per tensor, not per field.
constexpr std::size_t kAfterStateBytes = 2 + sizeof(std::uint32_t);
constexpr std::size_t kStorageTailBytes = sizeof(std::int64_t) + sizeof(std::uint32_t);
constexpr std::size_t kMaxRecordBytes = 1 + kAfterStateBytes + 2 * kMaxDims * sizeof(std::int64_t) + kStorageTailBytes;

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

void CEREAL_SAVE_FUNCTION_NAME(FrameOutputArchive& archive, const Tensor& tensor) {
  if (!tensor.defined()) {
    archive(static_cast<std::uint8_t>(TensorState::Undefined));
    return;
  }
  if (tensor.shape().size() > kMaxDims) {  // no Tensor factory or view makes one; the record below has no room
    throw Error("a tensor with " + std::to_string(tensor.shape().size()) + " dimensions cannot be sent (at most " +
                std::to_string(kMaxDims) + ")");
  }
  const bool stored = tensor.numel() > 0;
  std::byte record[kMaxRecordBytes];
  std::byte* at = put(record, static_cast<std::uint8_t>(stored ? TensorState::Stored : TensorState::NoStorage));
  at = put(at, static_cast<std::uint8_t>(tensor.dtype()));
  at = put(at, static_cast<std::uint8_t>(tensor.device().kind));
  at = put(at, static_cast<std::uint32_t>(tensor.dim()));
  at = put_entries(at, tensor.shape());
  if (stored) {
    at = put_entries(at, tensor.strides());
    at = put(at, tensor.storage_offset());
    at = put(at, archive.encoder().add_storage(tensor.storage()));
  }
  archive.save_bytes(record, static_cast<std::size_t>(at - record));
}

void CEREAL_LOAD_FUNCTION_NAME(FrameInputArchive& archive, Tensor& tensor) {
  const auto state = static_cast<std::uint8_t>(*archive.take(1));
  if (state == static_cast<std::uint8_t>(TensorState::Undefined)) {
    tensor = Tensor();
    return;
  }
  if (state != static_cast<std::uint8_t>(TensorState::NoStorage) && state != static_cast<std::uint8_t>(TensorState::Stored)) {
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
  Shape shape;
  shape.resize_for_overwrite(ndim);
  get_entries(archive.take(ndim, sizeof(std::int64_t)), shape);
  if (state == static_cast<std::uint8_t>(TensorState::NoStorage)) {
    std::int64_t count = 1;
    for (const std::int64_t extent : shape) {
      if (extent < 0) throw ProtocolError("tensor has a negative size " + std::to_string(extent));
      if (__builtin_mul_overflow(count, extent, &count)) throw ProtocolError("tensor element count overflows");
    }
    if (count != 0) throw ProtocolError("tensor without storage claims " + std::to_string(count) + " elements");
    const Device device = raw_device == static_cast<std::uint8_t>(DeviceKind::SharedCpu) ? Device::SharedCpu : Device::Cpu;
    try {
      tensor = Tensor::empty(shape, dtype, device);  // no elements: allocates nothing
    } catch (const Error& error) {
      throw ProtocolError(std::string("received tensor without elements is invalid: ") + error.what());
    }
    return;
  }
  Shape strides;
  strides.resize_for_overwrite(ndim);
  at = archive.take(std::size_t{ndim} * sizeof(std::int64_t) + kStorageTailBytes);
  get_entries(at, strides);
  at += std::size_t{ndim} * sizeof(std::int64_t);
  const auto offset = get<std::int64_t>(at);
  const auto handle = get<std::uint32_t>(at);
  const auto storages = archive.storages();
  if (handle >= storages.size()) {
    throw ProtocolError("tensor handle index " + std::to_string(handle) + " is out of range: the frame has " +
                        std::to_string(storages.size()) + " storages");
  }
  const std::shared_ptr<Storage>& storage = storages[handle];
  if (!view_in_bounds(storage->nbytes(), dtype, shape, strides, offset)) [[unlikely]] {
    const auto problem = view_bounds_problem(storage->nbytes(), dtype, shape, strides, offset);
    throw ProtocolError("received " + problem.value_or("tensor view is outside its storage"));
  }
  tensor.assign_checked_storage(storage, dtype, std::move(shape), std::move(strides), offset);
}

}  // namespace ferry
