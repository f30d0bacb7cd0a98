// The wire format of one frame. All integers are little-endian (native on the hosts ferry
// supports: frames never leave the machine).
//
//   FrameHeader (48 bytes)
//   type name             type_name_bytes bytes (first message frame of a connection only)
//   handle table          handle_count x HandleEntry (48 bytes each)
//   released slots        release_count x uint32: leases the receiver drops before
//                         resolving this frame's handles
//   body                  body_bytes bytes: the cereal archive of the message; when the
//                         table has CudaIpc entries, the body starts with one
//                         CudaHandleRecord per such entry, in table order (cuda_frame.hpp)
//
// fd_count file descriptors travel with the frame as SCM_RIGHTS ancillary data (Unix
// socket), one per HandleKind::NewFd entry, in table order.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry {

inline constexpr std::uint32_t kFrameMagic = 0x59525246;  // "FRRY"
inline constexpr std::uint16_t kFrameVersion = 1;

/// What a frame carries.
enum class FrameKind : std::uint8_t {
  Message = 1,  ///< one message of the channel's type
  Close = 2,    ///< the sender closed its end: end of stream
};

/// Bits of FrameHeader::flags.
inline constexpr std::uint8_t kFrameHasTypeName = 1;

struct FrameHeader {
  std::uint32_t magic = kFrameMagic;
  std::uint16_t version = kFrameVersion;
  std::uint8_t kind = static_cast<std::uint8_t>(FrameKind::Message);
  std::uint8_t flags = 0;
  std::uint64_t type_fingerprint = 0;
  std::uint64_t sequence = 0;  ///< 1, 2, 3 ... per connection
  std::uint32_t type_name_bytes = 0;
  std::uint32_t handle_count = 0;
  std::uint32_t fd_count = 0;
  std::uint32_t release_count = 0;
  std::uint64_t body_bytes = 0;
};
static_assert(sizeof(FrameHeader) == 48);

/// How one storage of a message reaches the receiver.
enum class HandleKind : std::uint32_t {
  NewFd = 1,      ///< a memfd passed with the frame (SCM_RIGHTS); the receiver leases it at `slot`
  NewProcFd = 2,  ///< a memfd the receiver opens at /proc/<pid>/fd/<fd>, checked against device/inode
  Leased = 3,     ///< a storage the receiver already leases at `slot`: no fd, no mmap
  CudaIpc = 4,    ///< a CUDA storage, described by its CudaHandleRecord (cuda_frame.hpp); leased at `slot`
};

struct HandleEntry {
  std::uint32_t kind = 0;
  std::uint32_t slot = 0;
  std::uint64_t nbytes = 0;
  std::int32_t pid = 0;
  std::int32_t fd = -1;
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  std::uint64_t reserved = 0;
};
static_assert(sizeof(HandleEntry) == 48);

/// Limits a receiver enforces on a header before it reads the rest of the frame.
struct FrameLimits {
  std::uint64_t max_body_bytes = std::uint64_t{1} << 30;
  std::uint32_t max_handles = 1u << 16;
  std::uint32_t max_fds = 253;  // SCM_MAX_FD
  std::uint32_t max_releases = 1u << 20;
  std::uint32_t max_type_name_bytes = 4096;
};

/// Checks magic, version, kind and every count against `limits`; throws ProtocolError
/// naming the field that failed.
void validate_header(const FrameHeader& header, const FrameLimits& limits);

/// Bytes that follow the header: type name, handle table, releases and body.
std::uint64_t payload_bytes(const FrameHeader& header);

}  // namespace ferry
