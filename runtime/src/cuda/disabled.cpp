// The CUDA entry points of a build without CUDA: nothing is available, and whatever needs a
// device says so.
#include <string>

#include "cuda/memory.hpp"
#include "ferry/cuda.hpp"
#include "ferry/detail/cuda/ipc.hpp"

namespace ferry {
namespace {

constexpr const char* kNotBuilt =
    "ferry was built without CUDA support (no CUDA toolkit was found, or FERRY_WITH_CUDA=OFF)";

[[noreturn]] void throw_not_built(const std::string& what) {
  throw Error(what + ": " + kNotBuilt + "; rebuild ferry with the CUDA toolkit installed, or use CPU tensors");
}

}  // namespace

bool cuda_built() noexcept { return false; }
int cuda_device_count() { return 0; }
bool cuda_available() { return false; }
std::string cuda_unavailable_reason() { return kNotBuilt; }
std::size_t cuda_collect() { return 0; }
std::size_t cuda_empty_cache() { return 0; }
CudaMemoryStats cuda_memory_stats(int /*device*/) { return CudaMemoryStats{}; }
CudaIpcStats cuda_ipc_stats() { return CudaIpcStats{}; }

namespace cuda {

std::shared_ptr<Allocation> allocate(std::size_t /*bytes*/, Device device) {
  throw_not_built("cannot allocate a " + device.to_string() + " tensor");
}
void zero(Storage& /*storage*/) { throw_not_built("cannot zero a CUDA tensor"); }
void copy(const Tensor& /*destination*/, const Tensor& /*source*/) { throw_not_built("cannot copy a CUDA tensor"); }

BlockExport export_allocation(const CudaAllocation& /*allocation*/) { throw_not_built("cannot send a CUDA tensor"); }
int local_device(const PciBusId& /*bus_id*/) { throw_not_built("cannot receive a CUDA tensor"); }
std::shared_ptr<ReceivedCudaRange> open_received_range(const BlockExport& /*exported*/, int /*device*/,
                                                       std::size_t /*bytes*/, pid_t /*producer*/, bool /*counted*/) {
  throw_not_built("cannot receive a CUDA tensor");
}
std::shared_ptr<Allocation> hold_received_range(std::shared_ptr<ReceivedCudaRange> /*range*/, HoldCounterView /*board*/,
                                                std::uint32_t /*counter*/, std::shared_ptr<const void> /*signal*/) {
  throw_not_built("cannot receive a CUDA tensor");
}
std::uint64_t ipc_events_opened() noexcept { return 0; }
std::uint64_t fence_buffers_opened() noexcept { return 0; }

struct SendSignals::Impl {};
SendSignals::SendSignals() = default;
SendSignals::~SendSignals() = default;
SendSignal SendSignals::signal(int /*device*/) { throw_not_built("cannot send a CUDA tensor"); }

struct ReceiveSignals::Impl {};
ReceiveSignals::ReceiveSignals() = default;
ReceiveSignals::~ReceiveSignals() = default;
std::shared_ptr<const void> ReceiveSignals::wait_fence(int /*device*/, const FenceExport& /*fence*/,
                                                       pid_t /*producer*/) {
  throw_not_built("cannot receive a CUDA tensor");
}
void ReceiveSignals::wait_event(int /*device*/, const IpcHandle& /*handle*/) {
  throw_not_built("cannot receive a CUDA tensor");
}

}  // namespace cuda
}  // namespace ferry
