// One connection's return path, the one interface through which the encoder and decoder
// reach what travels back from the receiver: on the sending side the pins of what the
// receiver may hold (HoldLedger), the slots it gave back, the segments and boards kept open
// until it acknowledges their frames, the frames it resolved or asked to acknowledge, and
// the upstream boards passed with forwarded blocks; on the receiving side the return board
// (returns, resolved and delivered frames, requests for acknowledgements), the upstream
// boards, this process's registration as a holder, and the blocks that give their slots
// back. Neither codec touches a board or a ledger itself. The frame format stays the
// encoder's and decoder's; CUDA storages are held on hold-counter boards by the codec's CUDA
// strategy (cuda_records.hpp). See docs/design/leases-and-returns.md.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "ferry/allocation.hpp"
#include "ferry/detail/hold_ledger.hpp"
#include "ferry/detail/process_identity.hpp"
#include "ferry/detail/return_board.hpp"
#include "ferry/detail/shared_memory.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/detail/unique_fd.hpp"

namespace ferry::detail {

/// Where the blocks received on one connection give their storage slots back: shared by
/// the connection's ReceivingHolds and every block it made, so that hand_over() can silence
/// the blocks that live on in this process.
struct ReturnPath {
  std::shared_ptr<ReturnBoard> board;
  std::atomic<bool> handed_over{false};
  /// Appends `board`, then the upstream boards (see SharedBlock::append_return_boards()).
  void append_boards(std::vector<std::shared_ptr<ReturnBoard>>& out) const;
  /// Adds a board of a connection upstream of this one (this process registered on it).
  void add_upstream(std::shared_ptr<ReturnBoard> upstream_board);
  /// Forgets the upstream board named `identity`; nothing when there is none.
  void retire_upstream(const FileIdentity& identity);
  /// True when `identity` is this connection's board or one of its upstream boards.
  bool knows(const FileIdentity& identity) const;
  /// Keeps this process registered on the board and every upstream board so far for as
  /// long as it lives (see ReturnBoard::keep_registration()).
  void keep_registrations() noexcept;
  /// The upstream boards so far (a copy).
  std::vector<std::shared_ptr<ReturnBoard>> upstream_boards() const;

 private:
  // Boards are added while blocks of the connection, on any thread, read them.
  mutable detail::Mutex mutex_;
  std::vector<std::shared_ptr<ReturnBoard>> upstream_ FERRY_GUARDED_BY(mutex_);
};

/// One connection's holds, receiver side. Not thread-safe (the decoder's); the blocks it
/// makes may die on any thread.
class ReceivingHolds {
 public:
  /// True once the connection's return board arrived.
  bool has_board() const noexcept { return returns_ != nullptr; }
  /// The return board, or null before the frame that carries it.
  ReturnBoard* board() const noexcept { return returns_ ? returns_->board.get() : nullptr; }

  /// The connection's return board arrived. Throws ProtocolError when it is not one.
  void adopt_board(SharedMemory memory);
  /// True when `identity` is the connection's board or an upstream board already known.
  bool knows(const FileIdentity& identity) const { return returns_ && returns_->knows(identity); }
  /// An upstream board arrived as segment `index`, with the reclaim count the forwarder
  /// read (`reclaims_when_forwarded`). A board of this process's own (a block it sent came
  /// back) is kept by its ledger's pins; on any other this process registers as a holder
  /// first. Throws ProtocolError (a count ahead of the board's), PeerDied (the blocks were
  /// reclaimed meanwhile) or TooManyHolders. Needs the connection's board.
  void add_upstream_board(SharedMemory memory, std::uint32_t reclaims_when_forwarded, std::size_t index);
  /// The sender retired the upstream board named `identity` (no block it still forwards
  /// came through it); nothing when none is known.
  void retire_upstream_board(const FileIdentity& identity) { returns_->retire_upstream(identity); }

  /// Registers this process as a holder (once per fork generation), then records that
  /// frames up to `sequence` are resolved. False when the sender abandoned the frame.
  /// Throws TooManyHolders or Error (see register_as_holder()). Needs the board.
  bool claim_frame(std::uint64_t sequence);
  /// See MessageDecoder::register_as_holder(). Inline: every read calls it.
  void register_as_holder() {
    if (returns_ && registered_generation_ != fork_generation()) register_in_this_generation();
  }
  /// Gives `slot` back at once (a new block of a frame that failed before it was leased).
  void give_back(std::uint32_t slot) noexcept {
    if (returns_) returns_->board->post_return(slot);
  }
  /// While the result lives, the slots given back on this thread are posted together
  /// (ReturnBoard::PostBatch); nothing before the board arrived.
  ReturnBoard::PostBatch batch_returns() const noexcept { return ReturnBoard::PostBatch(board()); }
  /// Records that frames up to `sequence` were delivered (their values handed to the
  /// caller); refused, changing nothing, when the sender abandoned them. Nothing before the
  /// board arrived. Inline: every tracked recv() calls it.
  void mark_delivered(std::uint64_t sequence) noexcept {
    if (returns_) (void)returns_->board->claim_resolved(sequence);
  }
  /// True when the sender waits for acknowledgements on the transport
  /// (ReturnBoard::acknowledgements_requested()). Needs the board.
  bool acknowledgements_requested() const noexcept { return returns_->board->acknowledgements_requested(); }

  /// A block received at storage slot `slot`, which gives the slot back when it dies (in
  /// the fork generation and process that received it, unless handed over). `own`: the
  /// pinned allocation of a block of this process's own (see find_own_pinned()), kept alive
  /// with the block.
  std::shared_ptr<SharedBlock> make_block(std::shared_ptr<SharedSegment> segment, std::size_t offset,
                                          std::size_t nbytes, std::uint32_t slot, std::shared_ptr<Allocation> own);
  /// True when some upstream board was one of this process's own connections.
  bool has_own_upstream() const noexcept { return !own_upstream_ledgers_.empty(); }
  /// The pin of a block this process sent that came back through forwarders after its
  /// Storage died here, or null (every holder of its connection exited: reclaimed).
  std::shared_ptr<Allocation> find_own_pinned(const SharedSegment* segment, std::size_t offset) const;

  /// Drops the boards: no frame comes any more (blocks alive keep theirs).
  void reset() noexcept;
  /// A forked process takes the connection over: no block received so far gives its slot
  /// back from this process, and this process stays registered. Then reset().
  void hand_over() noexcept;

 private:
  void register_in_this_generation();
  std::shared_ptr<detail::ReturnPath> returns_;
  // Ledgers of this process whose boards came back upstream (see find_own_pinned()).
  std::vector<std::weak_ptr<HoldLedger>> own_upstream_ledgers_;
  std::uint64_t registered_generation_ = ~std::uint64_t{0};  // fork generation registered in
};

/// One connection's holds, sender side. Not thread-safe (the encoder's).
class SendingHolds {
 public:
  /// Segments (and upstream boards) kept open for frames up to their sequence number.
  using KeptSegments = std::deque<std::pair<std::uint64_t, std::shared_ptr<const void>>>;
  /// Upstream boards retired per frame at most.
  static constexpr std::size_t kMaxRetiredPerFrame = 16;

  /// The connection's return board, or null before the first storage was pinned.
  ReturnBoard* board() const noexcept { return ledger_ ? ledger_->board().get() : nullptr; }
  /// The same, shared (null before the first storage was pinned or the board was sent).
  std::shared_ptr<const ReturnBoard> shared_board() const noexcept { return ledger_ ? ledger_->board() : nullptr; }
  /// The connection's return board, created (with the ledger) when there is none yet.
  const std::shared_ptr<ReturnBoard>& ensure_board();
  /// Pins the allocations of the storages frame `sequence` introduces (see HoldLedger::pin);
  /// creates the ledger and its board with the first.
  void pin(std::span<HoldLedger::Pin> pins, std::uint64_t sequence);
  /// Unpins `slots`: their frame was never sent.
  void unpin(std::span<const std::uint32_t> slots);
  /// Appends the slots the receiver gave back (or that were reclaimed) since the last call.
  void take_returned(std::vector<std::uint32_t>& out) {
    if (ledger_) take_returned_from_ledger(out);  // inline: every frame asks, most have no ledger work
  }
  /// The last frame the receiver resolved (0: none, or no board yet).
  std::uint64_t resolved() const noexcept { return ledger_ ? ledger_->board()->resolved() : 0; }
  /// See ReturnBoard::request_acknowledgements() (0 without a board).
  std::uint64_t request_acknowledgements() noexcept {
    return ledger_ ? ledger_->board()->request_acknowledgements() : 0;
  }
  /// See ReturnBoard::request_delivery_wake() (nullopt without a board).
  std::optional<ReturnBoard::DeliveryWake> request_delivery_wake(std::uint64_t sequence) noexcept {
    if (!ledger_) return std::nullopt;
    ReturnBoard::DeliveryWake wake = ledger_->board()->request_delivery_wake(sequence);
    wake.board = ledger_->board();
    return wake;
  }
  void cancel_delivery_wake() noexcept {
    if (ledger_) ledger_->board()->cancel_delivery_wake();
  }
  /// Storages pinned now.
  std::size_t pinned() const { return ledger_ ? ledger_->pinned() : 0; }

  // ---- acknowledgements: what the receiver opened ----
  /// Keeps `object` (a segment, or an upstream or return board, named by /proc path: the
  /// receiver opens our fd) open until the receiver acknowledges frame `sequence`.
  void keep_until_acknowledged(std::uint64_t sequence, std::shared_ptr<const void> object) {
    kept_.emplace_back(sequence, std::move(object));
  }
  /// True once a committed frame carried the return board.
  bool board_sent() const noexcept { return board_sequence_ != 0; }
  /// Frame `sequence`, which carried the return board, was sent. `fd_passed`: the board's
  /// fd travelled with it (the kernel holds it now: this end's closes at once); otherwise it
  /// stays open until the frame is acknowledged.
  void board_sent(std::uint64_t sequence, bool fd_passed);
  /// The receiver acknowledged every frame up to `sequence`: what was kept open for them
  /// closes.
  void acknowledged(std::uint64_t sequence);
  /// True while something is kept open for a frame the receiver has not acknowledged.
  bool awaiting_acknowledgement() const noexcept { return !kept_.empty(); }
  /// Segments and boards kept open for unacknowledged frames (for tests and statistics).
  std::size_t kept_for_acknowledgement() const noexcept { return kept_.size(); }
  /// The newest frame whose acknowledgement is awaited (0: none).
  std::uint64_t newest_awaited_sequence() const noexcept { return kept_.empty() ? 0 : kept_.back().first; }

  /// At the start of a frame: appends to `retired` the upstream boards passed before of
  /// which no object lives here any more (at most kMaxRetiredPerFrame), for the frame to
  /// retire; forgets entries whose board lives on in another object.
  void retire_dead_upstream_boards(std::vector<FileIdentity>& retired) {
    if (!upstream_sent_.empty()) retire_passed_upstream_boards(retired);  // inline: most connections forward nothing
  }
  /// Appends to `out` the upstream boards of `block` that the receiver does not have yet,
  /// and tracks them as passed by the frame being encoded (a board the receiver has is
  /// tracked only, so that it is not retired while this object of it lives).
  void upstream_boards_to_pass(const SharedBlock& block, std::vector<std::shared_ptr<ReturnBoard>>& out);
  /// True when upstream boards were passed on this connection (a forwarder's).
  bool passed_upstream_boards() const noexcept { return !upstream_sent_.empty(); }
  /// The frame being encoded was sent / not sent (frame `sequence`: what it kept open is
  /// let go of).
  void commit_frame() {
    if (!upstream_sent_.empty()) commit_passed_upstream_boards();  // inline: most connections forward nothing
  }
  void rollback_frame(std::uint64_t sequence) noexcept;

  /// See MessageEncoder::add_holder(), receiver_gone(), hand_over(), adopt().
  void add_holder(const ProcessIdentity& process);
  void receiver_gone();
  void hand_over();
  void adopt();
  /// The channel closed: what is kept for unacknowledged frames stays open until the
  /// receiver resolved them (HoldLedger::keep_until_resolved()), `probe` watches the
  /// receiving end (HoldLedger::channel_closed()); the ledger lives on in the registry.
  /// Segments named by fd number stay open with the pins (a Sender dropped by an exception,
  /// a close whose linger ran out, or one whose receiver is in this process, did not wait
  /// for their acknowledgements); `exit_linger`: see HoldLedger::keep_until_resolved().
  void closed(UniqueFd probe, bool probe_by_send,
              std::chrono::milliseconds exit_linger = std::chrono::milliseconds::zero());

 private:
  void take_returned_from_ledger(std::vector<std::uint32_t>& out);
  void commit_passed_upstream_boards();
  void retire_passed_upstream_boards(std::vector<FileIdentity>& retired);

  std::shared_ptr<HoldLedger> ledger_;  // created with the first storage pinned
  KeptSegments kept_;                   // open until the receiver acknowledges their frames
  std::uint64_t board_sequence_ = 0;    // the frame that carried the return board (0: none yet)
  // Return boards passed to the receiver because blocks received on them are forwarded on
  // this connection (SegmentRole::UpstreamBoard), each passed once; one object per
  // connection that brought the board here is tracked, and the board is retired once all
  // of them died. Weak: a board that died here cannot be forwarded from again. The first
  // `committed_` went out.
  struct PassedUpstream {
    std::weak_ptr<ReturnBoard> board;
    FileIdentity identity;
    // The frame being encoded retires it, or forgets it because another object of its
    // board lives on: gone at commit_frame().
    bool retiring = false;
  };
  std::vector<PassedUpstream> upstream_sent_;
  std::size_t committed_ = 0;
  std::vector<std::shared_ptr<ReturnBoard>> scratch_;
};

}  // namespace ferry::detail
