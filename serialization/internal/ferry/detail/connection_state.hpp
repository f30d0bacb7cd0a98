// One connection's state, one struct per end: what the encoder (SendingConnection) and the
// decoder (ReceivingConnection) keep from one frame to the next. The two codecs are frame
// codecs over it: everything else they hold is the frame being encoded or decoded, or how
// the connection was made (handle passing, the isolation pool, the expected type).
//
// Per end: the leases, as two slot tables (storages and segments, numbered by the sender,
// followed by the receiver: slot_table.hpp) with their lookups; the return path
// (connection_holds.hpp: pins, returns, acknowledgements, the return board, upstream
// boards); the CUDA strategy (cuda_records.hpp; none until the first CUDA storage, and none
// in a build without CUDA); and what the type check remembers. Not thread-safe: each is its
// codec's (the sender's next sequence number alone may be read from another thread). See
// docs/design/leases-and-returns.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "ferry/allocation.hpp"
#include "ferry/detail/connection_holds.hpp"
#include "ferry/detail/cuda_records.hpp"
#include "ferry/detail/id_slot_map.hpp"
#include "ferry/detail/peer_fd.hpp"
#include "ferry/detail/return_board.hpp"
#include "ferry/detail/shared_segment.hpp"
#include "ferry/detail/slot_table.hpp"
#include "ferry/storage.hpp"

namespace ferry::detail {

/// The sending end of one connection, as the encoder keeps it between frames.
struct SendingConnection {
  /// What a storage slot names: the storage the receiver leases (weak: its death here is
  /// what releases the slot), and its id (the key of leased_ids).
  struct LeasedStorage {
    std::uint64_t storage_id = 0;
    std::weak_ptr<Storage> storage;
  };
  /// What a segment slot names (sent_segments finds the slot by the id).
  struct LeasedSegment {
    std::uint64_t segment_id = 0;
    std::weak_ptr<SharedSegment> segment;
  };

  // The receiver's leases, as far as this end knows: storages and segments, each numbered
  // by a slot table (its free list, releases to announce, deaths seen).
  SlotTable<LeasedStorage> storage_slots{ReturnBoard::kSlots, kStorageSlotNames};
  IdSlotMap leased_ids;  // Storage::id() -> slot, of the Live storage slots
  SlotTable<LeasedSegment> segment_slots{kMaxSegmentSlots, kSegmentSlotNames};
  std::unordered_map<std::uint64_t, std::uint32_t> sent_segments;  // SharedSegment::id() -> slot
  std::uint64_t last_segment_id = 0;                               // the segment the encoder found last (0: none)
  std::uint32_t last_segment_slot = 0;

  // The return path: pins, returns, the return board, what stays open until the receiver
  // acknowledges its frame (segments and boards named by /proc path: close() waits for
  // that), upstream boards passed.
  SendingHolds holds;
  std::unique_ptr<CudaRecordWriter> cuda;  // made with the first CUDA storage

  // Of the next frame; frames count from 1. Atomic, with this encoder's thread its one
  // writer: introspection reads it from its own thread (MessageEncoder::frames_committed()).
  std::atomic<std::uint64_t> next_sequence{1};
  bool type_name_sent = false;        // a committed frame carried the type's name
  bool delivery_tracked = false;      // MessageEncoder::track_delivery(): the board goes even without storages
  std::uint64_t storages_passed = 0;  // as new ones (see MessageEncoder::storages_passed())
};

/// The receiving end of one connection, as the decoder keeps it between frames.
struct ReceivingConnection {
  // A lease keeps a storage the sender still holds: its memory() is the receiver's hold on
  // the memory (a ReceivedBlock, which gives the storage slot back through the return board
  // when it dies, or an opened CUDA range), owned by the core when there is one and by
  // `allocation` otherwise.
  //
  // Identity. For a storage received from another process the lease also owns the Storage
  // object itself (the "core"), so that the storage keeps its identity (same object, same
  // id) across messages while the sender holds it, and hands the user *handles*: shared_ptrs
  // with their own control block that point at the core and announce their last drop
  // (Storage::announce_dropped). A sender that forwards the storage watches the handle, so
  // the storage counts as dropped once the user dropped every handle, even though the lease
  // still owns the core. The core owns the block, so the block is given back once the lease
  // is released and every handle is gone.
  //
  // For a storage this process sent itself (a block coming back, found through the
  // segment's remembered storages) the lease owns only its block and a weak handle on that
  // storage: owning it would keep it alive through the lease, its release would never be
  // announced, and two processes echoing a storage would keep each other's leases alive
  // forever. CUDA leases have no core either (owning the Storage would hold the producer's
  // memory).
  struct Lease {
    std::shared_ptr<Allocation> allocation;  // leases without a core only
    std::shared_ptr<Storage> core;           // received storages only
    std::weak_ptr<Storage> handle;           // what the user holds, while it lives
    explicit operator bool() const noexcept { return allocation != nullptr || core != nullptr; }
    const Allocation* memory() const noexcept { return core ? core->allocation() : allocation.get(); }
  };

  // The sender's leases, numbered as the sender numbered them (see SlotTable).
  SlotTable<Lease> leases{ReturnBoard::kSlots, kStorageSlotNames};
  SlotTable<std::shared_ptr<SharedSegment>> segments{kMaxSegmentSlots, kSegmentSlotNames};
  PeerFdOpener peer_fds;  // takes segments named by the sender's pid and fd number
  // The return path: the return board, upstream boards, this process's registrations.
  ReceivingHolds holds;
  std::unique_ptr<CudaRecordReader> cuda;  // made with the first CUDA entry

  // The sender's type, as its first frame named it.
  std::string peer_type_name;
  bool peer_type_name_truncated = false;  // the sender cut its name (kFrameTypeNameTruncated)
};

}  // namespace ferry::detail
