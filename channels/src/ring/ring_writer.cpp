#include <fcntl.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fd_passing/segment_fd_channel.hpp"
#include "ferry/error.hpp"
#include "ferry/wait_interruption.hpp"
#include "ring/ring_transport.hpp"
#include "transport/peer_gone.hpp"

namespace ferry {
namespace {

[[noreturn, gnu::noinline, gnu::cold]] void throw_scribbled_head(std::uint64_t head, std::uint64_t from,
                                                                 std::uint64_t to) {
  throw ProtocolError("the ring's shared read position (" + std::to_string(head) + ") is outside what was written (" +
                      std::to_string(from) + ".." + std::to_string(to) + "); another process scribbled in the segment");
}

// Walks the parts of a frame, copying them into the ring piece by piece.
class PartCursor {
 public:
  explicit PartCursor(std::span<const iovec> parts) : parts_(parts) {}
  // Copies the next `size` bytes of the frame to `out(bytes, length)`, part by part.
  template <class Out>
  void take(std::size_t size, const Out& out) {
    while (size > 0) {
      const iovec& part = parts_[index_];
      const std::size_t n = std::min(size, part.iov_len - offset_);
      out(static_cast<const std::byte*>(part.iov_base) + offset_, n);
      size -= n;
      offset_ += n;
      if (offset_ == part.iov_len) {
        ++index_;
        offset_ = 0;
      }
    }
  }

 private:
  std::span<const iovec> parts_;
  std::size_t index_ = 0;
  std::size_t offset_ = 0;
};

}  // namespace

namespace {
// fds given to write() go out on the companion socket, just before the frame.
detail::TransportCapabilities ring_writer_capabilities() noexcept {
  detail::TransportCapabilities capabilities;
  capabilities.can_pass_fds = true;
  return capabilities;
}
}  // namespace

RingFrameWriter::RingFrameWriter(std::shared_ptr<const RingSegment> segment, detail::UniqueFd companion,
                                 const RingTiming& timing)
    : FrameWriter(ring_writer_capabilities()), end_(std::move(segment), std::move(companion), timing) {
  // A writer rebuilt from inherited descriptors continues where the stream is.
  tail_ = end_.header().tail.load(std::memory_order_acquire);
  head_seen_ = end_.header().head.load(std::memory_order_acquire);
  if (tail_ - head_seen_ > end_.capacity()) throw ProtocolError("the ring's shared positions are corrupted");
}

std::uint64_t RingFrameWriter::room(bool refresh) {
  if (refresh) {
    const std::uint64_t head = end_.header().head.load(std::memory_order_seq_cst);
    if (head - head_seen_ > tail_ - head_seen_) throw_scribbled_head(head, head_seen_, tail_);
    head_seen_ = head;
  }
  return end_.capacity() - (tail_ - head_seen_);
}

detail::WaitOutcome RingFrameWriter::wait_for_room(std::uint64_t wanted, const detail::Deadline& deadline) {
  wanted = std::min(wanted, end_.capacity() / 4);
  return end_.wait(
      end_.header().writer_sleeping, [&] { return room(true) >= wanted; }, deadline, waits_charged_to(),
      kRingRoomFirstSleep);
}

detail::BodySpace* RingFrameWriter::body_space(const detail::Deadline& deadline) {
  lent_ = nullptr;
  if (!end_.is_open() || !pending_.empty()) return nullptr;
  lend_deadline_ = deadline;
  return this;
}

std::span<std::byte> RingFrameWriter::lend(std::size_t bytes) {
  if (!end_.is_open() || bytes > end_.capacity() - kRingBodyOffset) return {};
  const std::uint64_t wanted = kRingBodyOffset + bytes;
  if (room(false) < wanted && room(true) < wanted &&
      end_.wait(
          end_.header().writer_sleeping, [&] { return room(true) >= wanted; }, lend_deadline_, waits_charged_to(),
          kRingRoomFirstSleep) != detail::WaitOutcome::Ready) {
    return {};  // the body stays private; write() then reports the timeout or the dead reader
  }
  lent_ = end_.at(tail_) + kRingBodyOffset;
  return {lent_, static_cast<std::size_t>(room(false) - kRingBodyOffset)};
}

bool RingFrameWriter::write_around_lent_body(std::span<const iovec> parts, const detail::Deadline& deadline) {
  const std::span<const iovec> front = parts.first(parts.size() - 1);
  const std::size_t body = parts.back().iov_len;
  std::size_t prefix = 0;
  for (const iovec& part : front) prefix += part.iov_len;
  // lend() made room for kRingBodyOffset + body bytes from here, contiguous in memory.
  std::byte* const base = end_.at(tail_);
  std::size_t gap = kRingBodyOffset - std::min(prefix, kRingBodyOffset);
  if (prefix > kRingBodyOffset || (gap > 0 && gap < sizeof(RingSkip))) {
    // The header and tables do not fit in front of the body with a gap record: move the
    // body right behind them, or, without room for that, write the frame as usual.
    if (prefix > kRingBodyOffset && room(true) < prefix + body) {
      std::vector<std::byte> copy(base + kRingBodyOffset, base + kRingBodyOffset + body);
      std::vector<iovec> moved(parts.begin(), parts.end());
      moved.back().iov_base = copy.data();
      return write(moved, {}, deadline);
    }
    std::memmove(base + prefix, base + kRingBodyOffset, body);
    gap = 0;
  }
  if (gap > 0) {
    const RingSkip skip{kRingSkipMagic, gap};
    std::memcpy(base, &skip, sizeof skip);
  }
  std::byte* out = base + gap;
  for (const iovec& part : front) {
    std::memcpy(out, part.iov_base, part.iov_len);
    out += part.iov_len;
  }
  tail_ += gap + prefix + body;
  publish();
  return true;
}

bool RingFrameWriter::write(std::span<const iovec> parts, std::span<const int> fds, const detail::Deadline& deadline) {
  if (!end_.is_open()) throw ChannelClosed("cannot send: this end of the channel is closed");
  struct Forget {  // whatever happens, these fds are not sent with a later frame
    std::span<const int>& fds;
    ~Forget() { fds = {}; }
  } forget{fds_to_send_};
  return write_frame(parts, fds, deadline);
}

void RingFrameWriter::publish() {
  // A frame's fds go out on the companion socket before the first of its bytes is visible
  // (so the reader finds them there once it has the frame), and only for a frame that is
  // accepted: publishing is what accepts it.
  if (!fds_to_send_.empty()) [[unlikely]] {
    const detail::WaitInterruptionSuspended committed;  // the frame is accepted: finish it
    detail::SegmentFdChannel(end_.companion_fd()).send(fds_to_send_, detail::Deadline::never());
    fds_to_send_ = {};
  }
  RingHeader& header = end_.header();
  detail::RingEnd::publish(header.tail, tail_, header.reader_sleeping);  // pairs with a sleeping reader
}

bool RingFrameWriter::write_frame(std::span<const iovec> parts, std::span<const int> fds,
                                  const detail::Deadline& deadline) {
  std::byte* const lent = std::exchange(lent_, nullptr);
  if (!pending_.empty() && !flush(deadline)) return false;
  fds_to_send_ = fds;  // after the rest of the frame before it
  if (end_.peer_gone_lately()) detail::throw_receiver_gone();
  if (lent != nullptr && !parts.empty() && parts.back().iov_base == lent) {
    return write_around_lent_body(parts, deadline);
  }

  std::size_t total = 0;
  for (const iovec& part : parts) total += part.iov_len;

  // A frame that fits in the ring appears to the reader at once, whole: the reader then
  // decodes it in place. Wait for the room if need be.
  if (total <= end_.capacity()) {
    if (total > room(false) && total > room(true)) {
      const detail::WaitOutcome outcome = end_.wait(
          end_.header().writer_sleeping, [&] { return room(true) >= total; }, deadline, waits_charged_to(),
          kRingRoomFirstSleep);
      if (outcome == detail::WaitOutcome::PeerGone) detail::throw_receiver_gone();
      if (outcome == detail::WaitOutcome::Timeout) return false;
    }
    std::byte* out = end_.at(tail_);  // `total` bytes from here are contiguous (mapped twice)
    for (const iovec& part : parts) {
      std::memcpy(out, part.iov_base, part.iov_len);
      out += part.iov_len;
    }
    tail_ += total;
    publish();
    return true;
  }

  // A frame larger than the ring streams through in pieces as the reader makes room.
  PartCursor cursor(parts);
  auto copy = [this](const std::byte* bytes, std::size_t n) {
    end_.copy_in(tail_, bytes, n);
    tail_ += n;
  };
  std::size_t written = 0;
  // Once a piece went out, the rest follows: no interruption check runs then (a deadline
  // still stops the wait, keeping the rest in pending_).
  std::optional<detail::WaitInterruptionSuspended> committed;
  while (written < total) {
    std::uint64_t free = room(true);
    if (free < std::min<std::uint64_t>(total - written, end_.capacity() / 4)) {
      const detail::WaitOutcome outcome = wait_for_room(total - written, deadline);
      if (outcome == detail::WaitOutcome::PeerGone) detail::throw_receiver_gone();
      if (outcome == detail::WaitOutcome::Timeout) {
        if (written == 0) return false;
        // Accepted but unfinished: keep the rest, so that the stream never holds half a frame.
        pending_.clear();
        pending_done_ = 0;
        cursor.take(total - written, [this](const std::byte* bytes, std::size_t n) {
          pending_.insert(pending_.end(), bytes, bytes + n);
        });
        return true;
      }
      free = room(false);
    }
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(free, total - written));
    cursor.take(n, copy);
    written += n;
    publish();
    if (!committed) committed.emplace();
  }
  return true;
}

bool RingFrameWriter::flush(const detail::Deadline& deadline) {
  while (pending_done_ < pending_.size()) {
    if (!end_.is_open()) throw ChannelClosed("cannot send: this end of the channel is closed");
    const std::size_t left = pending_.size() - pending_done_;
    std::uint64_t free = room(true);
    if (free < std::min<std::uint64_t>(left, end_.capacity() / 4)) {
      const detail::WaitOutcome outcome = wait_for_room(left, deadline);
      if (outcome == detail::WaitOutcome::PeerGone) detail::throw_receiver_gone();
      if (outcome == detail::WaitOutcome::Timeout) return false;
      free = room(false);
    }
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(free, left));
    end_.copy_in(tail_, pending_.data() + pending_done_, n);
    tail_ += n;
    pending_done_ += n;
    publish();
  }
  pending_.clear();
  pending_done_ = 0;
  return true;
}

void RingFrameWriter::shut_down() noexcept {
  // Nothing travels on the companion socket: the reader polls it for a hang-up (POLLRDHUP).
  if (end_.is_open() && end_.companion_fd() >= 0) (void)::shutdown(end_.companion_fd(), SHUT_WR);
}

detail::UniqueFd RingFrameWriter::liveness_probe() const {
  const int companion = end_.is_open() ? end_.companion_fd() : -1;
  if (companion < 0) return detail::UniqueFd();
  return detail::UniqueFd(::fcntl(companion, F_DUPFD_CLOEXEC, 0));  // empty when dup fails: no probe
}

std::uint64_t RingFrameWriter::acknowledged() {
  if (end_.is_open()) {
    acknowledged_ = std::max(acknowledged_, end_.header().acknowledged.load(std::memory_order_seq_cst));
  }
  return acknowledged_;
}

bool RingFrameWriter::wait_acknowledged(std::uint64_t sequence, const detail::Deadline& deadline) {
  if (!end_.is_open()) return acknowledged_ >= sequence;
  return end_.wait(
             end_.header().writer_sleeping, [&] { return acknowledged() >= sequence; }, deadline, waits_charged_to()) ==
         detail::WaitOutcome::Ready;
}

void RingFrameWriter::close() noexcept {
  pending_.clear();
  pending_done_ = 0;
  lent_ = nullptr;
  end_.close();
}

}  // namespace ferry
