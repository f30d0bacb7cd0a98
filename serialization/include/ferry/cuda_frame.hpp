// The wire format of CUDA storages (wire version 2, see frame.hpp). A CUDA storage is a
// HandleKind::CudaIpc entry of the handle table plus a CudaHandleRecord at the front of the
// body (one per CudaIpc entry, in table order; the header's body_bytes counts them). The
// entry carries what every storage entry carries:
//   slot     the lease slot of the storage on this connection (the receiver keeps the
//            opened block mapped there until the sender announces the slot's release)
//   nbytes   the storage's size
// (its segment_slot and offset are unused: a CUDA storage lies in no shared segment) and the
// record the rest, including the producer's pid and device ordinal, which version 1 kept in
// its larger handle entries. Every frame that carries the storage repeats the record: a
// storage sent again while leased costs no cudaIpcOpenMemHandle, only an event wait and a
// counter.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry {

/// Bits of CudaHandleRecord::flags.
inline constexpr std::uint32_t kCudaRecordHasEvent = 1;  ///< wait on event_handle before using the storage

/// Everything about a CUDA storage that does not fit a HandleEntry.
struct CudaHandleRecord {
  std::byte memory_handle[64];  ///< cudaIpcMemHandle_t of the whole cudaMalloc block
  std::byte event_handle[64];   ///< cudaIpcEventHandle_t recorded after the sender's last write
  char pci_bus_id[16];          ///< the GPU (cudaDeviceGetPCIBusId), NUL-terminated
  std::uint64_t block_id;       ///< the producer's name of the block, never reused by that process
  std::uint64_t block_bytes;    ///< size of the block
  std::uint64_t offset;         ///< the storage's byte offset in the block
  std::uint32_t board_index;    ///< index, in the handle table, of the release board (a shared storage)
  std::uint32_t counter;        ///< the counter of that board that this storage's holds are counted on
  std::uint32_t flags;          ///< kCudaRecordHasEvent
  std::int32_t pid;             ///< the producer's pid (the process that allocated the block)
  std::int32_t device;          ///< the producer's ordinal of the GPU (informative: pci_bus_id rules)
  std::uint32_t reserved;       ///< zero
};
static_assert(sizeof(CudaHandleRecord) == 192);

}  // namespace ferry
