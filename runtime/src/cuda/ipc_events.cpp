// Interprocess events: the sender records one after its writes, the receiver's stream waits
// for it; no host synchronization on either side (except in the documented fallback).
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ferry/cuda/ipc.hpp"
#include "ferry/cuda/runtime.hpp"

namespace ferry::cuda {
namespace {

static_assert(sizeof(cudaIpcEventHandle_t) == sizeof(IpcHandle));

std::atomic<std::uint64_t> g_events_opened{0};

// FERRY_CUDA_SYNC_SENDS=1: always synchronize instead of passing events (for comparison and
// for testing the fallback).
bool sync_sends_forced() {
  static const bool forced = [] {
    const char* value = std::getenv("FERRY_CUDA_SYNC_SENDS");
    return value != nullptr && std::strcmp(value, "1") == 0;
  }();
  return forced;
}

// Errors that mean "no (more) interprocess events here": resources ran out, or the platform
// does not support them. The sender then synchronizes instead.
bool events_unavailable(cudaError_t status) {
  return status == cudaErrorMemoryAllocation || status == cudaErrorLaunchOutOfResources ||
         status == cudaErrorNotSupported || status == cudaErrorOperatingSystem;
}

void warn_fallback_once(cudaError_t status) {
  static std::once_flag once;
  std::call_once(once, [status] {
    std::fprintf(stderr,
                 "ferry: warning: cannot create an interprocess CUDA event (%s: %s); sends of CUDA tensors "
                 "synchronize the sending stream instead (slower, still correct)\n",
                 cudaGetErrorName(status), cudaGetErrorString(status));
  });
}

}  // namespace

std::uint64_t ipc_events_opened() noexcept { return g_events_opened.load(std::memory_order_relaxed); }

// ---- sender ----------------------------------------------------------------------------

struct SendEvents::Impl {
  struct PerDevice {
    cudaEvent_t event = nullptr;
    IpcHandle handle{};
    cudaStream_t last_stream = nullptr;
    bool recorded = false;
    bool fallback = false;  // no event could be made: synchronize instead
  };
  std::vector<PerDevice> devices;

  ~Impl() {
    for (std::size_t device = 0; device < devices.size(); ++device) {
      if (devices[device].event == nullptr) continue;
      try {
        DeviceGuard guard(static_cast<int>(device));
        ignore_cuda_error(cudaEventDestroy(devices[device].event));
      } catch (...) {
        // The device is unusable (the process is exiting).
      }
    }
  }

  // Creates the device's event and its IPC handle, or switches the device to the fallback.
  void create(PerDevice& slot, int device) {
    cudaEvent_t event = nullptr;
    cudaError_t status = cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming);
    if (status == cudaSuccess) {
      cudaIpcEventHandle_t handle{};
      status = cudaIpcGetEventHandle(&handle, event);
      if (status == cudaSuccess) {
        std::memcpy(slot.handle.data(), &handle, sizeof handle);
        slot.event = event;
        return;
      }
      ignore_cuda_error(cudaEventDestroy(event));
    }
    if (!events_unavailable(status)) {
      check_cuda(status, "creating an interprocess CUDA event on cuda:" + std::to_string(device));
    }
    ignore_cuda_error(status);
    warn_fallback_once(status);
    slot.fallback = true;
  }
};

SendEvents::SendEvents() : impl_(std::make_unique<Impl>()) {}
SendEvents::~SendEvents() = default;

std::optional<IpcHandle> SendEvents::record(int device) {
  const auto index = static_cast<std::size_t>(device);
  if (impl_->devices.size() <= index) impl_->devices.resize(index + 1);
  Impl::PerDevice& slot = impl_->devices[index];
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  if (!slot.fallback && slot.event == nullptr && !sync_sends_forced()) impl_->create(slot, device);
  if (slot.fallback || sync_sends_forced()) {
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize before sending a CUDA tensor (no IPC event)");
    return std::nullopt;
  }
  // A receiver waits for the event's latest record only. When the sender moved to another
  // stream, make that stream wait for the previous record first, so that the new record
  // also covers the work of the earlier frames' stream.
  if (slot.recorded && stream != slot.last_stream) {
    check_cuda(cudaStreamWaitEvent(stream, slot.event, 0), "cudaStreamWaitEvent chaining a send's IPC event");
  }
  check_cuda(cudaEventRecord(slot.event, stream), "cudaEventRecord of a send's IPC event on cuda:" + std::to_string(device));
  slot.recorded = true;
  slot.last_stream = stream;
  return slot.handle;
}

// ---- receiver --------------------------------------------------------------------------

struct ReceiveEvents::Impl {
  std::map<std::pair<int, IpcHandle>, cudaEvent_t> opened;

  ~Impl() {
    for (const auto& [key, event] : opened) {
      try {
        DeviceGuard guard(key.first);
        ignore_cuda_error(cudaEventDestroy(event));
      } catch (...) {
        // The device is unusable (the process is exiting).
      }
    }
  }
};

ReceiveEvents::ReceiveEvents() : impl_(std::make_unique<Impl>()) {}
ReceiveEvents::~ReceiveEvents() = default;

void ReceiveEvents::wait(int device, const IpcHandle& handle) {
  DeviceGuard guard(device);
  std::pair<int, IpcHandle> key{device, handle};
  auto it = impl_->opened.find(key);
  if (it == impl_->opened.end()) {
    cudaIpcEventHandle_t ipc_handle{};
    std::memcpy(&ipc_handle, handle.data(), sizeof ipc_handle);
    cudaEvent_t event = nullptr;
    check_cuda(cudaIpcOpenEventHandle(&event, ipc_handle), "cudaIpcOpenEventHandle of a sender's event");
    g_events_opened.fetch_add(1, std::memory_order_relaxed);
    it = impl_->opened.emplace(key, event).first;
  }
  check_cuda(cudaStreamWaitEvent(current_stream(device), it->second, 0),
             "cudaStreamWaitEvent on a sender's IPC event (cuda:" + std::to_string(device) + ")");
}

}  // namespace ferry::cuda
