// A side channel for segment fds: how a transport whose frames cannot carry descriptors (a
// pipe, a shared-memory ring) passes them anyway, over a Unix stream socket next to it. See
// docs/design/segment-fd-channel.md.
#pragma once

#include <cstddef>
#include <deque>
#include <span>

#include "ferry/detail/deadline.hpp"
#include "ferry/detail/unique_fd.hpp"

namespace ferry::detail {

/// One direction of fd passing over a connected AF_UNIX stream socket that its owner keeps
/// open (the channel borrows it). The writer sends a frame's fds just before the frame, in
/// messages of at most kMaxFdsPerMessage descriptors and one byte (their count) each, and
/// only once the frame is sure to follow; the reader, once it has read a frame that
/// declares `fd_count` fds, takes at most that many of those waiting, without waiting for
/// more. It never holds more than the frame declared: a message that brings more, or a
/// count byte that disagrees with the fds that came, is a ProtocolError (and what came is
/// closed). Other traffic may use the socket's opposite direction (a pipe's
/// acknowledgements); nothing else may write in this one.
class SegmentFdChannel {
 public:
  /// The most descriptors one sendmsg may carry (SCM_MAX_FD).
  static constexpr std::size_t kMaxFdsPerMessage = 253;

  explicit SegmentFdChannel(int socket) noexcept : socket_(socket) {}

  /// Sends duplicates of `fds` (the caller keeps its own), waiting while the socket is
  /// full. Returns false when `deadline` passed before the first message went out; once one
  /// did, waits for room for the rest whatever the deadline. Throws ChannelClosed when the
  /// reading end is gone, SystemError otherwise.
  bool send(std::span<const int> fds, const Deadline& deadline) const;
  /// Takes up to `count` descriptors (close-on-exec) from those waiting on the socket,
  /// without waiting, and appends them to `into`; returns how many. Throws ProtocolError
  /// when a message brings more than `count` still missing, disagrees with its count
  /// byte, or lost fds to the open-file limit.
  std::size_t receive(std::size_t count, std::deque<UniqueFd>& into) const;

 private:
  int socket_;
};

}  // namespace ferry::detail
