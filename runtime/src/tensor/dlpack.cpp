#include "ferry/dlpack.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/allocation.hpp"
#include "ferry/storage.hpp"

namespace ferry {
namespace {

// What a DLManagedTensor made by to_dlpack() points to: the view (which keeps the storage
// alive) and the shape and strides arrays the DLTensor points into.
struct ExportedTensor {
  Tensor tensor;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  DLManagedTensor managed{};
};

void delete_exported(DLManagedTensor* managed) { delete static_cast<ExportedTensor*>(managed->manager_ctx); }

// Runs a foreign tensor's deleter exactly once.
struct ForeignDeleter {
  void operator()(DLManagedTensor* managed) const noexcept {
    if (managed->deleter != nullptr) managed->deleter(managed);
  }
};
using ForeignTensor = std::unique_ptr<DLManagedTensor, ForeignDeleter>;

// The bytes a foreign tensor spans, kept alive by owning the foreign tensor.
class ForeignAllocation final : public Allocation {
 public:
  ForeignAllocation(ForeignTensor foreign, std::byte* data, std::size_t size)
      : foreign_(std::move(foreign)), data_(data), size_(size) {}
  std::byte* data() const noexcept override { return data_; }
  std::size_t size() const noexcept override { return size_; }
  Device device() const noexcept override { return Device::Cpu; }

 private:
  ForeignTensor foreign_;
  std::byte* data_;
  std::size_t size_;
};

}  // namespace

std::optional<DLDataType> dlpack_dtype(DType dtype) noexcept {
  const auto bits = [dtype] { return static_cast<std::uint8_t>(8 * dtype_size(dtype)); };
  switch (dtype) {
    case DType::Bool: return std::nullopt;
    case DType::UInt8: return DLDataType{kDLUInt, bits(), 1};
    case DType::Int8:
    case DType::Int16:
    case DType::Int32:
    case DType::Int64: return DLDataType{kDLInt, bits(), 1};
    case DType::Float16:
    case DType::Float32:
    case DType::Float64: return DLDataType{kDLFloat, bits(), 1};
    case DType::BFloat16: return DLDataType{kDLBfloat, 16, 1};
  }
  return std::nullopt;
}

std::optional<DType> dtype_from_dlpack(DLDataType type) noexcept {
  if (type.lanes != 1) return std::nullopt;
  switch (type.code) {
    case kDLUInt:
      if (type.bits == 8) return DType::UInt8;
      return std::nullopt;
    case kDLInt:
      switch (type.bits) {
        case 8: return DType::Int8;
        case 16: return DType::Int16;
        case 32: return DType::Int32;
        case 64: return DType::Int64;
        default: return std::nullopt;
      }
    case kDLFloat:
      switch (type.bits) {
        case 16: return DType::Float16;
        case 32: return DType::Float32;
        case 64: return DType::Float64;
        default: return std::nullopt;
      }
    case kDLBfloat:
      if (type.bits == 16) return DType::BFloat16;
      return std::nullopt;
    default: return std::nullopt;
  }
}

DLManagedTensor* to_dlpack(const Tensor& tensor) {
  if (!tensor.defined()) throw Error("to_dlpack: the tensor is undefined (default-constructed); nothing to export");
  const std::optional<DLDataType> type = dlpack_dtype(tensor.dtype());
  if (!type) {
    throw Error(
        "to_dlpack: a bool tensor cannot be exported, DLPack 0.6 has no bool type; "
        "export a uint8 tensor of the same bytes, or read it through __array_interface__ (NumPy)");
  }
  auto exported = std::make_unique<ExportedTensor>();
  exported->tensor = tensor;
  exported->shape.assign(tensor.shape().begin(), tensor.shape().end());
  exported->strides.assign(tensor.strides().begin(), tensor.strides().end());
  DLTensor& dl = exported->managed.dl_tensor;
  dl.data = tensor.data_ptr();  // element 0: consumers such as torch 1.13 ignore byte_offset
  dl.byte_offset = 0;
  const Device device = tensor.device();
  dl.device = device.kind == DeviceKind::Cuda ? DLDevice{kDLCUDA, device.index} : DLDevice{kDLCPU, 0};
  dl.ndim = static_cast<int>(tensor.dim());
  dl.dtype = *type;
  dl.shape = exported->shape.data();
  dl.strides = exported->strides.data();
  exported->managed.manager_ctx = exported.get();
  exported->managed.deleter = delete_exported;
  return &exported.release()->managed;
}

Tensor from_dlpack(DLManagedTensor* managed) {
  if (managed == nullptr) throw Error("from_dlpack: the DLManagedTensor is null");
  ForeignTensor foreign(managed);  // its deleter runs if anything below throws
  const DLTensor& dl = managed->dl_tensor;
  if (dl.device.device_type != kDLCPU && dl.device.device_type != kDLCUDAHost) {
    throw Error("from_dlpack: only CPU tensors can be wrapped, not DLPack device type " +
                std::to_string(dl.device.device_type) + "; copy the tensor to the CPU first");
  }
  const std::optional<DType> dtype = dtype_from_dlpack(dl.dtype);
  if (!dtype) {
    throw Error("from_dlpack: ferry has no element type for DLPack code " + std::to_string(dl.dtype.code) + ", " +
                std::to_string(dl.dtype.bits) + " bits, " + std::to_string(dl.dtype.lanes) + " lanes");
  }
  if (dl.ndim < 0 || static_cast<std::size_t>(dl.ndim) > kMaxDims) {
    throw Error("from_dlpack: the tensor has " + std::to_string(dl.ndim) + " dimensions (ferry takes 0 to " +
                std::to_string(kMaxDims) + ")");
  }
  Shape shape;
  for (int d = 0; d < dl.ndim; ++d) shape.push_back(dl.shape[d]);
  Shape strides = dl.strides != nullptr ? Shape{} : contiguous_strides(shape);
  if (dl.strides != nullptr) {
    for (int d = 0; d < dl.ndim; ++d) strides.push_back(dl.strides[d]);
  }
  const std::size_t element = dtype_size(*dtype);
  // The bytes from element 0 to one past the last element; a tensor without elements spans none.
  std::int64_t count = 1;
  std::int64_t last = 0;  // in elements from element 0
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0) throw Error("from_dlpack: the tensor has a negative size " + std::to_string(shape[d]));
    if (strides[d] < 0) {
      throw Error("from_dlpack: the tensor has a negative stride " + std::to_string(strides[d]) +
                  " (ferry views have none); pass a contiguous copy");
    }
    count *= shape[d];
    if (shape[d] > 0) last += (shape[d] - 1) * strides[d];
  }
  if (count == 0) return Tensor::empty(shape, *dtype);  // the foreign tensor dies here: nothing to view
  auto* first = static_cast<std::byte*>(dl.data) + dl.byte_offset;
  const auto span = static_cast<std::size_t>(last + 1) * element;
  auto storage = Storage::adopt(std::make_shared<ForeignAllocation>(std::move(foreign), first, span));
  return Tensor::from_storage(std::move(storage), *dtype, std::move(shape), std::move(strides), 0);
}

}  // namespace ferry
