// The sending side of one connection: turns a message into a frame, and remembers which
// segments and storages the receiver holds, so that a segment is passed (fd, mmap) once,
// a new storage in it travels as (segment slot, offset, size), and a storage sent again
// travels as its slot alone. The receiver leases what a frame introduces until a later
// frame releases it; every storage passed stays pinned (SendingHolds) until the receiver
// gives its slot back. CUDA storages take slots too but are never pinned: their records
// and holds are the connection's CudaRecordWriter's (cuda_records.hpp). The protocol and its
// reasons: docs/design/leases-and-returns.md.
#pragma once

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ferry/detail/archive.hpp"
#include "ferry/detail/connection_state.hpp"
#include "ferry/detail/erased_body.hpp"
#include "ferry/detail/frame.hpp"
#include "ferry/detail/type_name.hpp"
#include "ferry/detail/unique_fd.hpp"
#include "ferry/shared_allocator.hpp"
#include "ferry/storage.hpp"
#include "ferry/tensor_wire.hpp"

namespace ferry::detail {

/// A frame ready for a transport: byte parts in order and the fds to pass with it.
struct EncodedFrame {
  /// Header, type name, four tables, CUDA records, body, borrowed body (FrameBody).
  std::array<iovec, 9> parts{};
  std::size_t part_count = 0;
  std::span<const int> fds;
  /// HandlePassing::Copying: the bytes of each Copied storage, in handle-table order, read
  /// in place; valid until the next encode call.
  std::span<const iovec> copies;
  /// HandlePassing::Copying: the storages `copies` read (a transport that reads them after
  /// write() returned keeps them alive).
  std::span<const std::shared_ptr<Storage>> copy_owners;
  std::uint64_t sequence = 0;
  std::size_t bytes = 0;
  std::span<const iovec> iovecs() const { return {parts.data(), part_count}; }
};

/// How segments reach the receiver on this connection.
enum class HandlePassing {
  FdPassing,  ///< memfds travel with the frame (SCM_RIGHTS over a Unix socket)
  ProcFd,     ///< the receiver opens /proc/<sender pid>/fd/<n>; needs acknowledgements
  /// ProcFd while peers of the same user may take this process's fds
  /// (fds_takeable_by_peers(), asked once per frame that introduces segments), FdPassing
  /// otherwise: the transport passes fds on a side socket (FrameWriter::can_pass_fds()).
  ProcFdWhileTakeable,
  /// No shared memory between the ends (another host): every storage is a Copied entry
  /// whose bytes the transport carries (EncodedFrame::copies); no leases, pins or segments.
  Copying,
};

class MessageEncoder {
 public:
  /// `pool`: when set, only segments of this pool are passed (isolation): a storage from
  /// anywhere else is copied into a block of the pool for each send.
  explicit MessageEncoder(HandlePassing passing, std::optional<SharedAllocator> pool = std::nullopt);
  ~MessageEncoder();
  MessageEncoder(const MessageEncoder&) = delete;
  MessageEncoder& operator=(const MessageEncoder&) = delete;

  /// Sends at most `bytes` of the message type's name (FrameLimits::max_type_name_bytes,
  /// 4096 unless set): a longer name is truncated and flagged (kFrameTypeNameTruncated),
  /// never refused; the fingerprint is always of the full name.
  void limit_type_name(std::size_t bytes) noexcept { max_type_name_bytes_ = bytes; }
  /// Lets a frame end with a large byte message's elements where the message holds them,
  /// written from there instead of copied into the body (FrameBody::allow_borrowing): for
  /// a caller that writes each frame before the message can change or die.
  void borrow_message_bytes(bool allowed) noexcept { body_.allow_borrowing(allowed); }

  /// Encodes `message` into a frame. The frame stays valid until the next encode call (and,
  /// after borrow_message_bytes(true), while `message` lives unchanged).
  /// Call commit() once the transport sent it, or rollback() if it was not sent. `space`
  /// (may be null): where the transport lends memory for a large body (FrameBody); the
  /// frame's last part then lies there.
  template <class T>
  const EncodedFrame& encode(const T& message, BodySpace* space = nullptr) {
    return encode(&message, sent_type<T>, space);
  }
  /// encode(), for the message at `message` of type `type` (compiled once, here).
  const EncodedFrame& encode(const void* message, const SentType& type, BodySpace* space = nullptr);
  /// Encodes the end-of-stream frame.
  const EncodedFrame& encode_close();
  /// The header of the frame last encoded (its counts, for a check against FrameLimits).
  const FrameHeader& header() const noexcept { return header_; }
  void commit();
  void rollback();

  /// Adds `storage` to the frame being encoded (once per storage); returns its index in
  /// the frame's handle table. Heap storages are moved into shared memory first.
  std::uint32_t add_storage(const std::shared_ptr<Storage>& storage) {
    // Inline: views of one storage (Tensor::unbind) follow each other in a message.
    if (!sources_.empty() && sources_.back() == storage.get()) return static_cast<std::uint32_t>(sources_.size() - 1);
    return add_other_storage(storage);
  }

  /// The receiver has mapped the segments of every frame up to `sequence` (ProcFd only).
  void acknowledge(std::uint64_t sequence);
  /// The last frame the receiver resolved, as the return board tells (0: none, or no
  /// board yet). A frame is resolved after its segments were opened: it acknowledges them
  /// without a system call on either side.
  std::uint64_t resolved_on_board() const noexcept { return connection_.holds.resolved(); }
  /// Before blocking on the transport for acknowledgements: asks the receiver to
  /// acknowledge there too from now on (ReturnBoard::request_acknowledgements()); returns
  /// the last frame resolved, read after asking.
  std::uint64_t request_acknowledgements() noexcept { return connection_.holds.request_acknowledgements(); }
  /// See ReturnBoard::request_delivery_wake() (nullopt before the board exists).
  std::optional<ReturnBoard::DeliveryWake> request_delivery_wake(std::uint64_t sequence) noexcept {
    return connection_.holds.request_delivery_wake(sequence);
  }
  void cancel_delivery_wake() noexcept { connection_.holds.cancel_delivery_wake(); }
  /// The board whose resolved word counts this connection's deliveries (after
  /// track_delivery() and the first message frame); null before, and for a connection
  /// that copies its storages (its transport reports deliveries itself).
  std::shared_ptr<const ReturnBoard> delivery_board() const noexcept {
    return connection_.delivery_tracked && passing_ != HandlePassing::Copying ? connection_.holds.shared_board()
                                                                              : nullptr;
  }
  /// Whether delivery_board() would give a board (without copying its pointer).
  bool has_delivery_board() const noexcept {
    return connection_.delivery_tracked && passing_ != HandlePassing::Copying && connection_.holds.board() != nullptr;
  }
  /// Asks for delivery acknowledgements: the next frame carries the connection's return
  /// board even when it names no storage, so that the receiver can record on the board
  /// every frame it delivers (MessageDecoder::mark_delivered()), not only those with new
  /// blocks. Idempotent.
  void track_delivery();
  /// The sequence of the last frame committed (0: none yet); frames count from 1.
  std::uint64_t last_sequence() const noexcept { return sequence() - 1; }

  // For another thread (introspection), without the encoder's owner's lock: these read only
  // what the encoding thread publishes for them, and cost it nothing per frame.
  /// Frames committed so far, the end-of-stream frame included (last_sequence()).
  std::uint64_t frames_committed() const noexcept {
    return connection_.next_sequence.load(std::memory_order_acquire) - 1;
  }
  /// delivery_board(), published as it appears (after track_delivery() and the board's
  /// creation, in either order); null before, and for a connection that copies its
  /// storages. Kept once published, the connection closed too.
  std::shared_ptr<const ReturnBoard> published_delivery_board() const noexcept {
    return board_published_.load(std::memory_order_acquire) ? published_board_ : nullptr;
  }
  /// The first frame the receiver records as delivered on the board (the first after
  /// track_delivery()): the board says nothing of the frames before it. Read after
  /// published_delivery_board() gave a board.
  std::uint64_t delivery_tracked_from() const noexcept { return tracked_from_; }
  /// True while segments (or upstream return boards) are kept open for frames the receiver
  /// has not acknowledged.
  bool awaiting_acknowledgement() const noexcept { return connection_.holds.awaiting_acknowledgement(); }
  /// Segments (upstream return boards too) kept open until the receiver acknowledges their
  /// frames (for tests and statistics).
  std::size_t segments_awaiting_acknowledgement() const noexcept {
    return connection_.holds.kept_for_acknowledgement();
  }
  /// The newest sequence whose acknowledgement is awaited (0: none).
  std::uint64_t newest_awaited_sequence() const noexcept { return connection_.holds.newest_awaited_sequence(); }
  /// Storages the receiver currently leases from this sender, as far as it knows.
  std::size_t tracked_storages() const noexcept { return connection_.storage_slots.live().size(); }
  /// Storages passed so far as new ones (a NewBlock entry, or a CudaIpc entry that took a
  /// new slot), not as leases of storages the receiver holds.
  std::uint64_t storages_passed() const noexcept { return connection_.storages_passed; }
  /// Segments the receiver currently leases from this sender, as far as it knows.
  std::size_t tracked_segments() const noexcept { return connection_.segment_slots.live().size(); }
  /// Storages pinned because the receiver may still hold them.
  std::size_t pinned_storages() const { return connection_.holds.pinned(); }

  /// Registers `process` as a holder of what this encoder sent, as the receiver does when
  /// it resolves its first frame: for a frame handed to a process that the sender starts
  /// itself (spawn), so that the frame's blocks are unpinned once that process exited even
  /// if it died before it read the frame. No-op before the first storage was sent.
  void add_holder(const ProcessIdentity& process);
  /// The receiving end is gone (a write failed): frames it did not resolve never will be.
  void receiver_gone();
  /// The channel closed. `probe` (may be empty) polls POLLERR/POLLHUP once the receiving
  /// end is gone (and with `probe_by_send`, see HoldLedger::channel_closed, fails a
  /// zero-length send); the pins outlive the encoder until the receiver gives them back or exits.
  /// `exit_linger`: how long this process's exit waits, at most, for the receiver to open
  /// what is still kept for unacknowledged frames (see HoldLedger::keep_until_resolved()).
  void closed(UniqueFd probe, bool probe_by_send = false,
              std::chrono::milliseconds exit_linger = std::chrono::milliseconds::zero());
  /// This process lets go of a connection that a forked process took over (adopt()): what
  /// it sent stays pinned until every receiving process exited, and the receiver's returns
  /// are left to the other process. Call closed() after it.
  void hand_over();
  /// In a forked process that took the connection over (a used Sender handed to a worker):
  /// the hold ledger becomes this process's, so that what the receiver gives back returns
  /// to this process's allocator.
  void adopt();

 private:
  using LeasedStorage = SendingConnection::LeasedStorage;
  using LeasedSegment = SendingConnection::LeasedSegment;
  void begin();
  // add_storage() of a storage other than the last one added.
  std::uint32_t add_other_storage(const std::shared_ptr<Storage>& storage);
  // A copy of a CUDA storage's bytes in shared CPU memory (Copying: no CUDA transport).
  static std::shared_ptr<Storage> staged_on_host(const std::shared_ptr<Storage>& device_storage);
  // The archive of the frame: the last frame's while it is reusable(), a new one otherwise.
  FrameOutputArchive& output_archive() {
    if (!archive_) archive_ = std::make_unique<FrameOutputArchive>(body_, *this);
    return *archive_;
  }
  const EncodedFrame& finish(FrameKind kind, std::uint64_t fingerprint, std::string_view name);
  // The steps of finish(), in order.
  void refresh_leased_storages();
  void fill_handle_table();
  void fill_new_block_entry(const std::shared_ptr<Storage>& storage, HandleEntry& entry);
  void pin_new_storages(FrameKind kind);
  // commit(): the releases the frame announced.
  void commit_releases();
  void fill_header(FrameKind kind, std::uint64_t fingerprint, std::string_view name, std::size_t cuda_bytes);
  const EncodedFrame& assemble_frame(std::span<const std::byte> cuda_records);
  std::uint32_t append_storage(std::shared_ptr<Storage> travelling, const Storage* source);

  // CUDA storages: the frame carries the hold-counter board of each ahead of it, and its
  // entry a slot like any storage's; the records are the CUDA strategy's (connection_.cuda).
  std::uint32_t add_cuda_storage(const std::shared_ptr<Storage>& storage);
  HandleEntry cuda_entry(const std::shared_ptr<Storage>& storage);

  // A new storage slot for `storage`; `returned`: the receiver gives it back on the return
  // board (false for CUDA storages, whose hold counter is the hold).
  std::uint32_t lease_storage(const std::shared_ptr<Storage>& storage, bool returned);
  // Frees a storage slot (given back, or its frame not sent).
  void free_storage_slot(std::uint32_t slot);
  void collect_returned_slots();
  void collect_dead_storages();
  void collect_dead_segments();
  std::uint32_t segment_slot_for(const std::shared_ptr<SharedSegment>& segment);
  std::uint32_t lease_segment(const std::shared_ptr<SharedSegment>& segment);
  void pass_upstream_boards(const SharedBlock& block);
  void retire_dead_upstream_boards();
  // Adds a segment entry for the frame; true when it names the fd by /proc (the segment
  // must stay open until the receiver acknowledges the frame), false when the fd travels.
  bool add_segment_entry(SegmentRole role, std::uint32_t slot_or_reclaims, int fd, std::size_t size,
                         const FileIdentity& identity);
  // Whether the frame being encoded passes segment fds instead of naming them by /proc.
  bool passes_fd_now();
  std::optional<std::uint32_t> find_source(const Storage* storage);
  void index_source(const Storage* storage, std::uint32_t index);
  void place_source(const Storage* storage, std::uint32_t index);
  void flush_remember_batch();

  // The sequence number of the frame being encoded.
  std::uint64_t sequence() const noexcept { return connection_.next_sequence.load(std::memory_order_relaxed); }
  // Publishes delivery_board() for published_delivery_board(), once, when it exists.
  void publish_delivery_board();

  HandlePassing passing_;
  std::optional<bool> takeable_this_frame_;  // ProcFdWhileTakeable: asked this frame
  std::optional<SharedAllocator> pool_;
  std::size_t max_type_name_bytes_ = FrameLimits{}.max_type_name_bytes;

  // What this end keeps from frame to frame: the leases, the return path, the CUDA
  // strategy, the sequence (connection_state.hpp). The rest is the frame and scratch space.
  SendingConnection connection_;
  // published_delivery_board() and delivery_tracked_from(): written once by the encoding
  // thread, then board_published_ set (release); read only after board_published_ (acquire).
  // A closed connection drops its ledger and board; this reference keeps the board's mapping
  // (its fd is closed by then) until the encoder goes, so that a closed end still tells
  // what it sent that was not delivered.
  std::shared_ptr<const ReturnBoard> published_board_;
  std::uint64_t tracked_from_ = 0;
  std::atomic<bool> board_published_{false};
  std::vector<std::uint32_t> returned_scratch_;
  std::vector<std::shared_ptr<ReturnBoard>> upstream_scratch_;  // boards the frame passes
  std::vector<FileIdentity> retired_scratch_;                   // boards the frame retires

  // The frame being encoded.
  FrameHeader header_;
  std::string_view type_name_;
  FrameBody body_;
  std::unique_ptr<FrameOutputArchive> archive_;     // writes into body_; kept while reusable()
  std::vector<std::shared_ptr<Storage>> storages_;  // what travels (a copy, for isolation)
  std::vector<const Storage*> sources_;             // what the message named, by index
  // Open-addressing index of sources_ (pointer -> table index), for frames with many
  // storages; slots hold index + 1, 0 is empty.
  std::vector<std::pair<const Storage*, std::uint32_t>> source_index_;
  std::vector<std::uint32_t> source_index_used_;                 // entries of source_index_ this frame filled
  std::vector<const std::shared_ptr<Storage>*> remember_batch_;  // new storages (in storages_) of one segment
  std::vector<SegmentEntry> segment_entries_;
  std::vector<HandleEntry> entries_;
  std::vector<std::uint32_t> leased_slots_;  // by table index: the slot of a leased storage, or ~0
  std::vector<int> fds_;
  std::vector<iovec> copies_;  // HandlePassing::Copying: the bytes of each storage
  std::vector<std::uint32_t> new_slots_;
  std::vector<std::uint64_t> new_segment_ids_;
  std::vector<HoldLedger::Pin> new_pins_;
  // The frame being encoded (or the last one) filled the tables below the header: begin()
  // empties them. A frame without storages or segment entries leaves them empty.
  bool tables_filled_ = false;
  bool board_in_frame_ = false;
  std::span<const std::uint32_t> announced_releases_;          // storage slots the frame releases
  std::span<const std::uint32_t> announced_segment_releases_;  // segment slots the frame releases
  EncodedFrame frame_;
};

}  // namespace ferry::detail
