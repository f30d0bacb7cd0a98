// The return board of one connection: a small shared segment, created by the sender and
// mapped by the receiver, through which the receiver tells the sender which storages it no
// longer holds (so that their blocks can be recycled), which frames it has resolved, and
// which processes hold what it received. Posting costs a few atomic operations and no
// system call; the sender reads it when it next encodes a frame or needs memory.
//
// The last resolved frame doubles as the acknowledgement of segments named by fd number
// (Transport::Pipe, ShmRing): a frame is claimed only after all its segments were opened,
// so the sender may close their fds once the word reaches the frame. A sender that must
// block for that (close()) sets the request word first; the receiver then acknowledges on
// the transport as well, which wakes it (request_acknowledgements()).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "ferry/detail/process_identity.hpp"
#include "ferry/detail/shared_memory.hpp"

namespace ferry::detail {

/// Layout (all words are 64-bit atomics, little-endian):
///   header    (page 0)  magic, version, slot capacity, last resolved frame (bit 63: the
///                       sender abandoned later frames), returns posted, acknowledgement
///                       request, reclaims (low 16 bits: checks of the holders in
///                       progress; the rest counts reclaims), delivery wake-up request
///                       (a frame sequence), doorbell (a 32-bit futex word in the low
///                       half of its word), holder processes
///   summary   (page 1)  bit w set: word w of the bitmap may have bits set
///   bitmap    (page 2+) bit s set: the receiver gave storage slot s back
class ReturnBoard {
 public:
  /// Storage slots a board can track: the most storages one sender may lease to one
  /// receiver at a time.
  static constexpr std::uint32_t kSlots = 1u << 20;
  /// Processes that can register as holders of what arrived on one connection (its
  /// receiver, forked processes that took the receiver over, and every process that
  /// received a block of the connection forwarded by another) at once: as many as the
  /// header page has room for. A process past them refuses the frame (TooManyHolders).
  static constexpr std::size_t kMaxHolders = 252;
  /// Size in bytes of every board.
  static std::size_t bytes() noexcept;

  /// Creates a board (sender side). Throws OutOfSharedMemory or SystemError.
  static std::shared_ptr<ReturnBoard> create();
  /// Adopts a board received from a sender, after checking its size and header. Its fd
  /// stays open: a receiver that forwards a block of the connection passes the board on
  /// (the next receiver registers there as a holder too). Throws ProtocolError naming the
  /// failed check.
  static std::shared_ptr<ReturnBoard> open_received(SharedMemory memory);

  ReturnBoard(const ReturnBoard&) = delete;
  ReturnBoard& operator=(const ReturnBoard&) = delete;
  /// Drops this object's share of the process's registration (see hold_registration()).
  ~ReturnBoard();

  /// The memfd (-1 after close_fd()), for passing the board to the receiver.
  int fd() const noexcept { return memory_.fd(); }
  /// Closes the memfd once the receiver has it; the mapping stays.
  void close_fd() noexcept { memory_.close_fd(); }
  const FileIdentity& identity() const noexcept { return memory_.identity(); }

  // ---- receiver side --------------------------------------------------------
  /// Gives storage slot `slot` back to the sender. Lock-free; callable from any thread.
  /// Inside a PostBatch of this board on the calling thread, the post waits for the batch.
  void post_return(std::uint32_t slot) noexcept;
  /// While one lives on a thread, that thread's returns to its board are gathered and
  /// posted when it ends: one atomic operation per bitmap word and one count for the
  /// batch instead of two or three per slot (a frame that releases a hundred leases).
  /// Only the outermost batch of a thread gathers.
  class PostBatch {
   public:
    explicit PostBatch(ReturnBoard* board) noexcept;
    ~PostBatch();
    PostBatch(const PostBatch&) = delete;
    PostBatch& operator=(const PostBatch&) = delete;

   private:
    friend class ReturnBoard;
    // Inline: a frame that releases a hundred leases adds a hundred slots.
    void add(std::uint32_t slot) noexcept {
      // Slots of one frame are mostly neighbours: gather them word by word.
      const std::size_t w = slot / 64;
      if (w != word_) {
        post_word();
        word_ = w;
      }
      bits_ |= std::uint64_t{1} << (slot % 64);
      ++count_;
    }
    void post_word() noexcept;
    ReturnBoard* board_;
    bool outermost_;
    std::size_t word_ = 0;     // bitmap word being gathered
    std::uint64_t bits_ = 0;   // its bits so far
    std::uint64_t count_ = 0;  // slots gathered, for the board's count
  };
  /// Registers `process` as a holder: the sender keeps what it pinned for this connection
  /// as long as any registered process lives. A process that exited gives its place to
  /// the next one when all are taken. False (nothing registered) when kMaxHolders other
  /// living (or still registering) processes are registered.
  bool register_holder(const ProcessIdentity& process) noexcept;
  /// Why the calling process holds what came through a board: it receives on the board's
  /// own connection, or blocks of that connection were forwarded to it by another process.
  enum class HolderRole { Receiver, Downstream };
  /// Registers the calling process as a holder (register_holder()), as this object's share
  /// of the process's registration: every object of the board in the process (one per
  /// connection that brought it) holds one, once per fork generation. When the last share
  /// dies in the generation that took it, and one of them was Downstream, the process
  /// unregisters (unregister_holder()): nothing that came through the board lives in it
  /// any more. So the sender upstream reclaims what it pinned for a forwarder that died
  /// once every process downstream let go of it, not only once they all exited. False
  /// when the board had no place (kMaxHolders living holders); throws Error when /proc
  /// cannot be read.
  bool hold_registration(HolderRole role);
  /// Keeps the calling process registered for as long as it lives, whatever happens to
  /// this object (its blocks were handed over to a forked process, which may register only
  /// after they died here). Nothing when this object holds no share.
  void keep_registration() noexcept;
  /// Removes every place `process` holds on the board (a process that lets go of all it
  /// held): a sender's check no longer waits for it. Lock-free.
  void unregister_holder(const ProcessIdentity& process) noexcept;
  /// The number of times the sender reclaimed everything it pinned for this connection
  /// because every holder had exited, read after waiting (up to `patience`) for a check of
  /// the holders in progress to end; nullopt when the check did not end in time. A process
  /// that registers and then reads a count no higher than the one a living holder read
  /// knows that nothing that holder held was reclaimed meanwhile: a check that read the
  /// holders before the registration was either over (and counted) or still running (and
  /// waited for) when the count was read.
  std::optional<std::uint32_t> reclaims_after_checks(std::chrono::milliseconds patience) const noexcept;
  /// Records that frames up to `sequence` are resolved (their storages are held by the
  /// receiver from now on, their segments opened), and rings the doorbell when the sender
  /// asked to be woken at one of them (request_delivery_wake(): one FUTEX_WAKE). False
  /// when the sender abandoned the frame.
  bool claim_resolved(std::uint64_t sequence) noexcept;
  /// True once the sender asked for acknowledgements on the transport too (it blocks
  /// until a frame is resolved); read after claim_resolved(), both sequentially consistent,
  /// so that the sender either sees the claim or is acknowledged.
  bool acknowledgements_requested() const noexcept;

  // ---- sender side ----------------------------------------------------------
  /// Appends to `out` the slots below `slot_limit` given back since the last call, and
  /// clears them. Not thread-safe: one caller at a time (the sender's ledger).
  void take_returns(std::uint32_t slot_limit, std::vector<std::uint32_t>& out) noexcept;
  /// The last frame the receiver resolved (0: none).
  std::uint64_t resolved() const noexcept;
  /// Asks the receiver to acknowledge every frame it resolves from now on through the
  /// transport as well, for a sender about to block on the transport until a frame is
  /// resolved; returns the last frame resolved, read after the request (a frame resolved
  /// later is acknowledged). The request stays.
  std::uint64_t request_acknowledgements() noexcept;
  /// What a sender that sleeps until a frame is resolved waits on: the doorbell (a shared
  /// futex word), its value before the request, and the last frame resolved, read after
  /// the request (sequentially consistent with the receiver's claim and its look at the
  /// request, so that either `resolved` shows the claim or the receiver rings).
  struct DeliveryWake {
    std::shared_ptr<ReturnBoard> board;  // keeps the doorbell mapped (filled by SendingHolds)
    std::uint32_t* doorbell = nullptr;
    std::uint32_t rung = 0;
    std::uint64_t resolved = 0;
  };
  /// Asks the receiver to ring the doorbell once it resolves frame `sequence` (a later
  /// request replaces this one; the receiver rings once, then clears the request). For
  /// Distributor and Broadcast, which sleep on the doorbells of all their full consumers
  /// at once (futex_waitv).
  DeliveryWake request_delivery_wake(std::uint64_t sequence) noexcept;
  /// Withdraws the request (the sender woke for another reason): the receiver need not ring.
  void cancel_delivery_wake() noexcept;
  /// Rings the doorbell from the sender's side: wakes every thread of the sender asleep on
  /// it (a fan-out's close() wakes its blocked sends this way). The receiver is not asked.
  void ring_doorbell() const noexcept;
  /// Marks every frame after the last resolved one as abandoned (the sender recycles their
  /// memory: a receiver that tries to resolve one later fails instead of reading it);
  /// returns the last resolved frame.
  std::uint64_t abandon_unresolved() noexcept;
  /// The reclaim count (see reclaims_after_checks()) as it is now, for a holder that
  /// forwards a block of the connection.
  std::uint32_t reclaims() const noexcept;
  /// Marks a check of the holders as running (before holders() is read); end it with
  /// end_holder_check(), with `reclaimed` when everything pinned was reclaimed. Several
  /// processes may check at once (a used Sender handed to a forked worker): the count
  /// reads as settled only once every check ended.
  void begin_holder_check() noexcept;
  void end_holder_check(bool reclaimed) noexcept;
  /// The processes registered as holders (one still registering is returned with
  /// start_time 0 and `registering` set: it counts as alive while its pid runs, since one
  /// killed between the two steps of registering never finishes).
  struct Holder {
    ProcessIdentity process;
    bool registering = false;
  };
  std::vector<Holder> holders() const;

 private:
  explicit ReturnBoard(SharedMemory memory) : memory_(std::move(memory)) {}
  std::uint64_t* word(std::size_t byte_offset) const noexcept;
  std::uint32_t* doorbell_word() const noexcept;
  // Sets `bits` in bitmap word `w` and marks the word in the summary.
  void post_bits(std::size_t w, std::uint64_t bits) noexcept;

  SharedMemory memory_;
  std::uint64_t last_posted_ = 0;  // sender side: `posted` at the last take_returns
  // Receiver side, guarded by the process-wide registrations' lock: whether this object
  // holds a share of this process's registration (hold_registration()), and in which fork
  // generation it took it.
  bool holds_registration_ = false;
  std::uint64_t registration_generation_ = 0;
};

}  // namespace ferry::detail
