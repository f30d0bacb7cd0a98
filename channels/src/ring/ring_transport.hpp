// The shared-memory ring transport (Transport::ShmRing): frames pass through a ring buffer
// in a memfd that both processes map, so a small frame crosses processes without a system
// call while the peer is awake. Layout of the segment: ring_layout.hpp.
//
// - Large bodies are written once: the writer lends the encoder free ring space for a body
//   of FrameBody::kLendFrom bytes or more (body_space), the message is serialized straight
//   into it, and the frame's header and tables are then written in front of it, after a gap
//   (ring_layout.hpp). Nothing is published before the whole frame is in place.
// - Frames of any size: a frame no larger than the ring is copied in and published at once,
//   whole, when there is room for it (the reader then decodes it in place); a larger one is
//   streamed through in pieces as the reader makes room: the reader hands room back after
//   every quarter of the capacity it copies, and the writer fills whatever is free once at
//   least a quarter of the capacity (or the rest of the frame) is. The reader delivers a
//   frame as a message only once all of its bytes arrived, so a writer that dies
//   mid-frame leaves a PeerDied, never half a message.
// - Waiting (no frame to read, no room to write): spin for RingTiming::spin, then sleep on
//   a futex word in the segment. The peer wakes a sleeper with one futex system call after
//   publishing; a waiting end that is not woken re-checks every
//   RingTiming::peer_check_interval whether its peer still exists, so an idle channel
//   costs a few wake-ups per second and no spinning.
// - Peer death: each end holds one side of an AF_UNIX socket pair (the companion). When
//   every process holding the other side has exited or dropped it, the kernel reports a
//   hang-up: the writer then raises ChannelClosed, the reader PeerDied once the ring is
//   drained. A sender that finds room checks the companion at most once per
//   peer_check_interval, so sends into a ring whose reader died succeed for at most about
//   that long (or until the ring is full).
// - Tensors: a ring cannot carry fds, so new shared segments (and the return board) travel
//   as SegmentKind::NewProcFd (the reader takes fd <n> of the writer's process), unless
//   the writer's process does not let peers take its fds (not dumpable, capabilities):
//   then their fds go out on the companion socket just before the frame is published, and
//   the reader takes them there once it has the frame (SegmentFdChannel). For NewProcFd the
//   writer keeps those segments open until the reader has them (MessageEncoder's
//   keep-alive, HandlePassing::ProcFd). The connection's return board tells it (the last
//   resolved frame); the reader also stores a frame's sequence in the segment's
//   `acknowledged` field, and wakes the writer, when the frame was not recorded on the
//   board or the writer asked for acknowledgements (it waits in close()). Blocks of leased
//   segments need neither.
// - A closed writer's liveness_probe() is a duplicate of its companion socket, so the
//   sender's hold ledger can tell when the reader is gone (see HoldLedger).
// - Both ends are created in one process (make_ring_transport) and reach another by
//   fork, or by passing descriptors() to an exec'd process and rebuilding the end there
//   with RingSegment::attach and the matching constructor below.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "ferry/detail/transport.hpp"
#include "ring/ring_end.hpp"

namespace ferry {

/// The writing end of a ring. One thread at a time (SenderCore serializes sends).
///
/// Timed writes never leave half a frame: a write returns false only when no byte of the
/// frame went out (a frame no larger than the ring goes out whole or not at all); a frame
/// larger than the ring that was started before the deadline passed is accepted, and the
/// part that did not fit is kept here and written by the next write, flush() or close.
class RingFrameWriter final : public detail::FrameWriter, private detail::BodySpace {
 public:
  /// `segment` is shared with the reader when both ends live in this process;
  /// `companion` is the writer's side of the companion socket pair.
  RingFrameWriter(std::shared_ptr<const RingSegment> segment, detail::UniqueFd companion, const RingTiming& timing);
  /// Lends ring space past the tail (at kRingBodyOffset) for the next frame's body, waiting
  /// for room until `deadline` when the body outgrows what is free; null while the rest of
  /// an earlier frame is pending.
  detail::BodySpace* body_space(const detail::Deadline& deadline) override;
  bool write(std::span<const iovec> parts, std::span<const int> fds, const detail::Deadline& deadline) override;
  std::uint64_t acknowledged() override;
  bool wait_acknowledged(std::uint64_t sequence, const detail::Deadline& deadline) override;
  bool flush(const detail::Deadline& deadline) override;
  void close() noexcept override;
  /// Shuts this end's companion socket down for writing: the reader's peer check sees the
  /// writer gone (as after a crash) although a liveness probe still holds the socket.
  void shut_down() noexcept override;
  std::vector<int> descriptors() const override { return end_.descriptors(); }
  /// A duplicate of this end's companion socket: it reports POLLHUP once every process
  /// holding the reader's side has dropped it or died (the hold ledger of a closed channel
  /// polls it to unpin frames that nobody will ever read).
  detail::UniqueFd liveness_probe() const override;

 private:
  // write() once the end is known open; `fds` go out with the frame's first publish().
  bool write_frame(std::span<const iovec> parts, std::span<const int> fds, const detail::Deadline& deadline);
  // Free bytes in the ring, re-reading the reader's head when `refresh`; throws
  // ProtocolError when the shared head breaks the ring's invariant.
  std::uint64_t room(bool refresh);
  // Makes the bytes written so far visible to the reader and wakes it if it sleeps.
  void publish();
  // Waits for at least min(`wanted`, a quarter of the capacity) free bytes.
  detail::WaitOutcome wait_for_room(std::uint64_t wanted, const detail::Deadline& deadline);
  // BodySpace: free ring space from kRingBodyOffset past the tail, at least `bytes` of it.
  std::span<std::byte> lend(std::size_t bytes) override;
  // Writes a frame whose last part is the body in lent space: the other parts go in front
  // of it, after a gap; the body moves only when they do not fit there.
  bool write_around_lent_body(std::span<const iovec> parts, const detail::Deadline& deadline);

  detail::RingEnd end_;
  std::uint64_t tail_ = 0;       // bytes written (private: the shared copy is never read back)
  std::uint64_t head_seen_ = 0;  // the reader's head when last read
  std::uint64_t acknowledged_ = 0;
  std::vector<std::byte> pending_;  // unwritten rest of a frame accepted by a timed write
  std::size_t pending_done_ = 0;
  detail::Deadline lend_deadline_ = detail::Deadline::never();  // of the send whose body may be lent space
  std::byte* lent_ = nullptr;                                   // where a lent body starts; null when none
  std::span<const int> fds_to_send_;                            // of the frame being written, until published
};

/// The reading end of a ring. Enforces FrameLimits on every header before taking the
/// rest of the frame; a timed read that ends in the middle of a frame keeps what it read
/// and resumes there.
///
/// read_view() of a frame that lies whole in the ring (every frame no larger than the
/// capacity, unless the writer is still streaming it) views it where it lies: no copy;
/// the ring space is handed back to the writer by release(). A frame that arrives in
/// pieces is copied out piece by piece instead. Every byte of a viewed frame is copied
/// once into private memory by the decoder before it is checked or used, so a writer
/// that scribbles on a frame being decoded gets it rejected, never an out-of-bounds read.
class RingFrameReader final : public detail::FrameReader {
 public:
  RingFrameReader(std::shared_ptr<const RingSegment> segment, detail::UniqueFd companion, const RingTiming& timing,
                  const FrameLimits& limits);
  ReadStatus read(detail::FrameHeader& header, std::vector<std::byte>& payload, std::deque<detail::UniqueFd>& fds,
                  const detail::Deadline& deadline) override;
  ReadStatus read_view(detail::FrameHeader& header, std::span<const std::byte>& payload, std::vector<std::byte>& buffer,
                       std::deque<detail::UniqueFd>& fds, const detail::Deadline& deadline) override;
  void release() noexcept override;
  void acknowledge(std::uint64_t sequence) override;
  void close() noexcept override;
  std::vector<int> descriptors() const override { return end_.descriptors(); }
  /// True when the writer published bytes not yet consumed (a frame is written into the
  /// ring whole, so read() then returns without waiting), or this end was closed. There
  /// is no descriptor that wakes on data: a Selector sleeps on the ring's reader_sleeping
  /// word instead (capabilities().data_futex; readiness_fd is the companion socket, which
  /// reports the writer's hang-up).
  bool has_buffered_frame() const override;

 private:
  // read_view() without the frame's fds.
  ReadStatus read_frame(detail::FrameHeader& header, std::span<const std::byte>& payload,
                        std::vector<std::byte>& buffer, const detail::Deadline& deadline);
  // Bytes published and not yet consumed; throws ProtocolError when the shared tail
  // breaks the ring's invariant.
  std::uint64_t available();
  // Takes up to `count` available bytes into the frame being assembled and publishes the
  // new head; returns true when the frame is complete.
  bool consume(std::uint64_t count);
  // Publishes head_ and wakes the writer if it waits for room.
  void publish_head() noexcept;
  // Pays the wake-up check that release() left owed, if any (see release()).
  void settle_head() const noexcept;
  // At a frame boundary with `count` bytes available: skips the gap that starts there, if
  // one does (true); ProtocolError when its record is impossible.
  bool skip_gap(std::uint64_t count);

  detail::RingEnd end_;
  FrameLimits limits_;
  std::uint64_t head_ = 0;  // bytes consumed (private: the shared copy is never read back)
  std::uint64_t held_ = 0;  // bytes of a frame viewed in place, given back by release()
  // The frame viewed in place was all the ring held and is small (ring_unfenced_release_limit):
  // release() publishes it without the fence.
  bool held_alone_ = false;
  mutable bool wake_owed_ = false;  // release() published without the fence; settle_head() pays
  bool peer_closed_ = false;
  detail::FrameHeader frame_header_{};
  std::size_t header_filled_ = 0;
  std::vector<std::byte> frame_payload_;
  std::size_t payload_filled_ = 0;
};

/// Creates a ring of ring_capacity_for(`capacity`) bytes and its two ends.
std::pair<std::unique_ptr<detail::FrameWriter>, std::unique_ptr<detail::FrameReader>> make_ring_transport(
    std::size_t capacity, const RingTiming& timing, const FrameLimits& limits);

}  // namespace ferry
