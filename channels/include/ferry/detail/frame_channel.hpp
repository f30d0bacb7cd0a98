// The untyped cores of a channel's two ends: a transport plus the connection's encoder or
// decoder state. Sender<T> and Receiver<T> are thin typed wrappers around them.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/channel_options.hpp"
#include "ferry/detail/end_claim.hpp"
#include "ferry/detail/end_stats.hpp"
#include "ferry/detail/erased_body.hpp"
#include "ferry/detail/live_ends.hpp"
#include "ferry/detail/return_board.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/detail/transport.hpp"
#include "ferry/shared_allocator.hpp"
#include "ferry/tensor_wire.hpp"

namespace ferry::detail {

class MessageDecoder;
class MessageEncoder;
class PairPids;
struct EncodedFrame;

/// The sending end of a connection, without its message type.
class SenderCore final : public LiveEnd {
 public:
  /// `pair`: the word that tells which process holds each end, for ends made together
  /// (channel(), duplex()); null for the others.
  SenderCore(std::unique_ptr<FrameWriter> writer, Transport transport, const ChannelOptions& options,
             std::shared_ptr<PairPids> pair = nullptr);
  ~SenderCore();
  SenderCore(const SenderCore&) = delete;
  SenderCore& operator=(const SenderCore&) = delete;

  /// Encodes and writes `message`; false when the deadline passed first.
  template <class T>
  bool send(const T& message, const Deadline& deadline) {
    return send(&message, sent_type<T>, deadline);
  }
  /// send(), for the message at `message` of type `type` (compiled once, in the library).
  bool send(const void* message, const SentType& type, const Deadline& deadline);
  /// send(), for an owner that serializes every use of this end under a lock of its own
  /// (a fan-out, to which the end was handed): the same, without taking the end's lock.
  template <class T>
  bool send_serialized_by_owner(const T& message, const Deadline& deadline) {
    return send_serialized_by_owner(&message, sent_type<T>, deadline);
  }
  bool send_serialized_by_owner(const void* message, const SentType& type, const Deadline& deadline);
  /// Writes the tail of a frame that a timed send accepted but could not finish.
  bool flush(const Deadline& deadline);
  /// Sends the end-of-stream frame and releases the transport.
  void close();
  /// Releases this process's copy of the transport without ending the stream.
  void detach() noexcept;
  /// Makes the calling process the owner: its destructor will close() gracefully.
  void adopt() noexcept;
  /// Releases this process's copy of an end that a forked worker took over (adopt()):
  /// like detach(), and the receiver's returns are left to the worker.
  void hand_over() noexcept;
  /// For an end just described to a process that rebuilds it from duplicates of its
  /// descriptors (pickling): no process holding this copy may use it any more
  /// (EndClaim::mark_handed_away()), and this copy is released as detach() does.
  void hand_away() noexcept;
  /// Whether this process owns the end (its sends go through), or may take it (fresh).
  bool owned_here() const noexcept { return claim_.held() || claim_.fresh_here(); }
  bool is_open() const noexcept { return open_; }
  Transport transport() const noexcept { return transport_; }
  FrameWriter& writer() noexcept { return *writer_; }
  const ChannelOptions& options() const noexcept { return options_; }
  /// True once a frame was (partly) written: the end's protocol state then lives in this
  /// process and it cannot be rebuilt in another one from its descriptors.
  bool used() const noexcept { return used_; }
  /// Asks the receiver to acknowledge every message it delivers, on the connection's
  /// return board (the next frame carries the board if none went yet). Idempotent.
  void track_delivery();
  /// The sequence number of the last message sent (messages count from 1; 0: none).
  std::uint64_t last_sequence();
  /// The receiver's recv() has returned every message up to this sequence number, as far
  /// as the board tells (0: none, or delivery not tracked). Still answers once the end is
  /// closed or the receiver is gone (the last value read before).
  std::uint64_t delivered();
  /// MessageEncoder::delivery_board(): reading its resolved word is delivered() without
  /// the lock, for a fan-out that alone sends on this end.
  std::shared_ptr<const ReturnBoard> delivery_board();
  /// Asks the receiver to ring the board's doorbell once its recv() has returned message
  /// `sequence` (ReturnBoard::request_delivery_wake()); nullopt before the board exists
  /// or once the end is closed. cancel_delivery_wake() withdraws the request.
  std::optional<ReturnBoard::DeliveryWake> request_delivery_wake(std::uint64_t sequence);
  void cancel_delivery_wake();
  /// True when the receiving end is known to be gone (closed in every process that held
  /// it, or its processes died), or this end is closed; one poll() without waiting.
  bool receiver_gone();
  /// Storages the receiver leases from this end (for tests and statistics).
  std::size_t tracked_storages();
  /// Storages passed by fd or /proc path so far (a repeat send of a leased one is not).
  std::uint64_t storages_passed();
  void abandon_in_child() noexcept override;
  void release_if_owned_elsewhere() noexcept override;
  void describe(Snapshot& out) const override;
  void sample_activity(std::int64_t now) noexcept override { stats_.sample_activity(now); }
  /// The end's counters (introspection).
  EndStats& stats() noexcept { return stats_; }
  /// Storages pinned because the receiver may still hold them (for tests and statistics).
  std::size_t pinned_storages();
  /// Segments named by fd number kept open until the receiver has them (for tests and
  /// statistics); collected at each send.
  std::size_t segments_awaiting_acknowledgement();
  /// The pool of an isolated channel (ChannelOptions::pool), or empty.
  const std::optional<SharedAllocator>& pool() const noexcept { return options_.pool; }

 private:
  // Throws ChannelClosed when this end was closed here, EndOwnedElsewhere when another
  // process owns it; takes a fresh end for this process.
  void ensure_usable();
  // detach(), with the lock held.
  void detach_locked() noexcept FERRY_REQUIRES(mutex_);
  // True when the receiving end belongs to this process (pair_pids.hpp): its close() does
  // not wait for acknowledgements the receiver can give only after it returns.
  bool receiver_in_this_process() const noexcept;
  // Throws Error when the frame just encoded breaks the channel's FrameLimits, which the
  // receiver enforces (it shares them): refused here, it is not sent and breaks nothing.
  void check_limits() const FERRY_REQUIRES(mutex_);
  // Lets go of storages whose /proc path the receiver has opened (before encoding, so that
  // their release is announced in this very frame).
  void collect_acknowledgements() FERRY_REQUIRES(mutex_);
  bool write_locked(const EncodedFrame& frame, const Deadline& deadline) FERRY_REQUIRES(mutex_);
  // send(), with the end's lock held (or every use serialized by its owner).
  bool send_locked(const void* message, const SentType& type, const Deadline& deadline) FERRY_REQUIRES(mutex_);
  // Introspection's counters for `frame`, just written (only while introspection is on).
  void count_sent(const EncodedFrame& frame) noexcept FERRY_REQUIRES(mutex_);

  detail::Mutex mutex_;
  std::unique_ptr<FrameWriter> writer_;
  std::unique_ptr<MessageEncoder> encoder_ FERRY_PT_GUARDED_BY(mutex_);  // never null
  Transport transport_;
  ChannelOptions options_;
  EndClaim claim_;                // which process may send (end_claim.hpp)
  std::atomic<bool> open_{true};  // atomic: the long-wait release (live_ends.hpp) clears it from any thread
  bool used_ = false;
  std::uint64_t delivered_ FERRY_GUARDED_BY(mutex_) = 0;  // the board's last word, read before the ledger goes
  UniqueFd gone_probe_ FERRY_GUARDED_BY(mutex_);          // receiver_gone()'s liveness probe, made at its first call
  EndStats stats_;                                        // introspection's counters (end_stats.hpp)
  // The end-of-stream frame's sequence number once it went (0: not yet), for describe():
  // stored before the frame's commit, which publishes it with the frame count.
  std::atomic<std::uint64_t> end_of_stream_sequence_{0};
  std::shared_ptr<PairPids> pair_;  // which process holds each end (pair_pids.hpp); may be null
};

/// The receiving end of a connection, without its message type.
class ReceiverCore final : public LiveEnd {
 public:
  ReceiverCore(std::unique_ptr<FrameReader> reader, Transport transport, std::uint64_t fingerprint,
               std::string_view type_name, const ChannelOptions& options = {},
               std::shared_ptr<PairPids> pair = nullptr);
  ~ReceiverCore();
  ReceiverCore(const ReceiverCore&) = delete;
  ReceiverCore& operator=(const ReceiverCore&) = delete;

  /// Waits for the next message and deserializes it into `out`. Returns Frame, Timeout or
  /// Closed (end of stream). Throws PeerDied, ProtocolError, or another ferry::Error for a
  /// local failure while reading a frame (mapping it, ...); after any error but PeerDied
  /// the channel is broken and every later call throws ProtocolError saying why (the
  /// transport is released at once, so the sender's next sends raise ChannelClosed).
  /// `out` must be default-constructed: the message is read into it.
  template <class T>
  ReadStatus receive(T& out, const Deadline& deadline) {
    return receive(&out, received_type<T>, deadline);
  }
  /// receive(), into `out` (a default-constructed value of `type`; compiled once, in the
  /// library).
  ReadStatus receive(void* out, const ReceivedType& type, const Deadline& deadline);
  /// Closes the end; on a duplex socket also for every other process holding it (the
  /// sender's next send raises ChannelClosed at once).
  void close() noexcept;
  /// Closes this process's copy of the end, which a forked worker took over with what was
  /// received so far: nothing received here is given back to the sender from this process
  /// (see MessageDecoder::hand_over()), and the worker's copy keeps reading.
  void detach() noexcept;
  /// Makes the calling process the owner, whose destructor closes the end for everyone (a
  /// forked child's destructor only lets go of its copy), and registers it as a holder of
  /// what arrived so far (a used end taken over by a forked worker: the sender keeps those
  /// blocks while the worker lives, even once the process that received them exited).
  void adopt() noexcept;
  bool is_open() const noexcept { return open_; }
  Transport transport() const noexcept { return transport_; }
  FrameReader& reader() noexcept { return *reader_; }
  const ChannelOptions& options() const noexcept { return options_; }
  /// True once a read was attempted: buffered bytes and leases then live in this process
  /// and the end cannot be rebuilt in another one from its descriptors.
  bool used() const noexcept { return used_; }
  /// Storages this end leases from the sender (for tests and statistics).
  std::size_t leased();
  /// True when receive() would return at once without waiting for the peer to begin a
  /// frame: a whole frame is buffered, or this end is closed or broken.
  bool has_buffered_frame();
  /// The descriptor to poll for more data (TransportCapabilities::readiness_fd); -1 when
  /// there is none, or the end or its transport is closed.
  int readiness_fd();
  /// False when readiness_fd() tells only of the peer's hang-up (TransportCapabilities::readiness_fd_reports_data).
  bool readiness_fd_reports_data();
  /// True when readiness_fd() may wake without a frame (TransportCapabilities::readiness_fd_is_a_hint).
  bool readiness_fd_is_a_hint();
  /// The word a Selector can sleep on for data (TransportCapabilities::data_futex); nullptr
  /// when there is none, or the end or its transport is closed.
  std::atomic<std::uint32_t>* data_futex();
  void abandon_in_child() noexcept override;
  void release_if_owned_elsewhere() noexcept override;
  void describe(Snapshot& out) const override;
  void sample_activity(std::int64_t now) noexcept override { stats_.sample_activity(now); }
  /// The end's counters (introspection).
  EndStats& stats() noexcept { return stats_; }
  /// See SenderCore::hand_away().
  void hand_away() noexcept;
  /// Segments this end leases from the sender (for tests and statistics).
  std::size_t leased_segments();

 private:
  ReadStatus next_locked(const Deadline& deadline) FERRY_REQUIRES(mutex_);
  // Introspection's counters for the frame just taken, `payload` bytes after its header
  // (only while introspection is on).
  void count_received(std::size_t payload) noexcept FERRY_REQUIRES(mutex_);
  void mark_broken(const std::string& reason) FERRY_REQUIRES(mutex_);
  // The sender died: later receives throw PeerDied(`reason`) without reading on.
  void mark_dead(const std::string& reason) FERRY_REQUIRES(mutex_);
  // Closes the end; `ending_the_stream` also shuts a duplex socket's direction down.
  void close_as(bool ending_the_stream) noexcept;
  void close_locked(bool ending_the_stream) noexcept FERRY_REQUIRES(mutex_);
  // Closes the transport's end (its readiness descriptor and futex word go with it).
  void close_reader() noexcept;
  // After end of stream or close: lets a sender of this process that closed without
  // waiting for its receiver go of what it kept (closed_ledgers_keep_segments()).
  static void let_go_of_kept_segments() noexcept;
  // Whether closing here ends the stream for every process: this process owns the end,
  // or made it and nobody took it yet.
  bool closes_for_everyone() const noexcept { return claim_.held() || claim_.fresh_here(); }

  detail::Mutex mutex_;
  std::unique_ptr<FrameReader> reader_;
  std::unique_ptr<MessageDecoder> decoder_ FERRY_PT_GUARDED_BY(mutex_);  // never null
  Transport transport_;
  ChannelOptions options_;
  EndClaim claim_;                // which process may receive (end_claim.hpp)
  std::atomic<bool> open_{true};  // atomic: the long-wait release (live_ends.hpp) clears it from any thread
  bool reader_open_ = true;       // reader_ not closed yet (a broken end closes it while open_)
  bool used_ = false;
  std::string broken_ FERRY_GUARDED_BY(mutex_);
  std::string dead_ FERRY_GUARDED_BY(mutex_);  // why the peer is known dead (PeerDied is reported again)
  FrameHeader header_ FERRY_GUARDED_BY(mutex_);
  std::vector<std::byte> payload_ FERRY_GUARDED_BY(mutex_);
  std::deque<UniqueFd> fds_ FERRY_GUARDED_BY(mutex_);
  EndStats stats_;                  // introspection's counters (end_stats.hpp)
  std::shared_ptr<PairPids> pair_;  // which process holds each end (pair_pids.hpp); may be null
};

}  // namespace ferry::detail
