// CUDA IPC between processes: exporting the block behind a producer's storage, opening it
// in a receiver (once per process and device, whatever the number of storages in it), and
// the signals (fences, or interprocess events) that order a receiver's work after the
// sender's writes. No CUDA types here: the codec's CUDA half
// (serialization/src/cuda_records.cpp, built only with CUDA) includes it without the
// toolkit's headers; in a build without CUDA these functions throw Error.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "ferry/detail/cuda/hold_counter_board.hpp"
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
  IpcHandle memory_handle{};      ///< of the whole cudaMalloc block
  PciBusId pci_bus_id{};          ///< the GPU
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
/// `counted`: whether the block counts in cuda_ipc_stats()'s blocks (fence buffers do not).
/// Checks that the block really is as large as the producer says. Throws CudaError.
std::shared_ptr<ReceivedCudaRange> open_received_range(const BlockExport& exported, int device, std::size_t bytes,
                                                       pid_t producer, bool counted = true);

/// The allocation behind a received Storage: `range`, plus one hold on `counter` of `board`
/// that it releases when it dies, after waiting for the current stream of its device (so
/// that work queued on the memory is done before the producer may reuse it). `signal` (what
/// ReceiveSignals::wait_fence returned, or null) is kept as long as the allocation.
std::shared_ptr<Allocation> hold_received_range(std::shared_ptr<ReceivedCudaRange> range, HoldCounterView board,
                                                std::uint32_t counter, std::shared_ptr<const void> signal = {});

/// Bytes of a process's fence buffer on one device: 4096 fences of 8 bytes.
inline constexpr std::uint64_t kFenceBufferBytes = 32768;

/// How a receiver's stream is made to wait for what a sender queued before a frame.
enum class SignalKind : std::uint8_t {
  None,   ///< nothing to wait for: the sender synchronized its stream (the last fallback)
  Fence,  ///< a 64-bit word of the sender's fence buffer reaches `fence_value`
  Event,  ///< an interprocess CUDA event (the fallback without stream memory operations)
};

/// What a sender hands a receiver for one device and frame.
struct SendSignal {
  SignalKind kind = SignalKind::None;
  IpcHandle handle{};                ///< Fence: the fence buffer's cudaIpcMemHandle_t; Event: cudaIpcEventHandle_t
  std::uint64_t fence_block_id = 0;  ///< Fence: the producer's block id of its fence buffer
  std::uint64_t fence_offset = 0;    ///< Fence: the byte offset of the word in the buffer
  std::uint64_t fence_value = 0;     ///< Fence: the value the word reaches after the sender's work
};

/// A fence as a receiver gets it: which buffer (on the GPU `pci_bus_id` of process
/// `producer`), which word, and the value to wait for.
struct FenceExport {
  IpcHandle memory_handle{};
  PciBusId pci_bus_id{};
  std::uint64_t block_id = 0;
  std::uint64_t offset = 0;
  std::uint64_t value = 0;
};

/// The signals of one sending connection, per device. By default a fence: the connection
/// owns one 64-bit word of its process's fence buffer (a small cudaMalloc exported once) and
/// each frame writes the next value into it on the sending stream (cuStreamWriteValue64,
/// ordered after everything queued there); the receiver's stream waits until the word
/// reaches that value (cuStreamWaitValue64). Without stream memory operations it falls back
/// to an interprocess event, and when no event can be made either, to synchronizing the
/// sending stream. FERRY_CUDA_SEND_SIGNAL=fence|event|synchronize chooses where to start.
class SendSignals {
 public:
  SendSignals();
  ~SendSignals();
  SendSignals(const SendSignals&) = delete;
  SendSignals& operator=(const SendSignals&) = delete;

  /// Signals, on the calling thread's current stream of `device`, that everything queued
  /// there so far is done, and returns what the receiver waits for (kind None when the
  /// stream was synchronized instead). Throws CudaError.
  SendSignal signal(int device);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// What a receiving connection opened to wait for its senders' signals: fence buffers
/// (through the process's block cache, so each is opened once per process) and events
/// (cudaIpcOpenEventHandle, once per handle).
class ReceiveSignals {
 public:
  ReceiveSignals();
  ~ReceiveSignals();
  ReceiveSignals(const ReceiveSignals&) = delete;
  ReceiveSignals& operator=(const ReceiveSignals&) = delete;

  /// Makes the calling thread's current stream on the local `device` wait until the fence
  /// reaches its value (no host synchronization). The caller checked that the fence's offset
  /// is a multiple of 8 inside kFenceBufferBytes (the decoder does, before any CUDA call). Returns the fence buffer's
  /// mapping, which must outlive the wait: the storages of the frame keep it (see hold_received_range), since they may
  /// outlive the connection while the stream still waits. Throws CudaError.
  std::shared_ptr<const void> wait_fence(int device, const FenceExport& fence, pid_t producer);
  /// Makes the calling thread's current stream on the local `device` wait for the sender's
  /// interprocess event `handle` (no host synchronization). Throws CudaError.
  void wait_event(int device, const IpcHandle& handle);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// cudaIpcOpenEventHandle calls of this process so far (for cuda_ipc_stats()).
std::uint64_t ipc_events_opened() noexcept;
/// Fence buffers of other processes this process opened so far (for cuda_ipc_stats()).
std::uint64_t fence_buffers_opened() noexcept;

}  // namespace ferry::cuda
