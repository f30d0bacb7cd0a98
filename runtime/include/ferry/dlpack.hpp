// DLPack interchange: a ferry Tensor handed to another framework (PyTorch, NumPy, CuPy,
// JAX, libtorch) or a foreign tensor wrapped as a ferry Tensor, without copying bytes.
// Uses the system's <dlpack/dlpack.h> (DLPack 0.6 on Debian 12, which libtorch's
// ATen/dlpack.h matches under the same include guard).
#pragma once

#include <dlpack/dlpack.h>

#include <optional>

#include "ferry/dtype.hpp"
#include "ferry/tensor.hpp"

namespace ferry {

/// A DLManagedTensor viewing `tensor`'s elements, owned by the caller: call its deleter
/// when done (the tensor's storage stays alive until then). `data` points at element 0
/// and `byte_offset` is 0 (torch 1.13 ignores byte_offset); strides are always given.
/// Throws Error for an undefined tensor and for bool, which DLPack 0.6 has no type for
/// (view the bytes as uint8 instead).
DLManagedTensor* to_dlpack(const Tensor& tensor);

/// Wraps the foreign tensor `managed` as a ferry Tensor without copying; takes ownership:
/// its deleter runs when the last ferry view of it dies (at once when this throws). Only
/// CPU memory (kDLCPU, kDLCUDAHost); Error for another device, a dtype ferry lacks, vector
/// lanes or negative strides. The tensor is private (Device::Cpu): sending it copies its
/// elements once into shared memory, like any heap tensor.
Tensor from_dlpack(DLManagedTensor* managed);

/// DLPack's data type for `dtype`; std::nullopt for Bool.
std::optional<DLDataType> dlpack_dtype(DType dtype) noexcept;

/// ferry's DType for a DLPack data type; std::nullopt when ferry has none (complex, lanes > 1, ...).
std::optional<DType> dtype_from_dlpack(DLDataType type) noexcept;

}  // namespace ferry
