#include "ferry/detail/frame_channel.hpp"
#include "ferry/detail/thread_annotations.hpp"

#include "ends/pair_pids.hpp"
#include "ferry/detail/hold_ledger.hpp"
#include "ferry/detail/message_decoder.hpp"
#include "ferry/detail/message_encoder.hpp"
#include "ferry/wait_interruption.hpp"
#include "introspection/describe_end.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <exception>
#include <string>

namespace ferry::detail {

// ---- sender ------------------------------------------------------------------

namespace {

// How the encoder of a writer with `capabilities` hands segments over.
HandlePassing handle_passing(const TransportCapabilities& capabilities) noexcept {
  if (capabilities.carries_copies) return HandlePassing::Copying;
  if (capabilities.passes_fds) return HandlePassing::FdPassing;
  if (capabilities.can_pass_fds) return HandlePassing::ProcFdWhileTakeable;
  return HandlePassing::ProcFd;
}

}  // namespace

SenderCore::SenderCore(std::unique_ptr<FrameWriter> writer, Transport transport, const ChannelOptions& options,
                       std::shared_ptr<PairPids> pair)
    : writer_(std::move(writer)),
      encoder_(std::make_unique<MessageEncoder>(handle_passing(writer_->capabilities()), options.pool)),
      transport_(transport),
      options_(options) {
  encoder_->limit_type_name(options.limits.max_type_name_bytes);
  encoder_->borrow_message_bytes(true);  // every frame is written before send() returns
  // UCX state never crosses fork: a ucx:// end belongs to the process that made it from the
  // start, so a forked child's use is refused (EndOwnedElsewhere) and never takes it over.
  if (transport == Transport::Ucx) claim_.adopt();
  stats_.id = next_end_id();
  writer_->charge_waits_to(&stats_);
  pair_ = std::move(pair);
  track();
}

// From the introspection server's thread: reads only what the encoder publishes for other
// threads (its frame count and its delivery board), never its state under the lock, so that
// a sender blocked inside send() is described as it waits.
void SenderCore::describe(Snapshot& out) const FERRY_NO_THREAD_SAFETY_ANALYSIS {
  constexpr auto relaxed = std::memory_order_relaxed;
  std::optional<std::uint64_t> in_flight;     // known only where the receiver records deliveries on a board
  const MessageEncoder& encoder = *encoder_;  // set once, in the constructor
  if (const std::shared_ptr<const ReturnBoard> board = encoder.published_delivery_board()) {
    // The frame count first: where it counts the end-of-stream frame, its number (stored
    // before that frame's commit) is visible too, and that frame is no message.
    const std::uint64_t frames = encoder.frames_committed();
    const std::uint64_t end_of_stream = end_of_stream_sequence_.load(relaxed);
    const std::uint64_t sent = end_of_stream != 0 && frames >= end_of_stream ? end_of_stream - 1 : frames;
    // Frames sent before deliveries were tracked count as delivered: the board tells
    // nothing of them.
    const std::uint64_t delivered = std::max(board->resolved(), encoder.delivery_tracked_from() - 1);
    in_flight = delivered < sent ? sent - delivered : 0;
  }
  describe_end(
      out, stats_,
      EndFacts{true, transport_, options_.name, open_.load(relaxed), in_flight, pair_ ? pair_->get(false) : 0});
}

// In a forked child, before any other thread of it can use the end: the inherited lock may
// be held by a thread of the parent, which does not exist here.
void SenderCore::adopt() noexcept FERRY_NO_THREAD_SAFETY_ANALYSIS {
  claim_.adopt();
  if (pair_) pair_->set(true, current_process_id());
  try {
    encoder_->adopt();  // a used end taken over by a forked worker: its returns come here
  } catch (...) {
    // Out of memory: the blocks this end sends stay pinned until the receiver exits.
  }
}

void SenderCore::hand_over() noexcept {
  {
    const detail::MutexLock lock(mutex_);
    encoder_->hand_over();
  }
  detach();
}

void SenderCore::hand_away() noexcept {
  claim_.mark_handed_away();
  if (pair_) pair_->set(true, 0);  // the process that rebuilds it is not known here
  detach();
}

bool SenderCore::send(const void* message, const SentType& type, const Deadline& deadline) {
  const detail::MutexLock lock(mutex_);
  return send_locked(message, type, deadline);
}

// The owner's own lock serializes every use (fanout_consumers.hpp), so this end's is not taken.
bool SenderCore::send_serialized_by_owner(const void* message, const SentType& type,
                                          const Deadline& deadline) FERRY_NO_THREAD_SAFETY_ANALYSIS {
  return send_locked(message, type, deadline);
}

// Inlined into the cold tail of send_locked(), which has `this` and the frame at hand.
[[gnu::always_inline]] inline void SenderCore::count_sent(const EncodedFrame& frame) noexcept {
  const MessageEncoder& encoder = *encoder_;
  const FrameHeader& header = encoder.header();
  // In flight needs nothing more here: describe() reads the encoder's frame count and the
  // return board.
  stats_.count(frame.bytes, header.handle_count, header.segment_count);
}

bool SenderCore::send_locked(const void* message, const SentType& type, const Deadline& deadline) {
  if (!open_.load(std::memory_order_relaxed) || !claim_.owned_by_caller()) [[unlikely]]
    ensure_usable();
  collect_acknowledgements();
  const EncodedFrame* frame = nullptr;
  try {
    frame = &encoder_->encode(message, type, writer_->body_space(deadline));
    if (!within_limits(encoder_->header(), options_.limits)) [[unlikely]]
      check_limits();  // out of line: builds the error
  } catch (...) {
    encoder_->rollback();
    throw;
  }
  if (!write_locked(*frame, deadline)) return false;
  // A tail of one load and a branch while introspection is off (the waits learnt whom to
  // charge when the end was made: FrameWriter::charge_waits_to()). In line, like the
  // receiver's: the branch skips the counts, which need no jump back.
  if (introspecting()) count_sent(*frame);
  return true;
}

SenderCore::~SenderCore() {
  const WaitInterruptionSuspended uninterrupted;  // a destructor's close runs to its end
  untrack();
  // Only the owner ends the stream (or the process that made the end, while nobody took
  // it); a copy inherited through fork() lets go of its descriptors and nothing more.
  // Destroyed while an exception unwinds (a failing worker or stage): do not end the stream
  // cleanly, so that the receiver sees the failure (PeerDied) instead of end-of-stream.
  const bool owner = open_ && claim_.take_for_closing(false);
  if (owner && std::uncaught_exceptions() == 0) {
    try {
      close();
    } catch (const Error&) {
      // The receiver is gone; there is nobody left to tell.
    }
  } else if (owner) {
    claim_.mark_closed();
    // End this direction for every process (a socket's or a ring's; a pipe's ends with its
    // last write end), so that the receiver sees the end dropped (PeerDied) now rather than
    // when this process exits: neither the ledger's probe nor a duplex socket's other
    // direction may keep it open.
    writer_->shut_down();
    // No end-of-stream, but what the receiver may still hold stays tracked: the probe tells
    // the ledger when the receiving end is gone, also when it died before reading a frame
    // (polled only: this end shut its direction down).
    try {
      encoder_->closed(writer_->liveness_probe(), false);
    } catch (...) {
      encoder_->closed(UniqueFd());  // no probe (out of fds): the ledger falls back to its own checks
    }
  }
  writer_->close();
}

void SenderCore::ensure_usable() {
  if (!open_) {
    claim_.check_not_elsewhere("Sender");  // a copy let go of because another process owns it
    throw ChannelClosed("cannot send: this Sender was closed");
  }
  claim_.claim_for_use("Sender");
  if (pair_) pair_->set(true, current_process_id());  // taken by this process (its first use here)
}

void SenderCore::check_limits() const {
  const auto breach = find_limit_breach(encoder_->header(), options_.limits);
  if (!breach) return;
  using Limit = LimitBreach::Limit;
  const char* needs = "";
  const char* advice = "raise the limit";
  switch (breach->limit_kind) {
    case Limit::Releases: return;  // the connection's own bookkeeping, not something the message decided
    case Limit::Handles:
      needs = "tensor storages";
      advice =
          "send fewer storages per message (views of one storage count once, e.g. the rows of one tensor "
          "from Tensor::unbind()) or raise the limit";
      break;
    case Limit::Segments:
      needs = "shared-memory segments";
      advice = "send fewer new tensors per message or raise the limit";
      break;
    case Limit::Fds:
      needs = "file descriptors";
      advice = "send fewer new tensors per message or raise FrameLimits::max_fds";
      break;
    case Limit::BodyBytes:
      needs = "bytes of serialized body";
      advice = "put large data into tensors, which travel as handles, or raise the limit";
      break;
    case Limit::TypeNameBytes: needs = "bytes of type name"; break;
  }
  throw Error("cannot send: this message needs " + std::to_string(breach->value) + " " + needs +
              " in one frame, above the channel's limit of " + std::to_string(breach->limit) +
              " (ChannelOptions::limits." + breach->setting + ", which the receiver enforces); " + advice +
              ". Nothing was sent");
}

void SenderCore::collect_acknowledgements() {
  // The return board's resolved frame, no system call; the transport's own acknowledgements
  // (a word of the ring, what the pipe delivered to an earlier wait) come for free as well.
  if (encoder_->awaiting_acknowledgement()) {
    encoder_->acknowledge(std::max(encoder_->resolved_on_board(), writer_->acknowledged()));
  }
}

bool SenderCore::write_locked(const EncodedFrame& frame, const Deadline& deadline) {
  used_ = true;
  bool written = false;
  try {
    written = !writer_->capabilities().carries_copies
                  ? writer_->write(frame.iovecs(), frame.fds, deadline)
                  : writer_->write_copies(frame.iovecs(), frame.copies, frame.copy_owners, deadline);
  } catch (const ChannelClosed&) {
    encoder_->rollback();
    open_ = false;
    delivered_ = std::max(delivered_, encoder_->resolved_on_board());  // the ledger goes below
    gone_probe_.reset();
    encoder_->receiver_gone();  // frames it did not resolve never will be: unpin them
    encoder_->closed(UniqueFd());
    writer_->close();
    throw;
  } catch (...) {
    encoder_->rollback();
    throw;
  }
  if (!written) {
    encoder_->rollback();
    return false;
  }
  encoder_->commit();
  return true;
}

void SenderCore::close() {
  const detail::MutexLock lock(mutex_);
  if (!open_) return;
  // A copy whose end another process owns (or closed) only lets go of its descriptors: its
  // end of stream would cut the owner's stream short.
  if (!claim_.take_for_closing(true)) {
    detach_locked();
    return;
  }
  claim_.mark_closed();
  open_ = false;
  gone_probe_.reset();
  bool shut_down = false;  // this direction was ended without an end-of-stream frame
  try {
    const Deadline linger = Deadline::after(options_.close_linger);
    writer_->flush(linger);
    const EncodedFrame& frame = encoder_->encode_close();
    // Bounded, like the rest of close(): a receiver that stopped reading (say, blocked on a
    // send to this process) must not keep close() waiting for room for ever. Without the
    // end-of-stream frame it sees the end dropped (PeerDied) after what was sent before.
    if (writer_->write(frame.iovecs(), frame.fds, linger)) {
      end_of_stream_sequence_.store(encoder_->last_sequence() + 1, std::memory_order_relaxed);  // describe()
      encoder_->commit();
    } else {
      encoder_->rollback();
      // No room for the end-of-stream frame: end this direction for every process (a
      // socket's, a ring's), so that the receiver sees PeerDied after what was sent. A
      // sent end-of-stream frame ends it by itself, and the direction stays open for a
      // duplex socket's probe to tell a reader that shut its side down.
      writer_->shut_down();
      shut_down = true;
    }
    // Storages named by /proc path must outlive the receiver's open() of them.
    // The receiver acknowledges on the transport (what wakes a waiting writer) only when
    // asked: ask, look at the board once more, and wait only for what is still missing.
    // A receiver of this process may read only after this close() returned (the same
    // thread's next call): the ledger keeps what it must still open instead, and this
    // process's exit waits for it, for a forked process that took the end over and reads late.
    std::chrono::milliseconds exit_linger = std::chrono::milliseconds::zero();
    if (encoder_->awaiting_acknowledgement()) {
      if (receiver_in_this_process()) {
        encoder_->acknowledge(std::max(encoder_->resolved_on_board(), writer_->acknowledged()));
        exit_linger = options_.close_linger;
      } else {
        const std::uint64_t awaited = encoder_->newest_awaited_sequence();
        encoder_->acknowledge(std::max(encoder_->request_acknowledgements(), writer_->acknowledged()));
        if (encoder_->awaiting_acknowledgement()) writer_->wait_acknowledged(awaited, linger);
      }
    }
    delivered_ = std::max(delivered_, encoder_->resolved_on_board());  // the ledger goes below
    // What the receiver holds stays pinned until it gives it back or exits; the probe
    // tells when the receiving end is gone while frames are still unresolved.
    encoder_->closed(writer_->liveness_probe(), writer_->capabilities().probe_by_send && !shut_down, exit_linger);
  } catch (const ChannelClosed&) {
    // The receiver already left: the stream is over either way.
    delivered_ = std::max(delivered_, encoder_->resolved_on_board());
    encoder_->receiver_gone();
    encoder_->closed(UniqueFd());
  } catch (...) {
    encoder_->closed(UniqueFd());
    writer_->shut_down();
    writer_->close();
    throw;
  }
  writer_->close();
}

// The pair's word names this process as the receiving end's (it made the pair and no other
// process took the receiver over, or this one did): unknown (0) counts as elsewhere.
bool SenderCore::receiver_in_this_process() const noexcept {
  return pair_ && pair_->get(false) == current_process_id();
}

bool SenderCore::flush(const Deadline& deadline) {
  const detail::MutexLock lock(mutex_);
  ensure_usable();
  return writer_->flush(deadline);
}

void SenderCore::track_delivery() {
  const detail::MutexLock lock(mutex_);
  encoder_->track_delivery();
}

std::uint64_t SenderCore::last_sequence() {
  const detail::MutexLock lock(mutex_);
  return encoder_->last_sequence();
}

std::uint64_t SenderCore::delivered() {
  const detail::MutexLock lock(mutex_);
  // The board says it on one host; a transport without one (UCX) reports it itself.
  // Never more than was sent: a lying peer cannot make a fan-out forget messages in flight.
  const std::uint64_t reported = open_ ? std::min(writer_->delivered_by_reader(), encoder_->last_sequence()) : 0;
  delivered_ = std::max({delivered_, encoder_->resolved_on_board(), reported});
  return delivered_;
}

std::shared_ptr<const ReturnBoard> SenderCore::delivery_board() {
  const detail::MutexLock lock(mutex_);
  return encoder_->delivery_board();
}

std::optional<ReturnBoard::DeliveryWake> SenderCore::request_delivery_wake(std::uint64_t sequence) {
  const detail::MutexLock lock(mutex_);
  if (!open_) return std::nullopt;
  return encoder_->request_delivery_wake(sequence);
}

void SenderCore::cancel_delivery_wake() {
  const detail::MutexLock lock(mutex_);
  encoder_->cancel_delivery_wake();
}

bool SenderCore::receiver_gone() {
  const detail::MutexLock lock(mutex_);
  if (!open_) return true;
  if (!gone_probe_) gone_probe_ = writer_->liveness_probe();
  if (!gone_probe_) return false;  // the transport cannot tell (or no fd left): the next send will
  pollfd probe{gone_probe_.get(), 0, 0};
  const int ready = ::poll(&probe, 1, 0);
  if (ready < 0) {
    if (errno == EINTR) return false;
    throw_errno("poll on a channel's liveness probe");
  }
  return ready > 0 && (probe.revents & (POLLHUP | POLLERR)) != 0;
}

void SenderCore::detach() noexcept {
  const detail::MutexLock lock(mutex_);
  detach_locked();
}

void SenderCore::release_if_owned_elsewhere() noexcept {
  // The claim first: an end whose operation this very thread is in is this process's.
  if (!claim_.elsewhere()) return;
  if (!mutex_.try_lock()) return;
  const detail::MutexLock lock(mutex_, std::adopt_lock);
  if (!open_) return;
  detach_locked();
}

void SenderCore::detach_locked() noexcept {
  open_ = false;
  gone_probe_.reset();  // a copy of the connection (a socket's): the peer must see this copy go
  delivered_ = std::max(delivered_, encoder_->resolved_on_board());
  encoder_->closed(UniqueFd());
  writer_->close();
}

// In a forked child, where the inherited lock may be held by a thread of the parent.
void SenderCore::abandon_in_child() noexcept FERRY_NO_THREAD_SAFETY_ANALYSIS {
  open_ = false;
  gone_probe_.reset();
  writer_->close();
}

std::size_t SenderCore::tracked_storages() {
  const detail::MutexLock lock(mutex_);
  return encoder_->tracked_storages();
}

std::uint64_t SenderCore::storages_passed() {
  const detail::MutexLock lock(mutex_);
  return encoder_->storages_passed();
}

std::size_t SenderCore::pinned_storages() {
  const detail::MutexLock lock(mutex_);
  return encoder_->pinned_storages();
}

std::size_t SenderCore::segments_awaiting_acknowledgement() {
  const detail::MutexLock lock(mutex_);
  return encoder_->segments_awaiting_acknowledgement();
}

// ---- receiver ----------------------------------------------------------------

ReceiverCore::ReceiverCore(std::unique_ptr<FrameReader> reader, Transport transport, std::uint64_t fingerprint,
                           std::string_view type_name, const ChannelOptions& options, std::shared_ptr<PairPids> pair)
    : reader_(std::move(reader)),
      decoder_(std::make_unique<MessageDecoder>(fingerprint, type_name)),
      transport_(transport),
      options_(options) {
  if (transport == Transport::Ucx) claim_.adopt();  // as SenderCore's: UCX never crosses fork
  stats_.id = next_end_id();
  stats_.header_bytes = sizeof(FrameHeader);  // counted per message, added when read
  reader_->charge_waits_to(&stats_);
  pair_ = std::move(pair);
  track();
}

void ReceiverCore::describe(Snapshot& out) const {
  describe_end(out, stats_,
               EndFacts{false, transport_, options_.name, open_.load(std::memory_order_relaxed), std::nullopt,
                        pair_ ? pair_->get(true) : 0});
}

ReceiverCore::~ReceiverCore() {
  untrack();
  // Another process's copy (inherited through fork()) only lets go of its descriptors:
  // the owner may still be reading.
  close_as(closes_for_everyone());
}

// In a forked child, before any other thread of it can use the end (see SenderCore::adopt()).
void ReceiverCore::adopt() noexcept FERRY_NO_THREAD_SAFETY_ANALYSIS {
  claim_.adopt();
  if (pair_) pair_->set(false, current_process_id());
  try {
    decoder_->register_as_holder();
  } catch (const std::exception&) {
    // No place on a board, or /proc unreadable: the next read tries again, and throws if
    // it still cannot.
  }
}

ReadStatus ReceiverCore::receive(void* out, const ReceivedType& type, const Deadline& deadline) {
  const detail::MutexLock lock(mutex_);
  const ReadStatus status = next_locked(deadline);
  if (status != ReadStatus::Frame) return status;
  try {
    decoder_->read(out, type);
  } catch (const ProtocolError& error) {
    reader_->release();
    mark_broken(error.what());
    throw;
  } catch (const PeerDied& error) {
    // A pending body whose sender died while it was read: the end is dead from now on,
    // as when decode() found it dead (next_locked()), not only from the next receive.
    reader_->release();
    mark_dead(error.what());
    throw;
  } catch (...) {
    reader_->release();
    throw;
  }
  reader_->release();  // the payload may lie in the transport's memory until decoded
  decoder_->mark_delivered();
  if (const std::uint64_t tracked = decoder_->tracked_sequence()) reader_->frame_delivered(tracked);
  return status;
}

// Inlined into the cold tail of next_locked(), which has `this` and the payload at hand.
[[gnu::always_inline]] inline void ReceiverCore::count_received(std::size_t payload) noexcept {
  // The frame's header is added when the counters are read (EndStats::header_bytes).
  stats_.count(payload, header_.handle_count, header_.segment_count);
}

void ReceiverCore::mark_broken(const std::string& reason) {
  broken_ = reason;
  decoder_->release_all();
  fds_.clear();
  // Nothing will ever read the rest of the stream: let the transport go, so that the
  // sender gets ChannelClosed instead of blocking on a stream that nobody drains.
  reader_->shut_down();
  close_reader();
}

void ReceiverCore::mark_dead(const std::string& reason) {
  // The stream may still hold frames of the dead sender (a decode found it dead): never
  // read them, and let the transport's fds go now.
  dead_ = reason;
  stats_.peer_died.store(true, std::memory_order_relaxed);
  decoder_->release_all();
  fds_.clear();
  close_reader();
}

ReadStatus ReceiverCore::next_locked(const Deadline& deadline) {
  if (!broken_.empty()) {
    throw ProtocolError("this Receiver is broken after an earlier error: " + broken_);
  }
  if (!open_.load(std::memory_order_relaxed) || !claim_.owned_by_caller()) [[unlikely]] {
    if (!open_) {
      claim_.check_not_elsewhere("Receiver");  // a copy let go of because another process owns it
      return ReadStatus::Closed;
    }
    claim_.claim_for_use("Receiver");
    if (pair_) pair_->set(false, current_process_id());  // taken by this process (its first use here)
  }
  used_ = true;
  if (!dead_.empty()) throw PeerDied(dead_);
  try {
    // A forked process that took the end over and could not register when it adopted it
    // (adopt()) refuses to go on holding unprotected blocks; a plain load once registered.
    decoder_->register_as_holder();
    std::span<const std::byte> payload;
    const ReadStatus status = reader_->read_view(header_, payload, payload_, fds_, deadline);
    if (status == ReadStatus::Closed) {
      decoder_->release_all();
      let_go_of_kept_segments();
    }
    if (status != ReadStatus::Frame) return status;
    try {
      decoder_->decode(header_, payload, fds_, reader_->capabilities().copied_storages, reader_->pending_body());
    } catch (...) {
      reader_->release();
      throw;
    }
    if (decoder_->wants_acknowledgement()) reader_->acknowledge(header_.sequence);
    // A tail of one load and a branch while introspection is off (see SenderCore::send_locked).
    // Not marked unlikely: laid out in line, the tail costs no jump back while it counts.
    if (introspecting()) count_received(payload.size());
    return status;
  } catch (const ProtocolError& error) {
    mark_broken(error.what());
    throw;
  } catch (const WaitInterrupted&) {
    throw;  // the thread's check abandoned the wait: the stream is where it was
  } catch (const PeerDied& error) {
    mark_dead(error.what());
    throw;
  } catch (const std::exception& error) {
    // Out of memory for a mapping, a failed system call: the frame is half consumed and
    // half resolved, so the stream cannot be trusted any more either.
    mark_broken(error.what());
    throw;
  }
}

void ReceiverCore::close() noexcept { close_as(closes_for_everyone()); }

void ReceiverCore::hand_away() noexcept {
  claim_.mark_handed_away();
  if (pair_) pair_->set(false, 0);  // the process that rebuilds it is not known here
  detach();
}

void ReceiverCore::release_if_owned_elsewhere() noexcept {
  // The claim first: an end whose operation this very thread is in is this process's.
  if (!claim_.elsewhere()) return;
  if (!mutex_.try_lock()) return;
  const detail::MutexLock lock(mutex_, std::adopt_lock);
  if (!open_) return;
  decoder_->hand_over();
  close_locked(false);
}

void ReceiverCore::detach() noexcept {
  {
    const detail::MutexLock lock(mutex_);
    decoder_->hand_over();
  }
  close_as(false);
}

void ReceiverCore::close_as(bool ending_the_stream) noexcept {
  {
    const detail::MutexLock lock(mutex_);
    close_locked(ending_the_stream);
  }
  let_go_of_kept_segments();
}

void ReceiverCore::close_locked(bool ending_the_stream) noexcept {
  open_ = false;
  decoder_->release_all();
  fds_.clear();
  if (ending_the_stream) reader_->shut_down();
  close_reader();
}

// A sender of this process whose close() did not wait for this end (or any other end of
// this process) kept what the receiver had still to open: once this end read the end of the
// stream or closed, that can go (hold_ledger.hpp). Off the per-message path.
void ReceiverCore::let_go_of_kept_segments() noexcept {
  if (!closed_ledgers_keep_segments()) return;
  try {
    collect_returned_blocks(true);
  } catch (...) {
    // /proc unreadable or out of memory: the next collection (an allocation, trim()) lets go.
  }
}

bool ReceiverCore::has_buffered_frame() {
  const detail::MutexLock lock(mutex_);
  return !open_ || !broken_.empty() || reader_->has_buffered_frame();
}

void ReceiverCore::close_reader() noexcept {
  reader_open_ = false;
  reader_->close();
}

int ReceiverCore::readiness_fd() {
  const detail::MutexLock lock(mutex_);
  return open_ && reader_open_ ? reader_->capabilities().readiness_fd : -1;
}

bool ReceiverCore::readiness_fd_is_a_hint() {
  const detail::MutexLock lock(mutex_);
  return open_ && reader_->capabilities().readiness_fd_is_a_hint;
}

bool ReceiverCore::readiness_fd_reports_data() {
  const detail::MutexLock lock(mutex_);
  return reader_->capabilities().readiness_fd_reports_data;
}

std::atomic<std::uint32_t>* ReceiverCore::data_futex() {
  const detail::MutexLock lock(mutex_);
  return open_ && reader_open_ ? reader_->capabilities().data_futex : nullptr;
}

// In a forked child, where the inherited lock may be held by a thread of the parent.
void ReceiverCore::abandon_in_child() noexcept FERRY_NO_THREAD_SAFETY_ANALYSIS {
  open_ = false;
  fds_.clear();
  close_reader();
}

std::size_t ReceiverCore::leased() {
  const detail::MutexLock lock(mutex_);
  return decoder_->leased();
}

std::size_t ReceiverCore::leased_segments() {
  const detail::MutexLock lock(mutex_);
  return decoder_->leased_segments();
}

}  // namespace ferry::detail
