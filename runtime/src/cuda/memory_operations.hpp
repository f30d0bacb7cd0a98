// Driver functions reached through the runtime (ferry does not link libcuda itself, so that a
// CUDA build still starts on a machine without a driver), among them the 64-bit stream
// memory operations (cuStreamWriteValue64 / cuStreamWaitValue64). Private to runtime/src/cuda.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

#include "cuda/cudart.hpp"
#include "ferry/cuda/runtime.hpp"

namespace ferry::cuda {

/// The driver function `name` (as of the CUDA 12.0 API), or null where the driver has none.
template <class Function>
Function driver_function(const char* name) {
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t status =
      cuda::cudart().cudaGetDriverEntryPointByVersion(name, &entry, 12000, cudaEnableDefault, &found);
  if (status != cudaSuccess || found != cudaDriverEntryPointSuccess) {
    ignore_cuda_error(status);
    return nullptr;
  }
  return reinterpret_cast<Function>(entry);
}

/// The stream memory operations, resolved once per process (null where the driver has none).
struct MemoryOperations {
  using WriteValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
  using WaitValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
  using DeviceAttribute = CUresult (*)(int*, CUdevice_attribute, CUdevice);

  WriteValue64 write_value = driver_function<WriteValue64>("cuStreamWriteValue64");
  WaitValue64 wait_value = driver_function<WaitValue64>("cuStreamWaitValue64");
  DeviceAttribute attribute = driver_function<DeviceAttribute>("cuDeviceGetAttribute");

  static const MemoryOperations& get() {
    static const MemoryOperations operations;
    return operations;
  }

  /// Whether `device` (a runtime ordinal, which is the driver's ordinal as well) has them.
  bool supported_on(int device) const {
    if (write_value == nullptr || wait_value == nullptr || attribute == nullptr) return false;
    int supported = 0;
    return attribute(&supported, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, device) == CUDA_SUCCESS &&
           supported != 0;
  }
};

/// Throws CudaError naming `what` unless `status` is CUDA_SUCCESS.
inline void check_driver(CUresult status, const std::string& what) {
  if (status == CUDA_SUCCESS) return;
  throw CudaError(what + " failed (driver status " + std::to_string(static_cast<int>(status)) + ")", cudaErrorUnknown);
}

}  // namespace ferry::cuda
