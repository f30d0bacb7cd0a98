// Transports: the byte-moving layer under typed channels. A transport moves whole frames
// (and, where it can, file descriptors) from one FrameWriter to one FrameReader.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/channel_options.hpp"
#include "ferry/detail/deadline.hpp"
#include "ferry/detail/frame.hpp"
#include "ferry/detail/frame_body.hpp"
#include "ferry/detail/pending_body.hpp"
#include "ferry/detail/unique_fd.hpp"
#include "ferry/storage.hpp"

namespace ferry::detail {

struct EndStats;

/// Whom a transport end's waits (for room, for a frame, for an acknowledgement) are charged
/// to as blocked time (BlockedSpan, end_stats.hpp): the counters of the channel end that
/// owns it, which sets them once as it takes the transport end over; none before. A
/// wrapper around another transport end passes them on.
class ChargesWaits {
 public:
  virtual void charge_waits_to(EndStats* stats) noexcept { waits_charged_to_ = stats; }
  EndStats* waits_charged_to() const noexcept { return waits_charged_to_; }

 protected:
  ChargesWaits() = default;
  ~ChargesWaits() = default;

 private:
  EndStats* waits_charged_to_ = nullptr;
};

/// What one end of a transport can do, and where a reading end is watched: plain data
/// that the transport fills in once, when it makes the end, and that the channel core reads
/// (it never changes afterwards; the descriptor and the futex word are the end's, valid
/// until its close()). The virtual functions of FrameWriter and FrameReader are the
/// operations only.
struct TransportCapabilities {
  // ---- a writing end ----
  /// memfds travel with frames by default (else the receiver opens /proc/<pid>/fd/<n>).
  bool passes_fds = false;
  /// fds given to write() reach the reader all the same, on a side socket next to the
  /// frames (a pipe, a ring; see SegmentFdChannel), or with them (passes_fds). The encoder
  /// of such a transport passes a segment's fd instead of naming it by /proc while peers
  /// may not take this process's fds (HandlePassing::ProcFdWhileTakeable).
  bool can_pass_fds = false;
  /// No shared memory between the ends (UCX): tensors travel as their bytes
  /// (HandlePassing::Copying), which FrameWriter::write_copies() sends.
  bool carries_copies = false;
  /// A zero-length send on FrameWriter::liveness_probe() failing with EPIPE also means the
  /// reader is gone (a duplex socket whose reader may shut its direction down), until this
  /// end shuts its own direction down (FrameWriter::shut_down()); the probe is polled only
  /// from then on.
  bool probe_by_send = false;
  // ---- either end ----
  /// This end's connection also carries the opposite direction (one socket for both
  /// directions of a duplex connection, make_duplex_transport()).
  bool shares_connection = false;
  // ---- a reading end (see FrameReader's readiness) ----
  /// A descriptor that poll(POLLIN) reports ready when more of the stream (or the peer's
  /// hang-up) arrived; -1 when the transport has none, in which case a Selector re-checks
  /// FrameReader::has_buffered_frame() at short intervals.
  int readiness_fd = -1;
  /// False when readiness_fd reports only the peer's hang-up, not arriving data: a
  /// Selector then sleeps on data_futex if there is one, and otherwise re-checks
  /// has_buffered_frame() at short intervals.
  bool readiness_fd_reports_data = true;
  /// readiness_fd also wakes for events that bring no frame (a UCX worker's wake-up fd:
  /// connection upkeep, a part of a message): a Selector then asks has_buffered_frame()
  /// before it reports the reader ready.
  bool readiness_fd_is_a_hint = false;
  /// A futex word that the writer wakes after it published data while the word holds 1 (a
  /// sleeping reader, see ring_layout.hpp); null when the transport has none. A waiter
  /// stores 1, re-checks has_buffered_frame(), sleeps while the word holds 1, and stores 0
  /// once awake.
  std::atomic<std::uint32_t>* data_futex = nullptr;
  /// Where a transport that carries copies (carries_copies on its writing end) puts the
  /// storages that arrived for the Copied entries of the frame last read, in table order;
  /// the decoder takes them. Null for the others.
  std::deque<std::shared_ptr<Storage>>* copied_storages = nullptr;
};

/// The sending half of a transport.
class FrameWriter : public ChargesWaits {
 public:
  explicit FrameWriter(const TransportCapabilities& capabilities) noexcept : capabilities_(capabilities) {}
  virtual ~FrameWriter() = default;
  FrameWriter(const FrameWriter&) = delete;
  FrameWriter& operator=(const FrameWriter&) = delete;
  /// What this end can do (fixed when it was made).
  const TransportCapabilities& capabilities() const noexcept { return capabilities_; }
  /// Writes one frame followed by the bytes of its Copied storages (`copies`, read in
  /// place, in table order; `owners` are the storages, which the transport keeps until
  /// it no longer reads them), like write(). Only a transport that carries_copies.
  virtual bool write_copies(std::span<const iovec> parts, std::span<const iovec> /*copies*/,
                            std::span<const std::shared_ptr<Storage>> /*owners*/, const Deadline& deadline) {
    return write(parts, {}, deadline);
  }
  /// Memory this transport lends for the body of the frame about to be encoded for a
  /// write with `deadline` (see BodySpace), or null when it lends none (the default). A
  /// frame whose last part lies in it is then written around it, without copying it.
  virtual BodySpace* body_space(const Deadline& /*deadline*/) { return nullptr; }
  /// Writes one whole frame. Returns false when `deadline` passed before the first byte
  /// went out; once a frame is started it is finished. Throws ChannelClosed when the
  /// receiving end is gone.
  virtual bool write(std::span<const iovec> parts, std::span<const int> fds, const Deadline& deadline) = 0;
  /// The highest sequence the reader acknowledged so far, as far as this end knows
  /// without a system call (0: none). Readers acknowledge on the transport only frames
  /// they could not record on the connection's return board, and every frame once the
  /// sender asked for it (SenderCore::close); the board is where a sender looks first.
  virtual std::uint64_t acknowledged() { return 0; }
  /// Waits until the reader acknowledged `sequence`; false when the deadline passed or
  /// the reader is gone. Transports that pass fds need no acknowledgements: true at once.
  virtual bool wait_acknowledged(std::uint64_t /*sequence*/, const Deadline& /*deadline*/) { return true; }
  /// The highest sequence the reader reported delivered (returned by recv()) on this
  /// transport, for a transport without a return board (UCX; see
  /// FrameReader::frame_delivered()); 0 for the others, whose board says it.
  virtual std::uint64_t delivered_by_reader() { return 0; }
  /// Finishes frames accepted by timed writes but not fully written yet; false if the
  /// deadline passed first.
  virtual bool flush(const Deadline& /*deadline*/) { return true; }
  /// Releases this process's resources of the transport (fds, mappings).
  virtual void close() noexcept = 0;
  /// Ends this direction for every process that holds the end, before close(), when no
  /// end-of-stream frame went out (a failed close, an end dropped by an exception): the
  /// reader sees the stream end (PeerDied) although something else still holds the
  /// connection open (a duplex socket's other direction, the liveness probe the hold
  /// ledger keeps, a forked copy). Sockets shut their sending side down, the ring its
  /// companion socket; a pipe needs nothing (its probe is not the data pipe). Afterwards
  /// the probe is polled only (whatever capabilities().probe_by_send says).
  virtual void shut_down() noexcept {}
  /// The descriptors of this end, for handing it to an exec'd process (may be empty).
  virtual std::vector<int> descriptors() const { return {}; }
  /// A new descriptor that tells when the reading end is gone (closed in every process, or
  /// shut down): poll() reports POLLERR or POLLHUP, or, with capabilities().probe_by_send,
  /// a zero-length send fails with EPIPE. Empty when the transport cannot tell. A closed
  /// channel keeps it while frames it sent are unresolved, to unpin their memory if nobody
  /// will ever read them; it must not keep the stream open for the reader.
  virtual UniqueFd liveness_probe() const { return UniqueFd(); }

 private:
  TransportCapabilities capabilities_;
};

/// The receiving half of a transport.
class FrameReader : public ChargesWaits {
 public:
  explicit FrameReader(const TransportCapabilities& capabilities) noexcept : capabilities_(capabilities) {}
  virtual ~FrameReader() = default;
  FrameReader(const FrameReader&) = delete;
  FrameReader& operator=(const FrameReader&) = delete;
  /// What this end can do (fixed when it was made).
  const TransportCapabilities& capabilities() const noexcept { return capabilities_; }
  /// Reads one frame into `header` and `payload` (everything after the header) and
  /// appends the fds that arrived to `fds`. Waits for the start of a frame until
  /// `deadline`. Throws PeerDied when the peer vanished without closing, ProtocolError
  /// when the bytes are not a valid frame.
  virtual ReadStatus read(FrameHeader& header, std::vector<std::byte>& payload, std::deque<UniqueFd>& fds,
                          const Deadline& deadline) = 0;
  /// Like read(), but a transport whose frames lie in memory it maps (the ring) may leave
  /// the payload there: `payload` then views that memory, which the writer does not reuse
  /// until release() is called. Otherwise the payload is read into `buffer` and viewed
  /// there. Call release() when done with the payload, before the next read.
  virtual ReadStatus read_view(FrameHeader& header, std::span<const std::byte>& payload, std::vector<std::byte>& buffer,
                               std::deque<UniqueFd>& fds, const Deadline& deadline) {
    const ReadStatus status = read(header, buffer, fds, deadline);
    payload = buffer;
    return status;
  }
  /// The end of the body of the frame last returned by read_view() that is still in the
  /// transport, read by the decoder as it gets there (a stream reader's large message: see
  /// StreamFrameReader); null when the payload is whole. Valid until release().
  virtual PendingBody* pending_body() noexcept { return nullptr; }
  /// Gives the memory of the frame last returned by read_view() back to the writer.
  virtual void release() noexcept {}
  /// Tells the writer that every frame up to `sequence` has been resolved (called only
  /// when the decoder asks for it: MessageDecoder::wants_acknowledgement()).
  virtual void acknowledge(std::uint64_t /*sequence*/) {}
  /// recv() returned the frame of `sequence`, whose sender tracks its delivery: a transport
  /// without a return board (UCX) tells the writer (FrameWriter::delivered_by_reader());
  /// the others need nothing (the decoder marked it on the board).
  virtual void frame_delivered(std::uint64_t /*sequence*/) {}
  virtual void close() noexcept = 0;
  /// Refuses everything the writer sends from now on, in every process that holds this
  /// end, before close(): the writer's next write raises ChannelClosed. Only an end that
  /// shares its connection with a writer of this process needs it (see
  /// FrameWriter::shut_down()).
  virtual void shut_down() noexcept {}
  virtual std::vector<int> descriptors() const { return {}; }

  /// Readiness, for waiting on many readers at once (ferry::Selector). A reader is ready
  /// when read() can return without waiting for the peer to begin a frame: a whole frame
  /// (or the end of the stream) is already held in this process, or
  /// capabilities().readiness_fd polls readable (bytes or a hang-up arrived); a ring's
  /// writer wakes capabilities().data_futex instead.
  ///
  /// True when read() would return at once from what this process already holds: a whole
  /// frame buffered in user space (poll() on the fd cannot see it), or this end closed.
  virtual bool has_buffered_frame() const { return false; }

 private:
  TransportCapabilities capabilities_;
};

/// Creates a connected writer/reader pair of `transport` (Pipe, UnixSocket or ShmRing;
/// InProcess channels carry values, not frames, and are made by channel<T>()).
/// `ring_capacity` and `ring_timing` apply to ShmRing only.
std::pair<std::unique_ptr<FrameWriter>, std::unique_ptr<FrameReader>> make_transport(
    Transport transport, const FrameLimits& limits, std::size_t ring_capacity, const RingTiming& ring_timing = {});

/// The four ends of a duplex connection over `transport`: side A writes what side B reads
/// and the other way round. Over a Unix socket both directions share one socketpair (each
/// side's writer and reader hold the same socket; their close() ends only their own
/// direction through shut_down()); over a pipe or a ring, each direction is a transport of
/// its own, as two make_transport() calls make them.
struct DuplexTransport {
  std::unique_ptr<FrameWriter> a_writer;
  std::unique_ptr<FrameReader> a_reader;
  std::unique_ptr<FrameWriter> b_writer;
  std::unique_ptr<FrameReader> b_reader;
};
DuplexTransport make_duplex_transport(Transport transport, const FrameLimits& limits, std::size_t ring_capacity,
                                      const RingTiming& ring_timing = {});

/// Rebuilds the writer of a `transport` in another process (one started by exec), from
/// the descriptors that FrameWriter::descriptors() listed in the original process, in the
/// same order, now inherited by this one. Takes ownership of `fds`. Throws Error for a
/// transport that cannot cross processes (InProcess) and ProtocolError when `fds` does
/// not fit the transport. A new transport adds its case in transport.cpp.
/// `shares_connection` is the original end's FrameWriter::shares_connection().
std::unique_ptr<FrameWriter> writer_from_descriptors(Transport transport, std::vector<UniqueFd> fds,
                                                     const FrameLimits& limits, std::size_t ring_capacity,
                                                     const RingTiming& ring_timing = {},
                                                     bool shares_connection = false);
/// Rebuilds the reader of a `transport` from inherited descriptors (see writer_from_descriptors).
std::unique_ptr<FrameReader> reader_from_descriptors(Transport transport, std::vector<UniqueFd> fds,
                                                     const FrameLimits& limits, std::size_t ring_capacity,
                                                     const RingTiming& ring_timing = {},
                                                     bool shares_connection = false);

}  // namespace ferry::detail
