// CUDA IPC between processes: exporting the block behind a producer's storage, opening it
// in a receiver (once per process and device, whatever the number of storages in it), and
// the interprocess events that order a receiver's work after the sender's writes. No CUDA
// types here, so that the wire format code (serialization/src/cuda_handles.cpp) compiles in
// every build; without CUDA these functions throw Error.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "ferry/cuda/release_board.hpp"
#include "ferry/storage.hpp"

namespace ferry::cuda {

class CudaAllocation;

/// The bytes of a cudaIpcMemHandle_t or cudaIpcEventHandle_t.
using IpcHandle = std::array<std::byte, 64>;
/// A GPU's PCI bus id as cudaDeviceGetPCIBusId writes it ("0000:3b:00.0"), NUL-terminated:
/// processes may number the same GPU differently (CUDA_VISIBLE_DEVICES), its bus id is the same.
using PciBusId = std::array<char, 16>;

/// What a receiver needs to map a producer's storage.
struct BlockExport {
  IpcHandle memory_handle{};  ///< of the whole cudaMalloc block
  PciBusId pci_bus_id{};      ///< the GPU
  std::uint64_t block_id = 0;     ///< the producer's name for the block (never reused in that process)
  std::uint64_t block_bytes = 0;  ///< size of the block
  std::uint64_t offset = 0;       ///< of the storage in the block
};

/// Exports the block behind a storage of ferry's CUDA allocator (cudaIpcGetMemHandle, once
/// per block). Throws CudaError.
BlockExport export_allocation(const CudaAllocation& allocation);

/// The ordinal, in this process, of the GPU with `bus_id`; throws CudaError when this
/// process does not see it.
int local_device(const PciBusId& bus_id);

/// A receiver's view of a producer's storage: `size()` bytes at an offset of a block opened
/// with cudaIpcOpenMemHandle. Keeps the block open; the block is closed when the last range
/// in it dies. The range itself holds nothing in the producer (see hold_received_range).
class ReceivedCudaRange final : public Allocation {
 public:
  ReceivedCudaRange(std::shared_ptr<const void> block, std::byte* data, std::size_t bytes, int device, pid_t producer,
                    std::uint64_t block_id, std::uint64_t offset) noexcept
      : block_(std::move(block)),
        data_(data),
        bytes_(bytes),
        device_(device),
        producer_(producer),
        block_id_(block_id),
        offset_(offset) {}
  std::byte* data() const noexcept override { return data_; }
  std::size_t size() const noexcept override { return bytes_; }
  Device device() const noexcept override { return Device::Cuda(device_); }
  /// True when this is the range that `producer` calls (block_id, offset, bytes).
  bool is(pid_t producer, std::uint64_t block_id, std::uint64_t offset, std::size_t bytes) const noexcept {
    return producer == producer_ && block_id == block_id_ && offset == offset_ && bytes == bytes_;
  }

 private:
  std::shared_ptr<const void> block_;
  std::byte* data_;
  std::size_t bytes_;
  int device_;
  pid_t producer_;
  std::uint64_t block_id_;
  std::uint64_t offset_;
};

/// Opens the block of `exported` on the local device `device` (or finds it open: a process
/// opens each block once, as CUDA requires) and returns the range of `bytes` at its offset.
/// Checks that the block really is as large as the producer says. Throws CudaError.
std::shared_ptr<ReceivedCudaRange> open_received_range(const BlockExport& exported, int device, std::size_t bytes,
                                                       pid_t producer);

/// The allocation behind a received Storage: `range`, plus one hold on `counter` of `board`
/// that it releases when it dies, after synchronizing the current stream of its device (so
/// that work queued on the memory is done before the producer may reuse it).
std::shared_ptr<Allocation> hold_received_range(std::shared_ptr<ReceivedCudaRange> range, ReleaseBoardView board,
                                                std::uint32_t counter);

/// The interprocess events of one sending connection, one per device (created with
/// cudaEventInterprocess | cudaEventDisableTiming on first use).
class SendEvents {
 public:
  SendEvents();
  ~SendEvents();
  SendEvents(const SendEvents&) = delete;
  SendEvents& operator=(const SendEvents&) = delete;

  /// Records the device's event on the calling thread's current stream, after everything
  /// queued there so far, and returns its IPC handle for the receiver to wait on. Returns
  /// std::nullopt when it synchronized the stream instead: the fallback when no event can
  /// be created (or FERRY_CUDA_SYNC_SENDS=1 is set in the environment). Throws CudaError.
  std::optional<IpcHandle> record(int device);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The events a receiving connection opened (cudaIpcOpenEventHandle, once per handle).
class ReceiveEvents {
 public:
  ReceiveEvents();
  ~ReceiveEvents();
  ReceiveEvents(const ReceiveEvents&) = delete;
  ReceiveEvents& operator=(const ReceiveEvents&) = delete;

  /// Makes the calling thread's current stream on the local `device` wait for the sender's
  /// event `handle` (no host synchronization). Throws CudaError.
  void wait(int device, const IpcHandle& handle);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// cudaIpcOpenEventHandle calls of this process so far (for cuda_ipc_stats()).
std::uint64_t ipc_events_opened() noexcept;

}  // namespace ferry::cuda
