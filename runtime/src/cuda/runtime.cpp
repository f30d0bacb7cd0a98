// Checked CUDA calls, device and stream selection, and whether CUDA is usable at all.
#include "ferry/cuda/runtime.hpp"
#include "cuda/cudart.hpp"

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ferry {
namespace {

std::string hint(cudaError_t status) {
  switch (status) {
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
      return "; no usable NVIDIA driver or GPU here: run on a machine with one (and the driver installed)";
    case cudaErrorInitializationError:
      return "; if this process was forked from one that had already used CUDA: CUDA does not survive fork(), so "
             "fork the workers before the parent touches CUDA";
    case cudaErrorInvalidDevice:
      return "; the device ordinal does not exist in this process (see CUDA_VISIBLE_DEVICES)";
    case cudaErrorMemoryAllocation: return "; the device is out of memory";
    default: return "";
  }
}

struct DeviceCount {
  int count = 0;
  std::string reason;  // why count is 0
};

const DeviceCount& probe_devices() {
  static DeviceCount result;
  static std::once_flag once;
  std::call_once(once, [] {
    const cuda::Cudart* runtime = nullptr;
    try {
      runtime = &cuda::cudart();
    } catch (const CudaError& error) {  // no CUDA runtime here: no device, and why
      result.reason = error.what();
      return;
    }
    const cudaError_t status = runtime->cudaGetDeviceCount(&result.count);
    if (status != cudaSuccess) {
      (void)cuda::cudart().cudaGetLastError();  // do not leave the error for the next CUDA call
      result.count = 0;
      result.reason = std::string("cudaGetDeviceCount failed: ") + cuda::cudart().cudaGetErrorName(status) + " (" +
                      cuda::cudart().cudaGetErrorString(status) + ")" + hint(status);
    } else if (result.count == 0) {
      result.reason = "cudaGetDeviceCount found no CUDA device";
    }
  });
  return result;
}

thread_local std::vector<cudaStream_t> t_current_streams;

}  // namespace

bool cuda_built() noexcept { return true; }

int cuda_device_count() { return probe_devices().count; }

bool cuda_available() { return cuda_device_count() > 0; }

std::string cuda_unavailable_reason() { return probe_devices().reason; }

namespace cuda {

void check_cuda(cudaError_t status, std::string_view what) {
  if (status == cudaSuccess) return;
  (void)cuda::cudart().cudaGetLastError();  // clear a non-sticky error so that the next call does not report it again
  throw CudaError(std::string(what) + " failed: " + cuda::cudart().cudaGetErrorName(status) + " (" +
                      cuda::cudart().cudaGetErrorString(status) + ")" + hint(status),
                  static_cast<int>(status));
}

void ignore_cuda_error(cudaError_t status) noexcept {
  if (status != cudaSuccess) (void)cuda::cudart().cudaGetLastError();
}

void check_device(int device) {
  const int count = cuda_device_count();
  if (device >= 0 && device < count) return;
  std::string message = "cuda:" + std::to_string(device) + " is not a CUDA device of this process: it sees " +
                        std::to_string(count) + " device(s)";
  if (count == 0) message += " (" + cuda_unavailable_reason() + ")";
  throw CudaError(message, static_cast<int>(count == 0 ? cudaErrorNoDevice : cudaErrorInvalidDevice));
}

void wait_for_stream(cudaStream_t stream, std::string_view what) {
  for (int polls = 0;; ++polls) {
    const cudaError_t status = cuda::cudart().cudaStreamQuery(stream);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) check_cuda(status, what);
    if (polls < 200) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(polls < 2000 ? 20 : 200));
    }
  }
}

DeviceGuard::DeviceGuard(int device) {
  int current = -1;
  check_cuda(cuda::cudart().cudaGetDevice(&current), "cudaGetDevice");
  if (current != device) {
    check_cuda(cuda::cudart().cudaSetDevice(device), "cuda::cudart().cudaSetDevice(" + std::to_string(device) + ")");
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) ignore_cuda_error(cuda::cudart().cudaSetDevice(previous_));
}

cudaStream_t current_stream(int device) noexcept {
  const auto index = static_cast<std::size_t>(device);
  return device >= 0 && index < t_current_streams.size() ? t_current_streams[index] : nullptr;
}

StreamGuard::StreamGuard(int device, cudaStream_t stream) : device_(device), previous_(current_stream(device)) {
  if (device < 0) throw CudaError("StreamGuard: invalid device " + std::to_string(device), cudaErrorInvalidDevice);
  const auto index = static_cast<std::size_t>(device);
  if (t_current_streams.size() <= index) t_current_streams.resize(index + 1, nullptr);
  t_current_streams[index] = stream;
}

StreamGuard::~StreamGuard() { t_current_streams[static_cast<std::size_t>(device_)] = previous_; }

}  // namespace cuda
}  // namespace ferry
