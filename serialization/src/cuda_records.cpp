// The CUDA half of a connection's codec (cuda_records.hpp), built only with CUDA. The
// sending side turns a producer's CUDA storage into a CudaHandleRecord (see cuda_frame.hpp):
// the IPC handle of its whole block, its offset and size in it, the signal the sender's
// stream gives after its writes (a fence, or an interprocess event), and the counter of the
// connection's hold-counter board that the receiver releases. The receiving side opens the
// block (once per process), makes its stream wait for the signal, and builds a Storage that
// views the producer's memory.
//
// Every CUDA transport in ferry today (pipe, Unix socket) stays on one host. A transport
// that crosses hosts copies its storages (HandlePassing::Copying) and never reaches here:
// IPC handles mean nothing on another machine.
#include "ferry/detail/cuda_records.hpp"

#include <unistd.h>

#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_frame.hpp"
#include "ferry/cuda.hpp"
#include "ferry/detail/cuda/block_pool.hpp"
#include "ferry/detail/cuda/ipc.hpp"
#include "ferry/detail/return_board.hpp"

namespace ferry::detail {
namespace {

// ---- sending ---------------------------------------------------------------------------

class CudaIpcRecordWriter final : public CudaRecordWriter {
 public:
  // Boards of an isolated channel come from its pool, so that they travel without a copy.
  explicit CudaIpcRecordWriter(const std::optional<SharedAllocator>& pool)
      : boards_(signals_, cuda::kHoldCounterBoardCapacity, pool) {}

  void begin_frame() noexcept override {
    pending_.clear();
    records_.clear();
    counted_.clear();
    signalled_.clear();
  }

  std::shared_ptr<Storage> hold(const std::shared_ptr<Storage>& storage) override {
    const std::string device = storage->device().to_string();
    if (storage->received()) {
      throw Error("cannot send a " + device +
                  " tensor that this process received from another process: CUDA lets only the process that "
                  "allocated device memory share it. Send a copy instead: tensor.clone()");
    }
    auto allocation = std::dynamic_pointer_cast<cuda::CudaAllocation>(storage->shared_allocation());
    if (!allocation) {
      throw Error("cannot send a " + device +
                  " storage that ferry's CUDA allocator did not make; allocate it with Tensor::empty(shape, dtype, "
                  "Device::Cuda(i))");
    }
    auto [board, counter] = allocation->hold_for(boards_);
    std::shared_ptr<Storage> board_storage = board->storage();
    pending_.push_back(Pending{storage.get(), std::move(board), counter, 0});
    return board_storage;
  }

  void board_added(std::uint32_t index) noexcept override { pending_.back().board_index = index; }

  void write_record(const Storage& storage) override;

  std::span<const std::byte> records() const noexcept override {
    return std::as_bytes(std::span<const CudaHandleRecord>(records_));
  }

  void end_frame(bool sent) noexcept override {
    if (!sent) {
      for (const auto& [board, counter] : counted_) board->add(counter, -1);
    }
    counted_.clear();
  }

 private:
  // The signal that covers the sender's writes on `device`, given once per frame.
  const cuda::SendSignal& signal_for(int device) {
    for (const auto& [signalled_device, signal] : signalled_) {
      if (signalled_device == device) return signal;
    }
    signalled_.emplace_back(device, signals_->signal(device));
    return signalled_.back().second;
  }
  struct Pending {
    const Storage* storage;
    std::shared_ptr<cuda::HoldCounterBoard> board;
    std::uint32_t counter;
    std::uint32_t board_index;  // in the frame's handle table
  };
  const Pending& pending_of(const Storage& storage) const;

  // The signals outlive the connection as long as any of its boards does: receivers may still
  // wait on them for frames in flight, and those frames hold counters of the boards.
  std::shared_ptr<cuda::SendSignals> signals_ = std::make_shared<cuda::SendSignals>();
  cuda::HoldCounterBoardSet boards_;

  // The frame being encoded.
  std::vector<Pending> pending_;           // CUDA storages held for the frame
  std::vector<CudaHandleRecord> records_;  // one per CudaIpc entry, in table order
  std::vector<std::pair<std::shared_ptr<cuda::HoldCounterBoard>, std::uint32_t>> counted_;  // +1s of this frame
  std::vector<std::pair<int, cuda::SendSignal>> signalled_;                                 // by device
};

const CudaIpcRecordWriter::Pending& CudaIpcRecordWriter::pending_of(const Storage& storage) const {
  for (const Pending& candidate : pending_) {
    if (candidate.storage == &storage) return candidate;
  }
  throw Error("internal error: a CUDA storage of the frame was not held through hold()");
}

void CudaIpcRecordWriter::write_record(const Storage& storage) {
  const Pending& pending = pending_of(storage);
  const auto& allocation = static_cast<const cuda::CudaAllocation&>(*storage.allocation());
  const int device = storage.device().index;

  const cuda::BlockExport exported = cuda::export_allocation(allocation);
  CudaHandleRecord record{};
  std::memcpy(record.memory_handle, exported.memory_handle.data(), sizeof record.memory_handle);
  std::memcpy(record.pci_bus_id, exported.pci_bus_id.data(), sizeof record.pci_bus_id);
  record.block_id = exported.block_id;
  record.block_bytes = exported.block_bytes;
  record.offset = exported.offset;
  record.board_index = pending.board_index;
  record.counter = pending.counter;
  record.pid = static_cast<std::int32_t>(::getpid());
  record.device = device;
  const cuda::SendSignal& signal = signal_for(device);
  switch (signal.kind) {
    case cuda::SignalKind::Fence:
      std::memcpy(record.signal_handle, signal.handle.data(), sizeof record.signal_handle);
      record.fence_block_id = signal.fence_block_id;
      record.fence_offset = signal.fence_offset;
      record.fence_value = signal.fence_value;
      record.flags |= kCudaRecordHasFence;
      break;
    case cuda::SignalKind::Event:
      std::memcpy(record.signal_handle, signal.handle.data(), sizeof record.signal_handle);
      record.flags |= kCudaRecordHasEvent;
      break;
    case cuda::SignalKind::None: break;  // the sending stream was synchronized (the last fallback): nothing to wait for
  }
  records_.push_back(record);
  // This frame is one more hold until the receiver resolves it (taken back if not sent).
  pending.board->add(pending.counter, 1);
  counted_.emplace_back(pending.board, pending.counter);
}

// ---- receiving -------------------------------------------------------------------------

// Checks everything in `record` that needs no CUDA call; throws ProtocolError naming `handle`.
void check_cuda_record(const HandleEntry& entry, const CudaHandleRecord& record, const std::string& handle) {
  if (entry.slot >= ReturnBoard::kSlots) {
    throw ProtocolError(handle + " asks for slot " + std::to_string(entry.slot) + ", above the limit of " +
                        std::to_string(ReturnBoard::kSlots));
  }
  if (entry.nbytes == 0) throw ProtocolError(handle + " has no bytes");
  if (record.offset > record.block_bytes || entry.nbytes > record.block_bytes - record.offset) {
    throw ProtocolError(handle + " claims " + std::to_string(entry.nbytes) + " bytes at offset " +
                        std::to_string(record.offset) + " of a block of only " + std::to_string(record.block_bytes));
  }
  if (std::memchr(record.pci_bus_id, '\0', sizeof record.pci_bus_id) == nullptr) {
    throw ProtocolError(handle + " has a PCI bus id without an end");
  }
  constexpr std::uint32_t kSignals = kCudaRecordHasEvent | kCudaRecordHasFence;
  if ((record.flags & ~kSignals) != 0 || (record.flags & kSignals) == kSignals) {
    throw ProtocolError(handle + " has CUDA record flags " + std::to_string(record.flags) +
                        ": expected at most one of event (1) and fence (2)");
  }
  if (record.reserved != 0) {
    throw ProtocolError(handle + " has " + std::to_string(record.reserved) +
                        " in the reserved field of its CUDA record (must be zero)");
  }
  if ((record.flags & kCudaRecordHasFence) != 0 &&
      (record.fence_offset % sizeof(std::uint64_t) != 0 ||
       record.fence_offset > cuda::kFenceBufferBytes - sizeof(std::uint64_t))) {
    throw ProtocolError(handle + " puts its fence at byte " + std::to_string(record.fence_offset) +
                        " of a fence buffer of " + std::to_string(cuda::kFenceBufferBytes) +
                        " bytes (must be a multiple of 8 inside it)");
  }
  if (record.pid <= 0) throw ProtocolError(handle + " names an invalid process " + std::to_string(record.pid));
  if (record.pid == ::getpid()) {
    throw ProtocolError(handle + " was sent by this very process: CUDA IPC only works between two processes");
  }
}

// The hold-counter board the record names: an earlier storage of the frame, checked.
cuda::HoldCounterView hold_counter_board_of(const CudaHandleRecord& record,
                                            std::span<const std::shared_ptr<Storage>> earlier,
                                            const std::string& handle) {
  if (record.board_index >= earlier.size()) {
    throw ProtocolError(handle + " refers to hold-counter board " + std::to_string(record.board_index) +
                        ", which is not an earlier handle of the frame");
  }
  cuda::HoldCounterView board(earlier[record.board_index]->shared_allocation());
  if (record.counter >= board.capacity()) {
    throw ProtocolError(handle + " uses counter " + std::to_string(record.counter) + " of a hold-counter board of " +
                        std::to_string(board.capacity()));
  }
  return board;
}

cuda::BlockExport block_export_of(const CudaHandleRecord& record) {
  cuda::BlockExport exported;
  std::memcpy(exported.memory_handle.data(), record.memory_handle, sizeof record.memory_handle);
  std::memcpy(exported.pci_bus_id.data(), record.pci_bus_id, sizeof record.pci_bus_id);
  exported.block_id = record.block_id;
  exported.block_bytes = record.block_bytes;
  exported.offset = record.offset;
  return exported;
}

class CudaIpcRecordReader final : public CudaRecordReader {
 public:
  std::shared_ptr<Storage> resolve(const HandleEntry& entry, std::uint32_t index, std::size_t record_number,
                                   std::span<const std::byte> records,
                                   std::span<const std::shared_ptr<Storage>> earlier, Lease lease) override;

 private:
  // The `record_number`-th record of `records`, after checking that they hold it.
  CudaHandleRecord read_record(std::span<const std::byte> records, std::uint32_t index, std::size_t record_number);
  // The storage, opened or found in `lease`.
  std::shared_ptr<Storage> open(const HandleEntry& entry, const CudaHandleRecord& record,
                                const cuda::HoldCounterView& board, Lease lease,
                                std::shared_ptr<cuda::ReceivedCudaRange> range);
  // Makes this thread's current stream wait for the record's signal, once per frame, and
  // returns what a storage of the frame keeps while it lives (see hold_received_range).
  std::shared_ptr<const void> wait(int device, const CudaHandleRecord& record);

  using SignalKey = std::tuple<int, cuda::IpcHandle, std::uint64_t, std::uint64_t>;
  cuda::ReceiveSignals signals_;
  // What the frame being resolved already waited for: (device, handle, fence offset, value),
  // and the fence buffer that the frame's new storages keep (null for an event).
  std::vector<std::pair<SignalKey, std::shared_ptr<const void>>> waited_;
};

std::shared_ptr<const void> CudaIpcRecordReader::wait(int device, const CudaHandleRecord& record) {
  cuda::IpcHandle handle;
  std::memcpy(handle.data(), record.signal_handle, sizeof record.signal_handle);
  const bool fence = (record.flags & kCudaRecordHasFence) != 0;
  SignalKey key{device, handle, fence ? record.fence_offset : 0, fence ? record.fence_value : 0};
  for (const auto& [done, keep] : waited_) {
    if (done == key) return keep;
  }
  std::shared_ptr<const void> keep;
  if (fence) {
    cuda::FenceExport export_;
    export_.memory_handle = handle;
    std::memcpy(export_.pci_bus_id.data(), record.pci_bus_id, sizeof record.pci_bus_id);
    export_.block_id = record.fence_block_id;
    export_.offset = record.fence_offset;
    export_.value = record.fence_value;
    keep = signals_.wait_fence(device, export_, record.pid);
  } else {
    signals_.wait_event(device, handle);
  }
  waited_.emplace_back(key, keep);
  return keep;
}

CudaHandleRecord CudaIpcRecordReader::read_record(std::span<const std::byte> records, std::uint32_t index,
                                                  std::size_t record_number) {
  if (records.size() / sizeof(CudaHandleRecord) <= record_number) {
    throw ProtocolError("frame body is too short for the CUDA record of handle " + std::to_string(index));
  }
  CudaHandleRecord record;
  std::memcpy(&record, records.data() + record_number * sizeof record, sizeof record);
  if (record_number == 0) waited_.clear();  // a new frame
  return record;
}

std::shared_ptr<Storage> CudaIpcRecordReader::resolve(const HandleEntry& entry, std::uint32_t index,
                                                      std::size_t record_number, std::span<const std::byte> records,
                                                      std::span<const std::shared_ptr<Storage>> earlier, Lease lease) {
  const CudaHandleRecord record = read_record(records, index, record_number);
  const std::string handle = "CUDA handle " + std::to_string(index);
  check_cuda_record(entry, record, handle);  // everything that needs no CUDA call first
  const cuda::HoldCounterView board = hold_counter_board_of(record, earlier, handle);
  // This frame gave this process one hold on the counter: from here on, a failure gives it
  // back, so that a broken frame cannot pin the producer's memory.
  std::shared_ptr<cuda::ReceivedCudaRange> range;
  if (lease.held) {
    range = std::dynamic_pointer_cast<cuda::ReceivedCudaRange>(lease.range);
    if (!range || !range->is(record.pid, record.block_id, record.offset, entry.nbytes)) {
      board.release(record.counter);
      throw ProtocolError(handle + " reuses slot " + std::to_string(entry.slot) +
                          " for another storage before releasing it");
    }
  }
  try {
    return open(entry, record, board, lease, std::move(range));
  } catch (const CudaError& error) {
    board.release(record.counter);
    throw ProtocolError("cannot map the CUDA storage of " + handle + " from process " + std::to_string(record.pid) +
                        ": " + error.what());
  }
}

std::shared_ptr<Storage> CudaIpcRecordReader::open(const HandleEntry& entry, const CudaHandleRecord& record,
                                                   const cuda::HoldCounterView& board, Lease lease,
                                                   std::shared_ptr<cuda::ReceivedCudaRange> range) {
  const cuda::BlockExport exported = block_export_of(record);
  const int device = cuda::local_device(exported.pci_bus_id);
  if (!range) range = cuda::open_received_range(exported, device, entry.nbytes, record.pid);
  std::shared_ptr<const void> signal;
  if (record.flags & (kCudaRecordHasEvent | kCudaRecordHasFence)) signal = wait(device, record);
  if (lease.held) {
    if (auto storage = lease.handle.lock()) {
      board.release(record.counter);  // already held by that Storage
      return storage;
    }
  } else {
    lease.range = range;  // no core: owning the CUDA storage would hold the producer's memory
  }
  // A new Storage, which keeps this frame's hold until it dies.
  auto storage = Storage::adopt(cuda::hold_received_range(range, board, record.counter, std::move(signal)), true);
  lease.handle = storage;
  return storage;
}

}  // namespace

std::unique_ptr<CudaRecordWriter> CudaRecordWriter::make(const std::optional<SharedAllocator>& pool) {
  return std::make_unique<CudaIpcRecordWriter>(pool);
}

std::unique_ptr<CudaRecordReader> CudaRecordReader::make() { return std::make_unique<CudaIpcRecordReader>(); }

}  // namespace ferry::detail
