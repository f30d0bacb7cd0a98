#include "ferry/tensor_wire.hpp"

#include "ferry/message_encoder.hpp"
#include "ferry/view_bounds.hpp"

namespace ferry {
namespace {

// First byte of a tensor on the wire.
enum class TensorState : std::uint8_t {
  Undefined = 0,  // default-constructed Tensor
  NoStorage = 1,  // zero elements: travels without a storage or mapping
  Stored = 2,     // elements in the storage at `handle` of the frame's table
};

}  // namespace

void CEREAL_SAVE_FUNCTION_NAME(FrameOutputArchive& archive, const Tensor& tensor) {
  if (!tensor.defined()) {
    archive(static_cast<std::uint8_t>(TensorState::Undefined));
    return;
  }
  const bool stored = tensor.numel() > 0;
  archive(static_cast<std::uint8_t>(stored ? TensorState::Stored : TensorState::NoStorage),
          static_cast<std::uint8_t>(tensor.dtype()), static_cast<std::uint8_t>(tensor.device().kind),
          static_cast<std::uint32_t>(tensor.dim()));
  for (const std::int64_t extent : tensor.shape()) archive(extent);
  if (!stored) return;
  for (const std::int64_t stride : tensor.strides()) archive(stride);
  archive(tensor.storage_offset(), archive.encoder().add_storage(tensor.storage()));
}

void CEREAL_LOAD_FUNCTION_NAME(FrameInputArchive& archive, Tensor& tensor) {
  std::uint8_t state = 0;
  archive(state);
  if (state == static_cast<std::uint8_t>(TensorState::Undefined)) {
    tensor = Tensor();
    return;
  }
  if (state != static_cast<std::uint8_t>(TensorState::NoStorage) && state != static_cast<std::uint8_t>(TensorState::Stored)) {
    throw ProtocolError("tensor has an invalid state byte " + std::to_string(state));
  }
  std::uint8_t raw_dtype = 0;
  std::uint8_t raw_device = 0;
  std::uint32_t ndim = 0;
  archive(raw_dtype, raw_device, ndim);
  if (!is_valid_dtype(raw_dtype)) throw ProtocolError("tensor has an invalid dtype value " + std::to_string(raw_dtype));
  if (ndim > kMaxDims) {
    throw ProtocolError("tensor has " + std::to_string(ndim) + " dimensions, above the limit of " +
                        std::to_string(kMaxDims));
  }
  const auto dtype = static_cast<DType>(raw_dtype);
  // Entry by entry: one memcpy of a variable size compiles to `rep movs`, whose start-up
  // costs more than the few moves of a small shape.
  Shape shape;
  shape.resize_for_overwrite(ndim);
  for (std::int64_t& extent : shape) archive(extent);
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
  for (std::int64_t& stride : strides) archive(stride);
  std::int64_t offset = 0;
  std::uint32_t handle = 0;
  archive(offset, handle);
  const auto storages = archive.storages();
  if (handle >= storages.size()) {
    throw ProtocolError("tensor handle index " + std::to_string(handle) + " is out of range: the frame has " +
                        std::to_string(storages.size()) + " storages");
  }
  const std::shared_ptr<Storage>& storage = storages[handle];
  if (auto problem = view_bounds_problem(storage->nbytes(), dtype, shape, strides, offset)) {
    throw ProtocolError("received " + *problem);
  }
  tensor.assign_checked_storage(storage, dtype, std::move(shape), std::move(strides), offset);
}

}  // namespace ferry
