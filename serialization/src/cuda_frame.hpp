// The wire format of CUDA storages (wire version 3, see frame.hpp). A CUDA storage is a
// HandleKind::CudaIpc entry of the handle table plus a CudaHandleRecord at the front of the
// body (one per CudaIpc entry, in table order; the header's body_bytes counts them). The
// entry carries what every storage entry carries:
//   slot     the lease slot of the storage on this connection (the receiver keeps the
//            opened block mapped there until the sender announces the slot's release)
//   nbytes   the storage's size
// (its segment_slot and offset are unused: a CUDA storage lies in no shared segment) and the
// record the rest, including the producer's pid and device ordinal, which version 1 kept in
// its larger handle entries. Every frame that carries the storage repeats the record: a
// storage sent again while leased costs no cudaIpcOpenMemHandle, only a wait for the signal
// (a fence, or an event in the fallback) and a counter.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry::detail {

/// Bits of CudaHandleRecord::flags (at most one of the two; neither: the sender synchronized).
inline constexpr std::uint32_t kCudaRecordHasEvent = 1;  ///< wait on the event in signal_handle before use
inline constexpr std::uint32_t kCudaRecordHasFence = 2;  ///< wait until the fence word reaches fence_value before use

/// Everything about a CUDA storage that does not fit a HandleEntry.
struct CudaHandleRecord {
  std::byte memory_handle[64];   ///< cudaIpcMemHandle_t of the whole cudaMalloc block
  std::byte signal_handle[64];   ///< kCudaRecordHasFence: cudaIpcMemHandle_t of the sender's fence buffer;
                                 ///< kCudaRecordHasEvent: cudaIpcEventHandle_t recorded after its last write
  char pci_bus_id[16];           ///< the GPU (cudaDeviceGetPCIBusId), NUL-terminated
  std::uint64_t block_id;        ///< the producer's name of the block, never reused by that process
  std::uint64_t block_bytes;     ///< size of the block
  std::uint64_t offset;          ///< the storage's byte offset in the block
  std::uint32_t board_index;     ///< index, in the handle table, of the hold-counter board (a shared storage)
  std::uint32_t counter;         ///< the counter of that board that this storage's holds are counted on
  std::uint32_t flags;           ///< kCudaRecordHasEvent or kCudaRecordHasFence
  std::int32_t pid;              ///< the producer's pid (the process that allocated the block)
  std::int32_t device;           ///< the producer's ordinal of the GPU (informative: pci_bus_id rules)
  std::uint32_t reserved;        ///< zero (a receiver refuses anything else)
  std::uint64_t fence_block_id;  ///< the producer's block id of its fence buffer (on the storage's GPU)
  std::uint64_t fence_offset;    ///< the fence word's byte offset in that buffer (a multiple of 8)
  std::uint64_t fence_value;     ///< the receiver's stream waits until the word is at least this
};
static_assert(sizeof(CudaHandleRecord) == 216);

}  // namespace ferry::detail
