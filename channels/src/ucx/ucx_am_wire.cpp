#include "ucx_am_wire.hpp"

#include <cstring>
#include <limits>

namespace ferry::ucx::detail {
namespace {

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<std::uint64_t>::max() : sum;
}

}  // namespace

std::uint64_t max_frame_bytes(const FrameLimits& limits) noexcept {
  std::uint64_t bytes = sizeof(ferry::detail::FrameHeader) + std::uint64_t{limits.max_type_name_bytes};
  bytes = saturating_add(bytes, std::uint64_t{limits.max_segments} * sizeof(ferry::detail::SegmentEntry));
  bytes = saturating_add(bytes, std::uint64_t{limits.max_handles} * sizeof(ferry::detail::HandleEntry));
  bytes = saturating_add(bytes, std::uint64_t{limits.max_releases} * 2 * sizeof(std::uint32_t));
  return saturating_add(bytes, limits.max_body_bytes);
}

std::optional<FrameAmPlan> parse_frame_am(std::span<const std::byte> header, std::uint64_t data_length,
                                          const FrameLimits& limits, const char** why) noexcept {
  FrameAmPlan plan;
  if (header.size() < sizeof plan.header) {
    *why = "a frame message without its header";
    return std::nullopt;
  }
  std::memcpy(&plan.header, header.data(), sizeof plan.header);
  const std::uint32_t count = plan.header.copy_count;
  if (count > kMaxCopies || count > limits.max_handles) {
    *why = "a frame message announcing more storages than the limits allow";
    return std::nullopt;
  }
  if (header.size() != sizeof plan.header + std::size_t{count} * sizeof(CopyDescriptor)) {
    *why = "a frame message whose header is not the size its storage count says";
    return std::nullopt;
  }
  if (plan.header.frame_bytes < sizeof(ferry::detail::FrameHeader) ||
      plan.header.frame_bytes > max_frame_bytes(limits) || plan.header.frame_bytes > data_length) {
    *why = "a frame message whose frame size is outside the limits or its data";
    return std::nullopt;
  }
  plan.descriptors = header.subspan(sizeof plan.header);
  for (std::size_t i = 0; i < count; ++i) {
    const CopyDescriptor descriptor = descriptor_at(plan, i);
    if (descriptor.inline_copy > 1) {
      *why = "a frame message with an unknown storage kind";
      return std::nullopt;
    }
    if (descriptor.inline_copy == 0) {
      ++plan.remote_count;
      continue;
    }
    if (descriptor.nbytes > kInlineCopyLimit) {
      *why = "a frame message with an inline storage above the inline size";
      return std::nullopt;
    }
    plan.inline_bytes += descriptor.nbytes;  // at most kMaxCopies x kInlineCopyLimit: no overflow
  }
  if (plan.inline_bytes != data_length - plan.header.frame_bytes) {
    *why = "a frame message whose inline storages do not add up to its length";
    return std::nullopt;
  }
  return plan;
}

CopyDescriptor descriptor_at(const FrameAmPlan& plan, std::size_t index) noexcept {
  CopyDescriptor descriptor;
  std::memcpy(&descriptor, plan.descriptors.data() + index * sizeof descriptor, sizeof descriptor);
  return descriptor;
}

bool accepted_before_handshake(unsigned am_id) noexcept { return am_id == kControlAm; }

bool control_message_fits(std::uint64_t length, bool rendezvous, std::size_t queued) noexcept {
  return !rendezvous && length <= kMaxControlBytes && queued < kMaxQueuedControls;
}

std::optional<std::uint64_t> parse_delivered(std::span<const std::byte> data, bool rendezvous) noexcept {
  std::uint64_t sequence = 0;
  if (rendezvous || data.size() != sizeof sequence) return std::nullopt;
  std::memcpy(&sequence, data.data(), sizeof sequence);
  return sequence;
}

}  // namespace ferry::ucx::detail
