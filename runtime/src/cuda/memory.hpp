// Device memory for Storage and Tensor: allocating through ferry's caching allocator,
// zeroing, and copying between the CPU and CUDA devices. No CUDA types here: the runtime
// calls these from its CPU code in every build; without CUDA they throw Error saying so.
#pragma once

#include <cstddef>
#include <memory>

#include "ferry/device.hpp"

namespace ferry {
class Allocation;
class Storage;
class Tensor;
}  // namespace ferry

namespace ferry::cuda {

/// `bytes` of memory on `device` (a Cuda device) from the device's caching allocator
/// (block_pool.hpp). Throws CudaError for a device that does not exist or is out of memory.
std::shared_ptr<Allocation> allocate(std::size_t bytes, Device device);

/// Sets every byte of a CUDA storage to zero (on the current stream, then waits for it).
void zero(Storage& storage);

/// Copies the elements of `source` into `destination` (same shape and dtype, one or both on
/// a CUDA device) with cudaMemcpy on the current stream of the CUDA side, and waits for the
/// copy. Strided tensors are staged through host memory.
void copy(const Tensor& destination, const Tensor& source);

}  // namespace ferry::cuda
