// Signals between a sender's stream and a receiver's: the receiver's work on a received
// storage must start after the sender's writes, with no host synchronization on either side.
//
// The usual signal is a fence: a 64-bit word of the sending process's fence buffer (one small
// cudaMalloc per device, exported once with cudaIpcGetMemHandle). Each sending connection owns
// one word; a frame writes the word's next value on the sending stream (cuStreamWriteValue64,
// ordered after the work queued before it, with a memory barrier) and the receiver's stream
// waits until the word reaches that value (cuStreamWaitValue64). Interprocess events were the
// first design and stay as the fallback where the driver lacks 64-bit stream memory
// operations; measured on an H200 (bench/diagnostics/cuda_call_costs.cpp), a receiver's
// cudaStreamSynchronize after waiting for an interprocess event took about 270 us against
// about 5 us after a fence, and the driver leaves a /dev/shm/cuda.shm.* file behind for every
// process that creates an interprocess event. Fences need no /dev/shm at all.
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/cudart.hpp"
#include "cuda/fence_watch.hpp"
#include "cuda/memory_operations.hpp"
#include "ferry/cuda/runtime.hpp"
#include "ferry/detail/cuda/block_pool.hpp"
#include "ferry/detail/cuda/ipc.hpp"

namespace ferry::cuda {
namespace {

static_assert(sizeof(cudaIpcEventHandle_t) == sizeof(IpcHandle));
static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(IpcHandle));

constexpr std::uint64_t kFenceBytes = sizeof(std::uint64_t);
constexpr std::size_t kFencesPerBuffer = kFenceBufferBytes / kFenceBytes;

std::atomic<std::uint64_t> g_events_opened{0};

// ---- the process's fence buffers --------------------------------------------------------

// One device's fence buffer. Words are lent to sending connections; a word's value only ever
// grows, also across connections that reuse it, so that a receiver still waiting for an
// earlier connection's value is never held back by a later one.
struct FenceBuffer {
  void* base = nullptr;
  IpcHandle handle{};
  std::uint64_t block_id = 0;
  std::vector<std::uint64_t> last_values = std::vector<std::uint64_t>(kFencesPerBuffer, 0);
  std::vector<std::size_t> free_words;
};

struct FenceBuffers {
  std::mutex mutex;
  std::map<int, FenceBuffer> by_device;  // never freed: receivers may wait on them until the process exits
};

FenceBuffers& fence_buffers() {
  static auto* instance = new FenceBuffers();  // leaked: connections may die during static destruction
  return *instance;
}

FenceBuffer& buffer_of(FenceBuffers& buffers, int device) {
  auto it = buffers.by_device.find(device);
  if (it != buffers.by_device.end()) return it->second;
  DeviceGuard guard(device);
  FenceBuffer buffer;
  check_cuda(cuda::cudart().cudaMalloc(&buffer.base, kFenceBufferBytes),
             "cudaMalloc of the fence buffer on cuda:" + std::to_string(device));
  try {
    // Zeroed before any stream may write or wait on it. The legacy default stream is polled
    // (see wait_for_stream), not the device synchronized: a stream of this process may be
    // waiting for a dead producer's fence, which the watch can only release from outside the
    // driver, and the device's other streams' work is none of this buffer's business.
    check_cuda(cuda::cudart().cudaMemset(buffer.base, 0, kFenceBufferBytes), "cudaMemset of the fence buffer");
    wait_for_stream(nullptr, "waiting for the zeroing of the fence buffer on cuda:" + std::to_string(device));
    cudaIpcMemHandle_t handle{};
    check_cuda(cuda::cudart().cudaIpcGetMemHandle(&handle, buffer.base), "cudaIpcGetMemHandle of the fence buffer");
    std::memcpy(buffer.handle.data(), &handle, sizeof handle);
  } catch (...) {
    ignore_cuda_error(cuda::cudart().cudaFree(buffer.base));
    throw;
  }
  buffer.block_id = next_block_id();
  for (std::size_t word = kFencesPerBuffer; word-- > 0;) buffer.free_words.push_back(word);
  return buffers.by_device.emplace(device, std::move(buffer)).first->second;
}

// A word lent to one connection on one device.
struct FenceWord {
  int device = -1;
  std::size_t index = 0;
  CUdeviceptr address = 0;
  std::uint64_t value = 0;  // the last value written
  IpcHandle handle{};
  std::uint64_t block_id = 0;
};

// A word of the device's buffer, or std::nullopt when all are lent (then the connection uses
// an event instead).
std::optional<FenceWord> borrow_fence(int device) {
  FenceBuffers& buffers = fence_buffers();
  std::lock_guard lock(buffers.mutex);
  FenceBuffer& buffer = buffer_of(buffers, device);
  if (buffer.free_words.empty()) return std::nullopt;
  FenceWord word;
  word.device = device;
  word.index = buffer.free_words.back();
  buffer.free_words.pop_back();
  word.address = reinterpret_cast<CUdeviceptr>(buffer.base) + word.index * kFenceBytes;
  word.value = buffer.last_values[word.index];
  word.handle = buffer.handle;
  word.block_id = buffer.block_id;
  return word;
}

void give_back_fence(const FenceWord& word) noexcept {
  FenceBuffers& buffers = fence_buffers();
  std::lock_guard lock(buffers.mutex);
  const auto it = buffers.by_device.find(word.device);
  if (it == buffers.by_device.end()) return;
  it->second.last_values[word.index] = word.value;
  it->second.free_words.push_back(word.index);
}

// ---- choosing the signal ----------------------------------------------------------------

// FERRY_CUDA_SEND_SIGNAL=fence|event|synchronize: the signal a connection starts with (for
// comparison and tests); unset or anything else: fence.
SignalKind first_choice() {
  static const SignalKind choice = [] {
    const char* value = std::getenv("FERRY_CUDA_SEND_SIGNAL");
    if (value != nullptr && std::strcmp(value, "event") == 0) return SignalKind::Event;
    if (value != nullptr && std::strcmp(value, "synchronize") == 0) return SignalKind::None;
    return SignalKind::Fence;
  }();
  return choice;
}

// Errors that mean "no (more) interprocess events here": resources ran out, or the platform
// does not support them. The sender then synchronizes instead.
bool events_unavailable(cudaError_t status) {
  return status == cudaErrorMemoryAllocation || status == cudaErrorLaunchOutOfResources ||
         status == cudaErrorNotSupported || status == cudaErrorOperatingSystem;
}

void warn_once(std::once_flag& once, const std::string& text) {
  std::call_once(once, [&] { std::fprintf(stderr, "ferry: warning: %s\n", text.c_str()); });
}

}  // namespace

std::uint64_t ipc_events_opened() noexcept { return g_events_opened.load(std::memory_order_relaxed); }

// ---- sender ----------------------------------------------------------------------------

struct SendSignals::Impl {
  struct PerDevice {
    SignalKind kind = SignalKind::None;
    bool chosen = false;
    std::optional<FenceWord> fence;
    cudaEvent_t event = nullptr;
    IpcHandle event_handle{};
    cudaStream_t last_stream = nullptr;
    bool signalled = false;
  };
  std::vector<PerDevice> devices;

  ~Impl() {
    for (std::size_t device = 0; device < devices.size(); ++device) {
      PerDevice& slot = devices[device];
      if (slot.fence) give_back_fence(*slot.fence);
      if (slot.event == nullptr) continue;
      try {
        DeviceGuard guard(static_cast<int>(device));
        ignore_cuda_error(cuda::cudart().cudaEventDestroy(slot.event));
      } catch (...) {
        // The device is unusable (the process is exiting).
      }
    }
  }

  // Picks the device's signal: a fence where the driver can, else an event, else none. Only
  // a choice that succeeded counts: when a call here throws (the fence buffer's cudaMalloc,
  // the event's creation), the next signal chooses again instead of using a kind whose fence
  // or event was never made.
  void choose(PerDevice& slot, int device) {
    slot.kind = first_choice();
    if (slot.kind == SignalKind::Fence) {
      if (MemoryOperations::get().supported_on(device)) slot.fence = borrow_fence(device);
      if (!slot.fence) {
        static std::once_flag once;
        warn_once(once, "cuda:" + std::to_string(device) +
                            " has no free fence or no 64-bit stream memory operations; sends of CUDA tensors use "
                            "interprocess events instead (slower; the CUDA driver leaves a /dev/shm/cuda.shm.* file "
                            "per sending process)");
        slot.kind = SignalKind::Event;
      }
    }
    if (slot.kind == SignalKind::Event) create_event(slot, device);
    slot.chosen = true;
  }

  void create_event(PerDevice& slot, int device) {
    cudaEvent_t event = nullptr;
    cudaError_t status =
        cuda::cudart().cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming);
    if (status == cudaSuccess) {
      cudaIpcEventHandle_t handle{};
      status = cuda::cudart().cudaIpcGetEventHandle(&handle, event);
      if (status == cudaSuccess) {
        std::memcpy(slot.event_handle.data(), &handle, sizeof handle);
        slot.event = event;
        return;
      }
      ignore_cuda_error(cuda::cudart().cudaEventDestroy(event));
    }
    if (!events_unavailable(status)) {
      check_cuda(status, "creating an interprocess CUDA event on cuda:" + std::to_string(device));
    }
    ignore_cuda_error(status);
    static std::once_flag once;
    warn_once(once, std::string("cannot create an interprocess CUDA event (") +
                        cuda::cudart().cudaGetErrorName(status) + ": " + cuda::cudart().cudaGetErrorString(status) +
                        "); sends of CUDA tensors synchronize the sending stream instead (slower, still correct)");
    slot.kind = SignalKind::None;
  }
};

SendSignals::SendSignals() : impl_(std::make_unique<Impl>()) {}
SendSignals::~SendSignals() = default;

SendSignal SendSignals::signal(int device) {
  const auto index = static_cast<std::size_t>(device);
  if (impl_->devices.size() <= index) impl_->devices.resize(index + 1);
  Impl::PerDevice& slot = impl_->devices[index];
  DeviceGuard guard(device);
  if (!slot.chosen) impl_->choose(slot, device);
  const cudaStream_t stream = current_stream(device);
  SendSignal signal;
  signal.kind = slot.kind;
  switch (slot.kind) {
    case SignalKind::None:
      check_cuda(cuda::cudart().cudaStreamSynchronize(stream),
                 "cudaStreamSynchronize before sending a CUDA tensor (no signal)");
      return signal;
    case SignalKind::Fence: {
      FenceWord& fence = *slot.fence;
      const MemoryOperations& operations = MemoryOperations::get();
      // A receiver waits for the latest value only. When the sender moved to another stream,
      // that stream first waits for the previous value, so the new value also covers the work
      // of the earlier frames' stream (and the word never goes back). The same holds for the
      // first signal on a word that an earlier connection gave back: its last value may still
      // be queued on that connection's stream (a consumer that died releases its holds at
      // once), and written after ours it would take the word back below what our receiver
      // waits for.
      if ((slot.signalled && stream != slot.last_stream) || (!slot.signalled && fence.value > 0)) {
        check_driver(operations.wait_value(stream, fence.address, fence.value, CU_STREAM_WAIT_VALUE_GEQ),
                     "cuStreamWaitValue64 chaining a send's fence");
      }
      check_driver(operations.write_value(stream, fence.address, fence.value + 1, 0),
                   "cuStreamWriteValue64 of a send's fence on cuda:" + std::to_string(device));
      ++fence.value;
      signal.handle = fence.handle;
      signal.fence_block_id = fence.block_id;
      signal.fence_offset = fence.index * kFenceBytes;
      signal.fence_value = fence.value;
      break;
    }
    case SignalKind::Event:
      // As for fences: a new stream first waits for the previous record.
      if (slot.signalled && stream != slot.last_stream) {
        check_cuda(cuda::cudart().cudaStreamWaitEvent(stream, slot.event, 0),
                   "cudaStreamWaitEvent chaining a send's IPC event");
      }
      check_cuda(cuda::cudart().cudaEventRecord(slot.event, stream),
                 "cudaEventRecord of a send's IPC event on cuda:" + std::to_string(device));
      signal.handle = slot.event_handle;
      break;
  }
  slot.signalled = true;
  slot.last_stream = stream;
  return signal;
}

// ---- receiver --------------------------------------------------------------------------

struct ReceiveSignals::Impl {
  // A fence buffer stays open (through the process's block cache) as long as the connection
  // and the storages received after waiting on it. Its words this connection waited on are
  // watched once (the watch writes the same value whatever the frame waited for).
  struct OpenFenceBuffer {
    std::shared_ptr<ReceivedCudaRange> range;
    std::vector<std::uint64_t> watched_offsets;
  };
  std::map<std::pair<int, IpcHandle>, OpenFenceBuffer> fence_buffers;
  std::map<std::pair<int, IpcHandle>, cudaEvent_t> events;

  ~Impl() {
    for (const auto& [key, event] : events) {
      try {
        DeviceGuard guard(key.first);
        ignore_cuda_error(cuda::cudart().cudaEventDestroy(event));
      } catch (...) {
        // The device is unusable (the process is exiting).
      }
    }
  }
};

ReceiveSignals::ReceiveSignals() : impl_(std::make_unique<Impl>()) {}
ReceiveSignals::~ReceiveSignals() = default;

std::shared_ptr<const void> ReceiveSignals::wait_fence(int device, const FenceExport& fence, pid_t producer) {
  const MemoryOperations& operations = MemoryOperations::get();
  DeviceGuard guard(device);
  std::pair<int, IpcHandle> key{device, fence.memory_handle};
  auto it = impl_->fence_buffers.find(key);
  if (it == impl_->fence_buffers.end()) {
    // Asked of the driver once per buffer, not per frame.
    if (!operations.supported_on(device)) {
      throw CudaError("the sender signals with a fence, but this process cannot wait for one on cuda:" +
                          std::to_string(device) + " (no 64-bit stream memory operations)",
                      cudaErrorNotSupported);
    }
    BlockExport exported;
    exported.memory_handle = fence.memory_handle;
    exported.pci_bus_id = fence.pci_bus_id;
    exported.block_id = fence.block_id;
    exported.block_bytes = kFenceBufferBytes;
    exported.offset = 0;
    it = impl_->fence_buffers
             .emplace(key, Impl::OpenFenceBuffer{open_received_range(exported, device, kFenceBufferBytes, producer,
                                                                     /*counted=*/false),
                                                 {}})
             .first;
  } else if (!it->second.range->is(producer, fence.block_id, 0, kFenceBufferBytes)) {
    throw CudaError("process " + std::to_string(producer) +
                        " sent a fence in a buffer this connection knows as another process's or block's",
                    cudaErrorInvalidValue);
  }
  Impl::OpenFenceBuffer& buffer = it->second;
  const auto address = reinterpret_cast<CUdeviceptr>(buffer.range->data() + fence.offset);
  check_driver(operations.wait_value(current_stream(device), address, fence.value, CU_STREAM_WAIT_VALUE_GEQ),
               "cuStreamWaitValue64 on a sender's fence (cuda:" + std::to_string(device) + ")");
  if (std::find(buffer.watched_offsets.begin(), buffer.watched_offsets.end(), fence.offset) ==
      buffer.watched_offsets.end()) {
    watch_fence(producer, buffer.range, fence.offset, device);  // should the producer die first
    buffer.watched_offsets.push_back(fence.offset);
  }
  return buffer.range;
}

void ReceiveSignals::wait_event(int device, const IpcHandle& handle) {
  DeviceGuard guard(device);
  std::pair<int, IpcHandle> key{device, handle};
  auto it = impl_->events.find(key);
  if (it == impl_->events.end()) {
    cudaIpcEventHandle_t ipc_handle{};
    std::memcpy(&ipc_handle, handle.data(), sizeof ipc_handle);
    cudaEvent_t event = nullptr;
    check_cuda(cuda::cudart().cudaIpcOpenEventHandle(&event, ipc_handle), "cudaIpcOpenEventHandle of a sender's event");
    g_events_opened.fetch_add(1, std::memory_order_relaxed);
    it = impl_->events.emplace(key, event).first;
  }
  check_cuda(cuda::cudart().cudaStreamWaitEvent(current_stream(device), it->second, 0),
             "cudaStreamWaitEvent on a sender's IPC event (cuda:" + std::to_string(device) + ")");
}

}  // namespace ferry::cuda
