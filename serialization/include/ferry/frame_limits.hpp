// ferry::FrameLimits: the largest frame a receiver accepts (ChannelOptions::limits).
#pragma once

#include <cstdint>

namespace ferry {

/// Limits a receiver enforces on a header before it reads the rest of the frame.
struct FrameLimits {
  std::uint64_t max_body_bytes = std::uint64_t{1} << 30;
  std::uint32_t max_handles = 1u << 16;
  std::uint32_t max_segments = 1u << 16;
  /// fds a frame passes (new segments on a Unix socket, or from a sender that is not
  /// dumpable): 253 (SCM_MAX_FD) per sendmsg, so more travel in several.
  std::uint32_t max_fds = 4096;
  std::uint32_t max_releases = 1u << 20;
  std::uint32_t max_type_name_bytes = 4096;
};

}  // namespace ferry
