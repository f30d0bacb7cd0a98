// CUDA storages on the wire (see cuda_frame.hpp). The sending side turns a producer's CUDA
// storage into a CudaIpc handle entry plus a CudaHandleRecord: the IPC handle of its whole
// block, its offset and size in it, the signal the sender's stream gives after its writes (a
// fence, or an interprocess event), and the counter of the connection's hold-counter board that
// the receiver releases. The receiving side opens the block (once per process), makes its
// stream wait for the signal, and builds a Storage that views the producer's memory.
//
// Every CUDA transport in ferry today (pipe, Unix socket) stays on one host. A transport
// that crosses hosts must refuse CUDA storages in add_cuda_storage(): IPC handles mean
// nothing on another machine.
#include <unistd.h>

#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <tuple>

#include "ferry/cuda.hpp"
#include "ferry/detail/cuda/block_pool.hpp"
#include "ferry/detail/cuda/ipc.hpp"
#include "cuda_frame.hpp"
#include "ferry/detail/message_decoder.hpp"
#include "ferry/detail/message_encoder.hpp"

namespace ferry {

// ---- sending ---------------------------------------------------------------------------

struct detail::MessageEncoder::CudaSendState {
  // Boards of an isolated channel come from its pool, so that they travel without a copy.
  explicit CudaSendState(const std::optional<SharedAllocator>& pool)
      : boards(signals, cuda::kHoldCounterBoardCapacity, pool) {}

  // The signals outlive the connection as long as any of its boards does: receivers may still
  // wait on them for frames in flight, and those frames hold counters of the boards.
  std::shared_ptr<cuda::SendSignals> signals = std::make_shared<cuda::SendSignals>();
  cuda::HoldCounterBoardSet boards;

  // The frame being encoded.
  struct Pending {
    const Storage* storage;
    std::shared_ptr<cuda::HoldCounterBoard> board;
    std::uint32_t counter;
    std::uint32_t board_index;  // in the frame's handle table
  };
  std::vector<Pending> pending;                 // CUDA storages added to the frame
  std::vector<detail::CudaHandleRecord> records;        // one per CudaIpc entry, in table order
  std::vector<std::pair<std::shared_ptr<cuda::HoldCounterBoard>, std::uint32_t>> counted;  // +1s of this frame
  std::vector<std::pair<int, cuda::SendSignal>> signalled;  // by device

  // The signal that covers the sender's writes on `device`, given once per frame.
  const cuda::SendSignal& signal_for(int device) {
    for (const auto& [signalled_device, signal] : signalled) {
      if (signalled_device == device) return signal;
    }
    signalled.emplace_back(device, signals->signal(device));
    return signalled.back().second;
  }
};

std::uint32_t detail::MessageEncoder::add_cuda_storage(const std::shared_ptr<Storage>& storage) {
  const std::string device = storage->device().to_string();
  if (!cuda_built()) {
    throw Error("cannot send a " + device + " tensor: this build of ferry has no CUDA support");
  }
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
  if (!cuda_) cuda_ = std::make_shared<CudaSendState>(pool_);
  auto [board, counter] = allocation->hold_for(cuda_->boards);
  // The board travels as an ordinary shared storage (a block of a leased segment), ahead of
  // the storages that use it.
  const std::uint32_t board_index = add_storage(board->storage());
  cuda_->pending.push_back(CudaSendState::Pending{storage.get(), std::move(board), counter, board_index});
  return append_storage(storage, storage.get());
}

detail::HandleEntry detail::MessageEncoder::cuda_entry(const std::shared_ptr<Storage>& storage) {
  const CudaSendState::Pending* pending = nullptr;
  for (const auto& candidate : cuda_->pending) {
    if (candidate.storage == storage.get()) pending = &candidate;
  }
  if (pending == nullptr) throw Error("internal error: a CUDA storage of the frame was not added through add_storage");
  const auto& allocation = static_cast<const cuda::CudaAllocation&>(*storage->allocation());
  const int device = storage->device().index;

  const cuda::BlockExport exported = cuda::export_allocation(allocation);
  detail::CudaHandleRecord record{};
  std::memcpy(record.memory_handle, exported.memory_handle.data(), sizeof record.memory_handle);
  std::memcpy(record.pci_bus_id, exported.pci_bus_id.data(), sizeof record.pci_bus_id);
  record.block_id = exported.block_id;
  record.block_bytes = exported.block_bytes;
  record.offset = exported.offset;
  record.board_index = pending->board_index;
  record.counter = pending->counter;
  record.pid = static_cast<std::int32_t>(::getpid());
  record.device = device;
  const cuda::SendSignal& signal = cuda_->signal_for(device);
  switch (signal.kind) {
    case cuda::SignalKind::Fence:
      std::memcpy(record.signal_handle, signal.handle.data(), sizeof record.signal_handle);
      record.fence_block_id = signal.fence_block_id;
      record.fence_offset = signal.fence_offset;
      record.fence_value = signal.fence_value;
      record.flags |= detail::kCudaRecordHasFence;
      break;
    case cuda::SignalKind::Event:
      std::memcpy(record.signal_handle, signal.handle.data(), sizeof record.signal_handle);
      record.flags |= detail::kCudaRecordHasEvent;
      break;
    case cuda::SignalKind::None:
      break;  // the sending stream was synchronized (the last fallback): nothing to wait for
  }
  cuda_->records.push_back(record);
  // This frame is one more hold until the receiver resolves it (taken back if not sent).
  pending->board->add(pending->counter, 1);
  cuda_->counted.emplace_back(pending->board, pending->counter);

  detail::HandleEntry entry;
  entry.kind = static_cast<std::uint32_t>(detail::HandleKind::CudaIpc);
  entry.nbytes = storage->nbytes();
  if (const auto slot = leased_ids_.find(storage->id())) {
    entry.slot = *slot;
  } else {
    // A slot like any storage's, but never pinned and never given back on the return board:
    // the hold-counter board's counter is the hold (see MessageEncoder::commit).
    entry.slot = lease_storage(storage, false);
  }
  return entry;
}

std::span<const std::byte> detail::MessageEncoder::cuda_section() const noexcept {
  if (!cuda_ || cuda_->records.empty()) return {};
  return std::as_bytes(std::span<const detail::CudaHandleRecord>(cuda_->records));
}

void detail::MessageEncoder::cuda_begin_frame() noexcept {
  if (!cuda_) return;
  cuda_->pending.clear();
  cuda_->records.clear();
  cuda_->counted.clear();
  cuda_->signalled.clear();
}

void detail::MessageEncoder::cuda_end_frame(bool sent) noexcept {
  if (!cuda_) return;
  if (!sent) {
    for (const auto& [board, counter] : cuda_->counted) board->add(counter, -1);
  }
  cuda_->counted.clear();
}

// ---- receiving -------------------------------------------------------------------------

struct detail::MessageDecoder::CudaReceiveState {
  using SignalKey = std::tuple<int, cuda::IpcHandle, std::uint64_t, std::uint64_t>;
  cuda::ReceiveSignals signals;
  // What the frame being resolved already waited for: (device, handle, fence offset, value),
  // and the fence buffer that the frame's new storages keep (null for an event).
  std::vector<std::pair<SignalKey, std::shared_ptr<const void>>> waited;

  // Makes this thread's current stream wait for the record's signal, once per frame, and
  // returns what a storage of the frame keeps while it lives (see hold_received_range).
  std::shared_ptr<const void> wait(int device, const detail::CudaHandleRecord& record) {
    cuda::IpcHandle handle;
    std::memcpy(handle.data(), record.signal_handle, sizeof record.signal_handle);
    const bool fence = (record.flags & detail::kCudaRecordHasFence) != 0;
    SignalKey key{device, handle, fence ? record.fence_offset : 0, fence ? record.fence_value : 0};
    for (const auto& [done, keep] : waited) {
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
      keep = signals.wait_fence(device, export_, record.pid);
    } else {
      signals.wait_event(device, handle);
    }
    waited.emplace_back(key, keep);
    return keep;
  }
};

namespace {

// Checks everything in `record` that needs no CUDA call; throws ProtocolError naming `handle`.
void check_cuda_record(const detail::HandleEntry& entry, const detail::CudaHandleRecord& record, const std::string& handle) {
  if (entry.slot >= detail::MessageDecoder::kMaxSlots) {
    throw ProtocolError(handle + " asks for slot " + std::to_string(entry.slot) + ", above the limit of " +
                        std::to_string(detail::MessageDecoder::kMaxSlots));
  }
  if (entry.nbytes == 0) throw ProtocolError(handle + " has no bytes");
  if (record.offset > record.block_bytes || entry.nbytes > record.block_bytes - record.offset) {
    throw ProtocolError(handle + " claims " + std::to_string(entry.nbytes) + " bytes at offset " +
                        std::to_string(record.offset) + " of a block of only " + std::to_string(record.block_bytes));
  }
  if (std::memchr(record.pci_bus_id, '\0', sizeof record.pci_bus_id) == nullptr) {
    throw ProtocolError(handle + " has a PCI bus id without an end");
  }
  if ((record.flags & ~(detail::kCudaRecordHasEvent | detail::kCudaRecordHasFence)) != 0 ||
      (record.flags & (detail::kCudaRecordHasEvent | detail::kCudaRecordHasFence)) == (detail::kCudaRecordHasEvent | detail::kCudaRecordHasFence)) {
    throw ProtocolError(handle + " has CUDA record flags " + std::to_string(record.flags) +
                        ": expected at most one of event (1) and fence (2)");
  }
  if (record.reserved != 0) {
    throw ProtocolError(handle + " has " + std::to_string(record.reserved) +
                        " in the reserved field of its CUDA record (must be zero)");
  }
  if ((record.flags & detail::kCudaRecordHasFence) != 0 &&
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
cuda::HoldCounterView hold_counter_board_of(const detail::CudaHandleRecord& record,
                                        std::span<const std::shared_ptr<Storage>> earlier, const std::string& handle) {
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

cuda::BlockExport block_export_of(const detail::CudaHandleRecord& record) {
  cuda::BlockExport exported;
  std::memcpy(exported.memory_handle.data(), record.memory_handle, sizeof record.memory_handle);
  std::memcpy(exported.pci_bus_id.data(), record.pci_bus_id, sizeof record.pci_bus_id);
  exported.block_id = record.block_id;
  exported.block_bytes = record.block_bytes;
  exported.offset = record.offset;
  return exported;
}

}  // namespace

detail::CudaHandleRecord detail::MessageDecoder::read_cuda_record(std::uint32_t index, std::size_t record_number) {
  if (!cuda_built()) {
    throw ProtocolError("the sender shares a CUDA tensor (CUDA handle " + std::to_string(index) +
                        ") but this build of ferry has no CUDA support; build the receiver with the CUDA toolkit "
                        "(FERRY_WITH_CUDA) or send CPU tensors");
  }
  if (body_.size() / sizeof(detail::CudaHandleRecord) <= record_number) {
    throw ProtocolError("frame body is too short for the CUDA record of handle " + std::to_string(index));
  }
  detail::CudaHandleRecord record;
  std::memcpy(&record, body_.data() + record_number * sizeof record, sizeof record);
  if (!cuda_) cuda_ = std::make_shared<CudaReceiveState>();
  if (record_number == 0) cuda_->waited.clear();  // a new frame
  return record;
}

std::shared_ptr<Storage> detail::MessageDecoder::resolve_cuda(const detail::HandleEntry& entry, std::uint32_t index,
                                                      std::size_t record_number) {
  const detail::CudaHandleRecord record = read_cuda_record(index, record_number);
  const std::string handle = "CUDA handle " + std::to_string(index);
  check_cuda_record(entry, record, handle);  // everything that needs no CUDA call first
  const cuda::HoldCounterView board = hold_counter_board_of(record, storages_, handle);
  // This frame gave this process one hold on the counter: from here on, a failure gives it
  // back, so that a broken frame cannot pin the producer's memory.
  Lease* lease = leases_.find(entry.slot);
  std::shared_ptr<cuda::ReceivedCudaRange> range;
  if (lease != nullptr) {
    range = std::dynamic_pointer_cast<cuda::ReceivedCudaRange>(lease->allocation);
    if (!range || !range->is(record.pid, record.block_id, record.offset, entry.nbytes)) {
      board.release(record.counter);
      throw ProtocolError(handle + " reuses slot " + std::to_string(entry.slot) +
                          " for another storage before releasing it");
    }
  }
  try {
    return open_cuda_storage(entry, record, board, lease, std::move(range));
  } catch (const CudaError& error) {
    board.release(record.counter);
    throw ProtocolError("cannot map the CUDA storage of " + handle + " from process " + std::to_string(record.pid) +
                        ": " + error.what());
  }
}

std::shared_ptr<Storage> detail::MessageDecoder::open_cuda_storage(const detail::HandleEntry& entry, const detail::CudaHandleRecord& record,
                                                           const cuda::HoldCounterView& board, Lease* lease,
                                                           std::shared_ptr<cuda::ReceivedCudaRange> range) {
  const cuda::BlockExport exported = block_export_of(record);
  const int device = cuda::local_device(exported.pci_bus_id);
  if (!range) range = cuda::open_received_range(exported, device, entry.nbytes, record.pid);
  std::shared_ptr<const void> signal;
  if (record.flags & (detail::kCudaRecordHasEvent | detail::kCudaRecordHasFence)) signal = cuda_->wait(device, record);
  if (lease != nullptr) {
    if (auto storage = lease->handle.lock()) {
      board.release(record.counter);  // already held by that Storage
      return storage;
    }
  }
  // A new Storage, which keeps this frame's hold until it dies.
  auto storage = Storage::adopt(cuda::hold_received_range(range, board, record.counter, std::move(signal)), true);
  if (lease != nullptr) {
    lease->handle = storage;
  } else {
    // No core: owning the CUDA storage would hold the producer's memory (see Lease).
    leases_.place(entry.slot, Lease{range, nullptr, storage});
  }
  return storage;
}

}  // namespace ferry
