// The active messages of a ucx:// connection as bytes: their ids, the header of a frame
// message, and the checks every message from a peer passes before anything is allocated
// for it. Pure functions of bytes, lengths and FrameLimits (no UCX), so that the fuzz
// target ucx_am_fuzzer runs them as the connection's callbacks do.
//
// Before the handshake proved the shared secret, a connection takes control messages only
// (at most kMaxControlBytes each, kMaxQueuedControls queued): any other message breaks
// it. After, a frame message's header must describe its data exactly, within the limits
// the receiver enforces (max_frame_message_bytes), and a storage message must have the
// size its frame announced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "ferry/detail/frame.hpp"

namespace ferry::ucx::detail {

/// Active message ids.
enum AmId : unsigned { kControlAm = 1, kFrameAm = 2, kCopyAm = 3, kDeliveredAm = 4 };

/// The AM header of a frame message. Its data: the frame's bytes, then the bytes of the
/// copies marked inline, in order; the others follow as copy messages, in order. The
/// header is followed by `copy_count` CopyDescriptor.
struct FrameAmHeader {
  std::uint64_t frame_bytes = 0;
  std::uint32_t copy_count = 0;
  std::uint32_t reserved = 0;
};
struct CopyDescriptor {
  std::uint64_t nbytes = 0;
  std::uint64_t inline_copy = 0;  ///< 1: inside the frame message; 0: a copy message of its own
};

/// Storages up to this size travel inside the frame message (one eager message); larger
/// ones by rendezvous, each in a message of its own.
inline constexpr std::size_t kInlineCopyLimit = std::size_t{16} << 10;
/// The most copies one frame message describes in its AM header (UCX 1.13 caps AM headers
/// near 8100 bytes).
inline constexpr std::size_t kMaxCopies = (7800 - sizeof(FrameAmHeader)) / sizeof(CopyDescriptor);
/// The largest handshake message, and how many may wait unread.
inline constexpr std::size_t kMaxControlBytes = std::size_t{16} << 10;
inline constexpr std::size_t kMaxQueuedControls = 4;

/// The most bytes a frame within `limits` takes (header and payload; saturating).
std::uint64_t max_frame_bytes(const FrameLimits& limits) noexcept;

/// A frame message's header, checked.
struct FrameAmPlan {
  FrameAmHeader header;
  std::span<const std::byte> descriptors;  ///< header.copy_count CopyDescriptor (unaligned bytes)
  std::size_t remote_count = 0;            ///< copy messages that follow
  std::uint64_t inline_bytes = 0;
};
/// Checks the AM header `header` of a frame message whose data is `data_length` bytes
/// against `limits`; nullopt with `*why` set (a static text) when the message breaks the
/// protocol. Never allocates.
std::optional<FrameAmPlan> parse_frame_am(std::span<const std::byte> header, std::uint64_t data_length,
                                          const FrameLimits& limits, const char** why) noexcept;
/// Descriptor `index` of `plan` (index < plan.header.copy_count).
CopyDescriptor descriptor_at(const FrameAmPlan& plan, std::size_t index) noexcept;

/// Which message kinds a connection takes before its handshake ended: control only.
bool accepted_before_handshake(unsigned am_id) noexcept;
/// True when a control message of `length` (rendezvous or not) may be queued behind
/// `queued` others.
bool control_message_fits(std::uint64_t length, bool rendezvous, std::size_t queued) noexcept;
/// The sequence a delivery report carries; nullopt when it is malformed.
std::optional<std::uint64_t> parse_delivered(std::span<const std::byte> data, bool rendezvous) noexcept;

}  // namespace ferry::ucx::detail
