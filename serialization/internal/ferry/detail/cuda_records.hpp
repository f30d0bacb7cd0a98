// The CUDA half of one connection's codec, a strategy of its own: what the encoder and the
// decoder do for a CUDA storage (a HandleKind::CudaIpc entry plus a CudaHandleRecord at the
// front of the body, see cuda_frame.hpp), behind a narrow interface that the codec calls
// only for CUDA storages.
//
// Contract. The encoder and decoder of a connection each hold at most one of these, made
// when the connection meets its first CUDA storage. A build without CUDA has none: the
// factories return null and the codec refuses CUDA storages with a clear error, so that no
// CUDA record code is built into it. The slot a CUDA storage takes stays the codec's (the
// connection's storage slot table); the records, the hold-counter boards and the signals
// (fences, events) are the strategy's. Not thread-safe: one per end of one connection.
// The protocol: docs/design/cuda.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "ferry/allocation.hpp"
#include "ferry/detail/frame.hpp"
#include "ferry/shared_allocator.hpp"
#include "ferry/storage.hpp"

namespace ferry::detail {

/// The sending side: holds each CUDA storage of a frame on a counter of a hold-counter
/// board and writes its record.
class CudaRecordWriter {
 public:
  /// A writer for a connection whose boards come from `pool` (an isolated channel's, so that
  /// they travel without a copy; nullopt: the process's shared memory). Null in a build
  /// without CUDA.
  static std::unique_ptr<CudaRecordWriter> make(const std::optional<SharedAllocator>& pool);
  virtual ~CudaRecordWriter() = default;

  /// A new frame: forgets the storages and records of the last one.
  virtual void begin_frame() noexcept = 0;
  /// Checks that `storage` (a CUDA storage of this process) may be shared and picks the
  /// counter that holds it; returns the storage of that counter's hold-counter board, which
  /// the frame carries as an ordinary shared storage ahead of it (then call board_added()).
  /// Throws Error saying what to do instead.
  virtual std::shared_ptr<Storage> hold(const std::shared_ptr<Storage>& storage) = 0;
  /// The board hold() returned last is at `index` in the frame's handle table.
  virtual void board_added(std::uint32_t index) noexcept = 0;
  /// Appends the record of `storage` (held this frame), in handle-table order, and counts
  /// the frame's hold on its counter (taken back by end_frame(false)).
  virtual void write_record(const Storage& storage) = 0;
  /// The records of the frame, the front of its body.
  virtual std::span<const std::byte> records() const noexcept = 0;
  /// The frame was sent (`sent`) or not: without it, its holds are taken back.
  virtual void end_frame(bool sent) noexcept = 0;
};

/// The receiving side: opens the storage a CUDA record names and waits for its signal.
class CudaRecordReader {
 public:
  /// A reader, or null in a build without CUDA.
  static std::unique_ptr<CudaRecordReader> make();
  virtual ~CudaRecordReader() = default;

  /// What the decoder keeps at the entry's slot: whether it holds a lease (`held`), and for
  /// a CUDA lease the opened range (the receiver's hold on the producer's block) and the
  /// Storage a user holds, while it lives. resolve() fills both in for a slot not held.
  struct Lease {
    bool held;
    std::shared_ptr<Allocation>& range;
    std::weak_ptr<Storage>& handle;
  };
  /// Resolves the CudaIpc entry `index` of the frame with its `record_number`-th record,
  /// read from `records` (the body, which starts with the frame's records). `earlier`: the
  /// storages of the frame resolved so far (the record's hold-counter board is one of them).
  /// `lease`: the slot's lease, filled in for a new storage. Checks every field before any
  /// CUDA call; throws ProtocolError, after giving back the hold the frame took.
  virtual std::shared_ptr<Storage> resolve(const HandleEntry& entry, std::uint32_t index, std::size_t record_number,
                                           std::span<const std::byte> records,
                                           std::span<const std::shared_ptr<Storage>> earlier, Lease lease) = 0;
};

}  // namespace ferry::detail
