#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "fd_passing/segment_fd_channel.hpp"
#include "ferry/error.hpp"
#include "ring/ring_transport.hpp"
#include "transport/peer_gone.hpp"

namespace ferry {

namespace {
// The companion socket never carries data, so it tells only of the writer's hang-up
// (POLLRDHUP); that a frame arrived, the writer tells by waking the ring's reader_sleeping word.
detail::TransportCapabilities ring_reader_capabilities(const RingSegment& segment, int companion) noexcept {
  detail::TransportCapabilities capabilities;
  capabilities.readiness_fd = companion;
  capabilities.readiness_fd_reports_data = false;
  capabilities.data_futex = &segment.header().reader_sleeping;
  return capabilities;
}
}  // namespace

RingFrameReader::RingFrameReader(std::shared_ptr<const RingSegment> segment, detail::UniqueFd companion,
                                 const RingTiming& timing, const FrameLimits& limits)
    : FrameReader(ring_reader_capabilities(*segment, companion.get())),
      end_(std::move(segment), std::move(companion), timing),
      limits_(limits) {
  // A reader rebuilt from inherited descriptors continues where the stream is.
  head_ = end_.header().head.load(std::memory_order_acquire);
}

std::uint64_t RingFrameReader::available() {
  const std::uint64_t tail = end_.header().tail.load(std::memory_order_seq_cst);
  const std::uint64_t count = tail - head_;
  if (count > end_.capacity()) {
    throw ProtocolError("the ring's shared write position (" + std::to_string(tail) + ") is outside " +
                        std::to_string(head_) + ".." + std::to_string(head_ + end_.capacity()) +
                        "; another process scribbled in the segment");
  }
  return count;
}

bool RingFrameReader::has_buffered_frame() const {
  if (!end_.is_open() || peer_closed_) return true;
  settle_head();  // a Selector about to sleep must not leave a writer's wake-up owed
  if (held_ > 0 || payload_filled_ > 0 || header_filled_ > 0) return true;
  return end_.header().tail.load(std::memory_order_seq_cst) != head_;
}

void RingFrameReader::publish_head() noexcept {
  RingHeader& header = end_.header();
  detail::RingEnd::publish(header.head, head_, header.writer_sleeping);  // pairs with a sleeping writer
  wake_owed_ = false;
}

void RingFrameReader::settle_head() const noexcept {
  if (!wake_owed_ || !end_.is_open()) return;
  wake_owed_ = false;
  detail::RingEnd::settle(end_.header().writer_sleeping);
}

bool RingFrameReader::consume(std::uint64_t count) {
  // Publish at most a quarter of the ring at a time, so that a writer streaming a large
  // frame refills what was read while the rest is being copied.
  count = std::min(count, end_.capacity() / 4);
  if (header_filled_ < sizeof frame_header_) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(count, sizeof frame_header_ - header_filled_));
    end_.copy_out(head_, reinterpret_cast<std::byte*>(&frame_header_) + header_filled_, n);
    header_filled_ += n;
    head_ += n;
    count -= n;
    if (header_filled_ == sizeof frame_header_) {
      detail::validate_header(frame_header_, limits_);
      frame_payload_.resize(static_cast<std::size_t>(detail::payload_bytes(frame_header_)));
      payload_filled_ = 0;
    }
  }
  if (header_filled_ == sizeof frame_header_) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(count, frame_payload_.size() - payload_filled_));
    end_.copy_out(head_, frame_payload_.data() + payload_filled_, n);
    payload_filled_ += n;
    head_ += n;
  }
  publish_head();
  return header_filled_ == sizeof frame_header_ && payload_filled_ == frame_payload_.size();
}

ReadStatus RingFrameReader::read_view(detail::FrameHeader& header, std::span<const std::byte>& payload,
                                      std::vector<std::byte>& buffer, std::deque<detail::UniqueFd>& fds,
                                      const detail::Deadline& deadline) {
  const ReadStatus status = read_frame(header, payload, buffer, deadline);
  // A frame's fds wait on the companion socket (the writer sent them before it published
  // the frame): take as many as it declares, no more; the decoder refuses a frame whose
  // fds did not all come.
  if (status == ReadStatus::Frame && header.fd_count > 0) {
    detail::SegmentFdChannel(end_.companion_fd()).receive(header.fd_count, fds);
  }
  return status;
}

ReadStatus RingFrameReader::read_frame(detail::FrameHeader& header, std::span<const std::byte>& payload,
                                       std::vector<std::byte>& buffer, const detail::Deadline& deadline) {
  release();
  settle_head();
  if (!end_.is_open() || peer_closed_) return ReadStatus::Closed;
  bool whole_frame_possible = header_filled_ == 0;  // at a frame boundary
  while (true) {
    std::uint64_t count = available();
    if (count == 0) {
      // While it waits, the reader keeps asking for the line its next bytes will land on
      // (where the next frame, or the gap before it, starts): once the writer publishes,
      // they are on their way with the position, instead of being fetched only after it.
      const std::byte* const next_frame = end_.at(head_);
      const detail::WaitOutcome outcome = end_.wait(
          end_.header().reader_sleeping,
          [&] {
            __builtin_prefetch(next_frame);
            return available() > 0;
          },
          deadline, waits_charged_to());
      if (outcome == detail::WaitOutcome::Timeout) return ReadStatus::Timeout;
      count = available();
      if (count == 0) {  // PeerGone, and nothing left to drain
        throw PeerDied(header_filled_ == 0 ? detail::kSenderGone : detail::kSenderGoneMidFrame);
      }
    }
    if (header_filled_ == 0 && count >= sizeof(RingSkip) && skip_gap(count)) continue;
    if (whole_frame_possible && count >= sizeof frame_header_) {
      // The common case: the whole frame is in the ring. View it where it lies.
      end_.copy_out(head_, reinterpret_cast<std::byte*>(&frame_header_), sizeof frame_header_);
      detail::validate_header(frame_header_, limits_);
      const std::uint64_t total = sizeof frame_header_ + detail::payload_bytes(frame_header_);
      if (total <= count) {
        header = frame_header_;
        held_ = total;
        held_alone_ = total == count && total <= ring_unfenced_release_limit(end_.capacity());
        if (header.kind == static_cast<std::uint8_t>(detail::FrameKind::Close)) {
          release();
          peer_closed_ = true;
          return ReadStatus::Closed;
        }
        payload = std::span<const std::byte>(end_.at(head_ + sizeof frame_header_),
                                             static_cast<std::size_t>(total - sizeof frame_header_));
        return ReadStatus::Frame;
      }
    }
    // The frame arrives in pieces: copy it out as it comes.
    whole_frame_possible = false;
    if (!consume(count)) continue;
    header = frame_header_;
    buffer.swap(frame_payload_);
    payload = buffer;
    header_filled_ = 0;
    payload_filled_ = 0;
    if (header.kind == static_cast<std::uint8_t>(detail::FrameKind::Close)) {
      peer_closed_ = true;
      return ReadStatus::Closed;
    }
    return ReadStatus::Frame;
  }
}

bool RingFrameReader::skip_gap(std::uint64_t count) {
  RingSkip skip;
  std::memcpy(&skip.magic, end_.at(head_), sizeof skip.magic);
  if (skip.magic != kRingSkipMagic) return false;
  end_.copy_out(head_, reinterpret_cast<std::byte*>(&skip), sizeof skip);
  // A writer publishes a gap together with the frame behind it, and never a longer one.
  if (skip.bytes < sizeof skip || skip.bytes > kRingBodyOffset || skip.bytes >= count) {
    throw ProtocolError("the ring holds a gap of " + std::to_string(skip.bytes) + " bytes, outside " +
                        std::to_string(sizeof skip) + ".." + std::to_string(kRingBodyOffset) +
                        " or not followed by a frame among the " + std::to_string(count) +
                        " bytes published; another process scribbled in the segment");
  }
  head_ += skip.bytes;
  return true;
}

void RingFrameReader::release() noexcept {
  if (held_ == 0 || !end_.is_open()) return;
  head_ += held_;
  held_ = 0;
  if (held_alone_) {
    // Without the fence, which would stand between decoding this frame and the reply to it
    // (ring_layout.hpp, "head after a lone small frame"); paid by settle_head().
    RingHeader& header = end_.header();
    wake_owed_ = detail::RingEnd::publish_unfenced(header.head, head_, header.writer_sleeping);
    return;
  }
  publish_head();
}

ReadStatus RingFrameReader::read(detail::FrameHeader& header, std::vector<std::byte>& payload,
                                 std::deque<detail::UniqueFd>& fds, const detail::Deadline& deadline) {
  std::span<const std::byte> view;
  const ReadStatus status = read_view(header, view, payload, fds, deadline);
  if (status == ReadStatus::Frame && view.data() != payload.data()) payload.assign(view.begin(), view.end());
  release();
  return status;
}

void RingFrameReader::acknowledge(std::uint64_t sequence) {
  if (!end_.is_open()) return;
  RingHeader& header = end_.header();
  detail::RingEnd::publish(header.acknowledged, sequence, header.writer_sleeping);
  wake_owed_ = false;  // its fence and look at the word settle an owed one
}

void RingFrameReader::close() noexcept {
  held_ = 0;
  settle_head();
  end_.close();
}

}  // namespace ferry
