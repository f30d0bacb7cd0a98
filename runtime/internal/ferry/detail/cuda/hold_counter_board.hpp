// Hold-counter boards: the shared counters through which the receivers of CUDA storages tell
// the producer that they let them go (a count of holds per storage and connection, where the
// CPU's ReturnBoard returns storage slots). Plain host code (no CUDA calls), in every build.
//
//   header (64 bytes)   magic, and the pids of the processes that mapped the board
//   counters            int64 each; one per (producer storage, connection)
//
// The producer adds 1 for every frame that carries the storage (a frame not sent takes it
// back); the receiver subtracts 1 when it resolves the frame into a Storage it already holds,
// or when the new Storage dies. Zero: no frame in flight and no receiver Storage alive. See
// docs/design/leases-and-returns.md.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "ferry/detail/process_handle.hpp"
#include "ferry/shared_allocator.hpp"

namespace ferry {
class Allocation;
class Storage;
}  // namespace ferry

namespace ferry::cuda {

/// First 8 bytes of a board ("FRRYBRD1").
inline constexpr std::uint64_t kHoldCounterBoardMagic = 0x3144524259525246ull;
/// Bytes before the first counter.
inline constexpr std::size_t kHoldCounterBoardHeaderBytes = 64;
/// How many consumer processes a board remembers (for noticing their death).
inline constexpr std::size_t kHoldCounterBoardConsumers = 14;
/// Counters of a board made by HoldCounterBoardSet.
inline constexpr std::uint32_t kHoldCounterBoardCapacity = 4096;

/// The producer's side of one board. Thread-safe.
class HoldCounterBoard {
 public:
  /// Creates a board of `capacity` counters in a new, zeroed block of shared memory from
  /// `pool` (default: the process's caching allocator; an isolated channel passes its own
  /// pool, so the board travels without a copy). `keepalive` lives as long as the board (the
  /// connection's signals (fences or events), which receivers may still wait on while any of the
  /// board's counters is held).
  static std::shared_ptr<HoldCounterBoard> create(std::uint32_t capacity, std::shared_ptr<const void> keepalive = {},
                                                  const std::optional<SharedAllocator>& pool = std::nullopt);
  ~HoldCounterBoard();
  HoldCounterBoard(const HoldCounterBoard&) = delete;
  HoldCounterBoard& operator=(const HoldCounterBoard&) = delete;

  /// The segment, to be sent in frames like any SharedCpu storage.
  const std::shared_ptr<Storage>& storage() const noexcept { return storage_; }
  std::uint32_t capacity() const noexcept { return capacity_; }

  /// A counter set to zero for a new hold, or false when every counter is taken.
  bool acquire(std::uint32_t& counter);
  /// Gives a counter back (its hold is over).
  void free(std::uint32_t counter) noexcept;
  /// Adds `delta` to `counter` (the producer's +1 per frame, -1 when a frame is not sent).
  void add(std::uint32_t counter, std::int64_t delta) noexcept;
  /// The value of `counter` (holds not yet released).
  std::int64_t value(std::uint32_t counter) const noexcept;
  /// True when nobody can still use the storage of `counter`: it is zero, or every process
  /// that mapped the board has died (a consumer killed by SIGKILL releases nothing).
  bool released(std::uint32_t counter);
  /// The pids of the consumers that mapped the board and are alive.
  std::vector<pid_t> live_consumers();
  /// Counters that are not zero (holds that consumers have not released yet).
  std::size_t held_counters() const noexcept;

 private:
  HoldCounterBoard(std::shared_ptr<Storage> storage, std::uint32_t capacity, std::shared_ptr<const void> keepalive);
  std::int64_t* counter_address(std::uint32_t counter) const noexcept;
  bool consumers_all_dead_locked();

  std::shared_ptr<Storage> storage_;
  std::uint32_t capacity_;
  std::shared_ptr<const void> keepalive_;
  mutable std::mutex mutex_;
  std::vector<std::uint32_t> free_counters_;
  // The consumers seen in the header, to tell reliably whether they died.
  std::vector<ferry::detail::ProcessHandle> consumers_;
};

/// The receiver's side of one board: a received segment, checked.
class HoldCounterView {
 public:
  /// Checks that `segment` is a board (size, magic) and registers this process as one of its
  /// consumers. Throws ProtocolError naming the failed check.
  explicit HoldCounterView(std::shared_ptr<Allocation> segment);
  /// Counters in the segment (from its size, not from anything the sender wrote).
  std::uint32_t capacity() const noexcept { return capacity_; }
  /// Subtracts 1 from `counter` (< capacity()): this receiver let a hold go.
  void release(std::uint32_t counter) const noexcept;
  /// The mapped segment (holding it keeps the board mapped).
  const std::shared_ptr<Allocation>& segment() const noexcept { return segment_; }

 private:
  std::shared_ptr<Allocation> segment_;
  std::uint32_t capacity_ = 0;
};

/// One connection's claim on one producer storage: a counter on a board. Frees the counter
/// when destroyed. Move-only.
class ConsumerHold {
 public:
  ConsumerHold(std::shared_ptr<HoldCounterBoard> board, std::uint32_t counter) noexcept
      : board_(std::move(board)), counter_(counter) {}
  ConsumerHold(ConsumerHold&& other) noexcept = default;
  ConsumerHold& operator=(ConsumerHold&& other) noexcept;
  ConsumerHold(const ConsumerHold&) = delete;
  ConsumerHold& operator=(const ConsumerHold&) = delete;
  ~ConsumerHold();

  const std::shared_ptr<HoldCounterBoard>& board() const noexcept { return board_; }
  std::uint32_t counter() const noexcept { return counter_; }
  /// See HoldCounterBoard::released().
  bool released() const { return !board_ || board_->released(counter_); }

 private:
  std::shared_ptr<HoldCounterBoard> board_;
  std::uint32_t counter_;
};

/// The boards of one sending connection: one board, and another whenever all are full.
class HoldCounterBoardSet {
 public:
  /// `keepalive` and `pool` are given to every board (see HoldCounterBoard::create).
  explicit HoldCounterBoardSet(std::shared_ptr<const void> keepalive = {},
                               std::uint32_t capacity = kHoldCounterBoardCapacity,
                               std::optional<SharedAllocator> pool = std::nullopt);
  /// A new hold: a zeroed counter on one of this connection's boards.
  ConsumerHold acquire();
  /// True when `board` belongs to this connection.
  bool owns(const HoldCounterBoard& board) const noexcept;

 private:
  std::shared_ptr<const void> keepalive_;
  std::uint32_t capacity_;
  std::optional<SharedAllocator> pool_;
  std::vector<std::shared_ptr<HoldCounterBoard>> boards_;
};

/// For the exit warning: counts the holds that live consumers still have on boards of this
/// process, and lists those consumers. Checks only boards that are still alive.
struct OutstandingHolds {
  std::size_t counters = 0;
  std::vector<pid_t> consumers;
};
OutstandingHolds outstanding_holds();

/// Registers (once) an exit handler that warns on stderr when this process exits while
/// other processes still hold CUDA storages it sent: their memory dies with this process.
void warn_at_exit_about_outstanding_holds();

}  // namespace ferry::cuda
