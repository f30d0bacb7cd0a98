// Helpers around the CUDA runtime API: checked calls, the current device, and the stream
// ferry uses on each device. Only for builds with CUDA (FERRY_HAS_CUDA == 1): this header
// includes the CUDA runtime's.
#pragma once

#include <cuda_runtime_api.h>

#include <string_view>

#include "ferry/cuda.hpp"

namespace ferry::cuda {

/// Throws CudaError when `status` is not cudaSuccess. The message names `what` (the call
/// and its object), CUDA's name and description of the error, and a hint for the errors a
/// user can act on (no driver, no device, CUDA used before fork(), out of memory).
void check_cuda(cudaError_t status, std::string_view what);

/// Like check_cuda, for destructors: reports nothing and never throws. Errors that only say
/// that the process is exiting are expected there.
void ignore_cuda_error(cudaError_t status) noexcept;

/// Waits on the host until everything queued on `stream` is done, polling cudaStreamQuery
/// (yielding, then sleeping) instead of blocking in cudaStreamSynchronize. ferry's own waits
/// use it: a thread blocked inside the driver can keep other threads out of it, and the fence
/// watch (which frees streams waiting for a dead producer) must get in. Throws CudaError
/// naming `what`.
void wait_for_stream(cudaStream_t stream, std::string_view what);

/// Makes `device` the calling thread's current CUDA device while it lives, then restores
/// the previous one. Cheap when it already is.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

/// The stream ferry uses on `device` in the calling thread: senders give their signal (fence
/// or event) there, receivers make it wait for the sender's signal, copies run on it, and a
/// received storage waits for it before telling the producer it is done.
/// Default: the legacy default stream (nullptr), which orders against every blocking stream.
cudaStream_t current_stream(int device) noexcept;

/// Makes `stream` the calling thread's current stream on `device` while it lives.
class StreamGuard {
 public:
  StreamGuard(int device, cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  cudaStream_t previous_;
};

/// Throws CudaError unless `device` is an ordinal this process can use.
void check_device(int device);

}  // namespace ferry::cuda
