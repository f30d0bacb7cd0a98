// The sender's record of what one receiver may still hold. Every storage a sender passes
// is pinned (its allocation kept alive, so an allocator cannot recycle its block) until the
// receiver gives its slot back through the connection's return board, or until no process
// that received from the connection is alive any more.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "ferry/allocation.hpp"
#include "ferry/detail/return_board.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/detail/unique_fd.hpp"

namespace ferry::detail {

/// One connection's pins. Created by a channel's encoder and registered with the process,
/// so that it outlives the channel while the receiver still holds blocks, and so that an
/// allocator short of memory can collect what receivers gave back. Thread-safe.
class HoldLedger {
 public:
  /// Creates a ledger with a new return board, registered with this process.
  static std::shared_ptr<HoldLedger> create();
  ~HoldLedger();
  HoldLedger(const HoldLedger&) = delete;
  HoldLedger& operator=(const HoldLedger&) = delete;

  /// The board the receiver gives slots back through.
  const std::shared_ptr<ReturnBoard>& board() const noexcept { return board_; }

  /// A storage of a frame being sent: its slot and its allocation.
  struct Pin {
    std::uint32_t slot = 0;
    std::shared_ptr<Allocation> allocation;
  };
  /// Pins the allocations of the storages that frame `sequence` introduces (moves them in).
  void pin(std::span<Pin> pins, std::uint64_t sequence);
  /// Unpins `slots`: their frame was never sent.
  void unpin(std::span<const std::uint32_t> slots);
  /// Appends the slots given back (or reclaimed) since the last call; their pins are gone.
  void take_returned(std::vector<std::uint32_t>& out);

  /// Reads the return board and unpins what the receiver gave back. With
  /// `check_receivers`, also reclaims everything when every process registered as a holder
  /// has exited, and the pins of frames that nobody can resolve any more when the
  /// receiving end is gone (reads /proc; use it when memory is short, not on every send).
  void collect(bool check_receivers);
  /// True, after clearing the board's returns, when nothing is pinned, kept or returned:
  /// collect(false) and take_returned() would do nothing (one lock, no allocation; every
  /// frame of a connection that pins nothing now asks). False, doing nothing, otherwise.
  bool idle();
  /// The receiving end is gone (a write failed): frames not resolved yet never will be.
  void receiver_gone();
  /// The channel closed. `probe` (may be empty) is a descriptor that polls POLLERR or
  /// POLLHUP once the receiving end is gone; it is kept while frames are unresolved. With
  /// `probe_by_send` (a duplex socket whose writer did not shut its direction down), a
  /// zero-length send failing with EPIPE also tells that the reader shut its direction down.
  void channel_closed(UniqueFd probe, bool probe_by_send = false);
  /// Segments (and upstream return boards) that frames up to their sequence number name by
  /// fd number (Transport::Pipe, ShmRing; each held by an owner of its fd), from a channel
  /// that closed before the receiver acknowledged them (a Sender
  /// dropped by an exception does not wait): kept open until the return board says their
  /// frame is resolved, or until the receiver is gone, so that it can still open them; also
  /// when nothing is pinned (a delivery-tracking frame's return board), as long as the
  /// channel's probe says the receiving end is there. `exit_linger` (a close that did not wait
  /// because its receiver is in this process): this process's exit waits at most that long
  /// for them (wait_for_kept_segments_at_exit()), for a forked process that reads late.
  void keep_until_resolved(std::deque<std::pair<std::uint64_t, std::shared_ptr<const void>>> segments,
                           std::chrono::milliseconds exit_linger = std::chrono::milliseconds::zero());
  /// This process handed the channel to a forked process that goes on with it (see
  /// adopt_in_child()): the return board is that process's to read from now on. What this
  /// process pinned stays pinned until every holder has exited.
  void hand_over();
  /// In a forked process that took the channel over (a used Sender handed to a worker):
  /// `ledger`, inherited from the parent, becomes this process's, registered with it and
  /// reading the return board. No-op for a ledger of this process.
  static void adopt_in_child(const std::shared_ptr<HoldLedger>& ledger);

  /// The pinned allocation of the shared block at `offset` in `segment`, or null: a
  /// block this process sent that came back through forwarders (its Storage died here)
  /// is kept by holding it. Scans every pin: for that rare path only.
  std::shared_ptr<Allocation> find_pinned(const SharedSegment* segment, std::size_t offset) const;
  /// Storages pinned now.
  std::size_t pinned() const;
  /// True when the channel closed and nothing is pinned or kept: the ledger can go.
  bool finished() const;
  /// How long this process's exit still waits for this ledger's kept segments (zero: not).
  std::chrono::milliseconds exit_linger() const;

 private:
  HoldLedger();
  struct Entry {
    std::shared_ptr<Allocation> allocation;
    std::uint64_t sequence = 0;
  };
  // Where the connection stands. The channel closes once; the receiving end may be known
  // gone before or after (a failed write, or the probe); who reads the board changes once.
  enum class ChannelState : std::uint8_t { Open, Closed };
  enum class ReceivingEnd : std::uint8_t { Reachable, Gone };
  enum class BoardReader : std::uint8_t { ThisProcess, HandedOver };
  // What a check of the holders reclaimed.
  enum class Reclaimed : std::uint8_t { Nothing, Unresolved, Everything };
  // The descriptor that tells when the receiving end is gone (see channel_closed()).
  struct ReceiverProbe {
    UniqueFd fd;
    bool by_send = false;  // a zero-length send failing with EPIPE tells it too
    explicit operator bool() const noexcept { return static_cast<bool>(fd); }
    bool reader_gone() const;
  };
  using KeptSegments = std::deque<std::pair<std::uint64_t, std::shared_ptr<const void>>>;
  // Segments taken out of kept_segments_ under the lock, closed after it: a vector, which
  // allocates nothing while empty (a deque allocates two blocks as it is made, and
  // collect() makes one for every frame it is asked about).
  using ReleasedSegments = std::vector<std::pair<std::uint64_t, std::shared_ptr<const void>>>;

  void collect_locked(bool check_receivers, std::vector<std::shared_ptr<Allocation>>& dropped,
                      ReleasedSegments& released_segments) FERRY_REQUIRES(mutex_);
  void unpin_locked(std::uint32_t slot, std::vector<std::shared_ptr<Allocation>>& dropped) FERRY_REQUIRES(mutex_);
  void reclaim_unresolved_locked(std::vector<std::shared_ptr<Allocation>>& dropped) FERRY_REQUIRES(mutex_);
  void reclaim_all_locked(std::vector<std::shared_ptr<Allocation>>& dropped) FERRY_REQUIRES(mutex_);
  // Moves the kept segments whose frames the receiver resolved into `released`.
  void release_resolved_segments_locked(ReleasedSegments& released) FERRY_REQUIRES(mutex_);
  // Unpins the slots the receiver posted on the board (not when handed over).
  void take_board_returns_locked(std::vector<std::shared_ptr<Allocation>>& dropped) FERRY_REQUIRES(mutex_);
  // Reclaims what no living holder can use any more (see collect()).
  Reclaimed check_holders_locked(std::vector<std::shared_ptr<Allocation>>& dropped) FERRY_REQUIRES(mutex_);
  // Moves every kept segment into `released` (to close after the lock): nobody will open
  // them any more. Closes the board's fd too once the channel closed.
  void release_kept_segments_locked(ReleasedSegments& released) FERRY_REQUIRES(mutex_);
  // Updates the process's count of closed ledgers that keep segments (see
  // closed_ledgers_keep_segments()) after kept_segments_ or channel_ changed.
  void count_keeping_locked() FERRY_REQUIRES(mutex_);
  std::uint64_t newest_pinned_sequence_locked() const FERRY_REQUIRES(mutex_);
  bool belongs_to_this_process() const noexcept;

  mutable detail::Mutex mutex_;
  std::shared_ptr<ReturnBoard> board_;
  std::uint64_t generation_;
  std::vector<Entry> pins_ FERRY_GUARDED_BY(mutex_);  // by slot
  std::size_t pinned_ FERRY_GUARDED_BY(mutex_) = 0;
  std::vector<std::uint32_t> returned_ FERRY_GUARDED_BY(mutex_);
  std::vector<std::uint32_t> scratch_ FERRY_GUARDED_BY(mutex_);
  ChannelState channel_ FERRY_GUARDED_BY(mutex_) = ChannelState::Open;
  ReceivingEnd receiver_ FERRY_GUARDED_BY(mutex_) = ReceivingEnd::Reachable;
  BoardReader board_reader_ FERRY_GUARDED_BY(mutex_) = BoardReader::ThisProcess;
  ReceiverProbe probe_ FERRY_GUARDED_BY(mutex_);         // kept while frames are unresolved after the close
  KeptSegments kept_segments_ FERRY_GUARDED_BY(mutex_);  // by sequence
  std::chrono::milliseconds exit_linger_ FERRY_GUARDED_BY(mutex_){0};  // see keep_until_resolved()
  std::atomic<bool> counted_keeping_{false};                           // counted in closed_ledgers_keep_segments()
};

/// Collects what receivers gave back on every channel of this process (see
/// HoldLedger::collect) and forgets ledgers that are finished. The caching allocator calls
/// it before it creates a segment; `SharedAllocator::trim()` calls it with
/// `check_receivers`.
void collect_returned_blocks(bool check_receivers);

/// True while a ledger of a closed channel of this process keeps segments for frames its
/// receiver has not resolved (one relaxed load): a receiver in this process that reached
/// end of stream or closed then calls collect_returned_blocks(true), so that they go as
/// soon as nobody can open them any more.
bool closed_ledgers_keep_segments() noexcept;

/// Waits, at most the longest exit linger of them, until no ledger of this process keeps
/// segments for a close that did not wait (HoldLedger::keep_until_resolved()): resolved, or
/// the receiving end gone. Registered with std::atexit by the first such ledger.
void wait_for_kept_segments_at_exit() noexcept;

/// The ledger of this process whose return board is `identity`, or null (a block this
/// process sent came back to it through forwarders, with the board it left on).
std::shared_ptr<HoldLedger> own_ledger_of_board(const FileIdentity& identity);

/// Ledgers this process keeps (open channels, and closed ones whose receivers still hold
/// blocks), for tests and statistics.
std::size_t live_hold_ledgers();

}  // namespace ferry::detail
