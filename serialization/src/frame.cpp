#include "ferry/detail/frame.hpp"

#include <cstdio>
#include <string>

#include "ferry/error.hpp"

namespace ferry {
namespace {

// Finds the field of an invalid header and throws; out of line, so that the check of a valid
// header (every frame) is a few compares.
[[noreturn, gnu::noinline, gnu::cold]] void throw_invalid_header(const detail::FrameHeader& header,
                                                                 const FrameLimits& limits) {
  if (header.magic != detail::kFrameMagic) {
    throw ProtocolError("frame has a wrong magic number (0x" + [&] {
      char text[9];
      std::snprintf(text, sizeof text, "%08x", header.magic);
      return std::string(text);
    }() + "); the stream is corrupted or the peer is not a ferry channel");
  }
  if (header.version != detail::kFrameVersion) {
    throw ProtocolError("frame has wire version " + std::to_string(header.version) + ", this build speaks version " +
                        std::to_string(detail::kFrameVersion) + "; build both sides from the same ferry");
  }
  if (header.kind != static_cast<std::uint8_t>(detail::FrameKind::Message) &&
      header.kind != static_cast<std::uint8_t>(detail::FrameKind::Close)) {
    throw ProtocolError("frame has an unknown kind " + std::to_string(header.kind));
  }
  if (const auto breach = detail::find_limit_breach(header, limits)) {
    throw ProtocolError(std::string("frame header field ") + breach->field + " is " + std::to_string(breach->value) +
                        ", above the limit of " + std::to_string(breach->limit) + " (ChannelOptions::limits." +
                        breach->setting +
                        "; a sender with the same limits refuses such a message before sending it, so the peer "
                        "was built with larger limits or is not a ferry channel)");
  }
  if (header.fd_count > header.segment_count) {
    throw ProtocolError("frame header field fd_count claims " + std::to_string(header.fd_count) + " fds for only " +
                        std::to_string(header.segment_count) + " segments");
  }
  throw ProtocolError("frame header is invalid");  // not reached: one of the checks above throws
}

}  // namespace

std::optional<detail::LimitBreach> detail::describe_limit_breach(const detail::FrameHeader& header,
                                                                 const FrameLimits& limits) noexcept {
  using Limit = detail::LimitBreach::Limit;
  const detail::LimitBreach checks[] = {
      {Limit::BodyBytes, "body_bytes", "max_body_bytes", header.body_bytes, limits.max_body_bytes},
      {Limit::Handles, "handle_count", "max_handles", header.handle_count, limits.max_handles},
      {Limit::Segments, "segment_count", "max_segments", header.segment_count, limits.max_segments},
      {Limit::Fds, "fd_count", "max_fds", header.fd_count, limits.max_fds},
      {Limit::TypeNameBytes, "type_name_bytes", "max_type_name_bytes", header.type_name_bytes,
       limits.max_type_name_bytes},
      // Last: a sender skips them (they are its connection's bookkeeping, not the message's).
      {Limit::Releases, "release_count", "max_releases", header.release_count, limits.max_releases},
      {Limit::Releases, "segment_release_count", "max_releases", header.segment_release_count, limits.max_releases},
  };
  for (const detail::LimitBreach& check : checks) {
    if (check.value > check.limit) return check;
  }
  return std::nullopt;
}

void detail::validate_header(const detail::FrameHeader& header, const FrameLimits& limits) {
  const bool valid = header.magic == detail::kFrameMagic && header.version == detail::kFrameVersion &&
                     (header.kind == static_cast<std::uint8_t>(detail::FrameKind::Message) ||
                      header.kind == static_cast<std::uint8_t>(detail::FrameKind::Close)) &&
                     detail::within_limits(header, limits) && header.fd_count <= header.segment_count;
  if (!valid) throw_invalid_header(header, limits);
}

}  // namespace ferry
