// The wire format of one frame. All integers are little-endian (native on the hosts ferry
// supports: frames never leave the machine).
//
//   FrameHeader (56 bytes)
//   type name             type_name_bytes bytes (first message frame of a connection only)
//   segment table         segment_count x SegmentEntry (48 bytes each): the shared segments
//                         (and the connection's return board) this frame introduces
//   handle table          handle_count x HandleEntry (32 bytes each): the message's storages,
//                         each a block (segment slot, offset, size)
//   released slots        release_count x uint32: storage leases the receiver drops
//   released segments     segment_release_count x uint32: segment leases the receiver drops
//   body                  body_bytes bytes: the cereal archive of the message; when the
//                         handle table has CudaIpc entries, the body starts with one
//                         CudaHandleRecord per such entry, in table order (cuda_frame.hpp),
//                         and body_bytes counts them
//
// fd_count file descriptors travel with the frame as SCM_RIGHTS ancillary data (Unix
// socket), one per SegmentKind::NewFd entry, in table order. The receiver drops released
// leases first, then maps new segments, then resolves the handle table.
//
// Version 2 (the caching allocator) replaced version 1, whose 48-byte handle entries each
// named a whole memfd: a storage is now a block of a segment, segments travel once per
// connection in their own table, and CUDA storages are CudaIpc entries of the same handle
// table (their producer pid and device moved into the CUDA record). Version 3 grew the CUDA
// record (cuda_frame.hpp) by a fence: the receiver's stream waits for a word of the sender's
// fence buffer instead of an interprocess event.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "ferry/frame_limits.hpp"

namespace ferry::detail {

inline constexpr std::uint32_t kFrameMagic = 0x59525246;  // "FRRY"
/// Version 3: storages are blocks of leased segments, with a return board per connection;
/// CUDA records carry a fence.
inline constexpr std::uint16_t kFrameVersion = 3;

/// What a frame carries.
enum class FrameKind : std::uint8_t {
  Message = 1,  ///< one message of the channel's type
  Close = 2,    ///< the sender closed its end: end of stream
};

/// Bits of FrameHeader::flags.
inline constexpr std::uint8_t kFrameHasTypeName = 1;
/// With kFrameHasTypeName: the name is the first max_type_name_bytes bytes of a longer one
/// (the name only serves error messages; the fingerprint is always of the full name).
inline constexpr std::uint8_t kFrameTypeNameTruncated = 2;
/// The sender tracks delivery (MessageEncoder::track_delivery()): the receiver records the
/// frame on the connection's return board once its value was handed to the caller.
inline constexpr std::uint8_t kFrameTracksDelivery = 4;

struct FrameHeader {
  std::uint32_t magic = kFrameMagic;
  std::uint16_t version = kFrameVersion;
  std::uint8_t kind = static_cast<std::uint8_t>(FrameKind::Message);
  std::uint8_t flags = 0;
  std::uint64_t type_fingerprint = 0;
  std::uint64_t sequence = 0;  ///< 1, 2, 3 ... per connection
  std::uint32_t type_name_bytes = 0;
  std::uint32_t segment_count = 0;
  std::uint32_t handle_count = 0;
  std::uint32_t fd_count = 0;
  std::uint32_t release_count = 0;
  std::uint32_t segment_release_count = 0;
  std::uint64_t body_bytes = 0;
};
static_assert(sizeof(FrameHeader) == 56);

/// How a new segment reaches the receiver.
enum class SegmentKind : std::uint32_t {
  NoFd = 0,       ///< nothing to open: the entry only names a segment (SegmentRole::RetiredUpstreamBoard)
  NewFd = 1,      ///< a memfd passed with the frame (SCM_RIGHTS)
  NewProcFd = 2,  ///< a memfd the receiver opens at /proc/<pid>/fd/<fd>, checked against device/inode
};

/// What a new segment is for.
enum class SegmentRole : std::uint32_t {
  Data = 0,         ///< tensor memory: the receiver leases it at `slot_or_reclaims` until the sender releases it
  ReturnBoard = 1,  ///< the connection's return board (see ReturnBoard); sent once, `slot_or_reclaims` zero
  /// the return board of a connection that a forwarded block came through (the sender
  /// received the block there, or it was forwarded to the sender from there): the receiver
  /// registers there as a holder before it resolves the frame; sent once per board;
  /// `slot_or_reclaims`: the board's reclaim count when the sender forwarded the block (ReturnBoard::reclaims())
  UpstreamBoard = 2,
  /// an upstream board the sender passed before and names no more: no block it has left came
  /// through it, so no later frame forwards one. The receiver stops passing it on with the
  /// blocks it receives from then on, so that a long-lived connection does not keep the board
  /// of every connection it ever forwarded from; blocks received before keep it. `kind`
  /// NoFd, `device` and `inode` the board's identity, every other field zero. Sent at the
  /// start of a frame's segment table, before any UpstreamBoard entry of that frame.
  RetiredUpstreamBoard = 3,
};

/// A segment the frame introduces. The receiver checks that it is a memfd sealed against
/// shrinking and growing whose size is exactly `size`.
struct SegmentEntry {
  std::uint32_t kind = 0;  ///< SegmentKind
  std::uint32_t role = 0;  ///< SegmentRole
  /// Data: the segment slot the receiver leases it at; UpstreamBoard: the board's reclaim
  /// count when the sender forwarded the block; zero otherwise
  std::uint32_t slot_or_reclaims = 0;
  std::int32_t pid = 0;    ///< NewProcFd: the sender's pid
  std::uint64_t size = 0;  ///< bytes of the segment
  std::int32_t fd = -1;    ///< NewProcFd: the sender's fd number
  std::uint32_t reserved = 0;
  std::uint64_t device = 0;  ///< NewProcFd: st_dev of the memfd
  std::uint64_t inode = 0;   ///< NewProcFd: st_ino of the memfd
};
static_assert(sizeof(SegmentEntry) == 48);

/// How one storage of a message reaches the receiver.
enum class HandleKind : std::uint32_t {
  NewBlock = 1,  ///< a block of a leased segment; the receiver leases it at `slot` and gives the
                 ///< slot back through the return board once it no longer holds the block
  Leased = 2,    ///< a storage the receiver already leases at `slot`: only the slot travels
  CudaIpc = 3,   ///< a CUDA storage of `nbytes`, leased at `slot`, described by its CudaHandleRecord
                 ///< (cuda_frame.hpp); `segment_slot` and `offset` are unused (zero)
  Copied = 4,    ///< a storage of `nbytes` whose bytes the transport carries next to the frame (a
                 ///< transport without shared memory: UCX); the receiver's transport delivers them
                 ///< into a storage of the receiver's own; `slot`, `segment_slot`, `offset` unused (zero)
};

/// One storage: `nbytes` at `offset` in the segment leased at `segment_slot` (NewBlock), a
/// storage already leased at `slot` (Leased), or a CUDA storage (CudaIpc). Resolving a
/// NewBlock or Leased entry needs no fd, no mmap and no system call once the segment is
/// leased. The receiver checks offset + nbytes against the segment's size.
struct HandleEntry {
  std::uint32_t kind = 0;          ///< HandleKind
  std::uint32_t slot = 0;          ///< storage slot
  std::uint32_t segment_slot = 0;  ///< NewBlock: the segment's slot
  std::uint32_t reserved = 0;      ///< zero
  std::uint64_t offset = 0;        ///< NewBlock: offset of the block in its segment
  std::uint64_t nbytes = 0;        ///< size of the storage
};
static_assert(sizeof(HandleEntry) == 32);

/// A count of a frame header above its FrameLimits member.
struct LimitBreach {
  enum class Limit { BodyBytes, Handles, Segments, Fds, Releases, TypeNameBytes };
  Limit limit_kind;
  const char* field;    ///< the header field ("handle_count")
  const char* setting;  ///< the FrameLimits member, ChannelOptions::limits.<setting> ("max_handles")
  std::uint64_t value;
  std::uint64_t limit;
};

/// True when every count of `header` is within `limits` (inline: every frame sent and
/// received asks, and almost every one is).
inline bool within_limits(const FrameHeader& header, const FrameLimits& limits) noexcept {
  return header.body_bytes <= limits.max_body_bytes && header.handle_count <= limits.max_handles &&
         header.segment_count <= limits.max_segments && header.fd_count <= limits.max_fds &&
         header.release_count <= limits.max_releases && header.segment_release_count <= limits.max_releases &&
         header.type_name_bytes <= limits.max_type_name_bytes;
}

/// The first count of `header` above `limits` (body, handles, segments, fds, type name,
/// releases), or nullopt: what the receiver refuses, and what a sender refuses to send.
/// Inline up to the common answer (none).
std::optional<LimitBreach> describe_limit_breach(const FrameHeader& header, const FrameLimits& limits) noexcept;
inline std::optional<LimitBreach> find_limit_breach(const FrameHeader& header, const FrameLimits& limits) noexcept {
  if (within_limits(header, limits)) [[likely]]
    return std::nullopt;
  return describe_limit_breach(header, limits);
}

/// Checks magic, version, kind and every count against `limits`; throws ProtocolError
/// naming the field that failed.
void validate_header(const FrameHeader& header, const FrameLimits& limits);

/// Bytes that follow the header: type name, tables, releases and body.
inline std::uint64_t payload_bytes(const FrameHeader& header) noexcept {
  return std::uint64_t{header.type_name_bytes} + std::uint64_t{header.segment_count} * sizeof(SegmentEntry) +
         std::uint64_t{header.handle_count} * sizeof(HandleEntry) +
         (std::uint64_t{header.release_count} + header.segment_release_count) * sizeof(std::uint32_t) +
         header.body_bytes;
}

}  // namespace ferry::detail
