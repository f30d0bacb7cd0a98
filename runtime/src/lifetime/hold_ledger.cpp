#include "ferry/detail/hold_ledger.hpp"
#include "ferry/detail/thread_annotations.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "ferry/detail/process_identity.hpp"
#include "ferry/error.hpp"
#include "ferry/shared_allocator.hpp"
#include "memory/returned_blocks_hook.hpp"

namespace ferry {
namespace {

// The ledgers of this process. A ledger stays here until its channel closed and nothing is
// pinned any more; in a forked child, the inherited ledgers belong to the parent and are
// dropped without being read (their returns are the parent's to take).
struct Registry {
  detail::Mutex mutex;
  std::vector<std::shared_ptr<detail::HoldLedger>> ledgers FERRY_GUARDED_BY(mutex);
  std::uint64_t generation FERRY_GUARDED_BY(mutex) = 0;
};

Registry& registry() {
  // Leaked on purpose: ledgers may be collected during static destruction.
  static auto* instance = [] {
    auto* created = new Registry();
    // A fork while another thread holds the lock would leave it locked in the child.
    const int rc = ::pthread_atfork([]() FERRY_NO_THREAD_SAFETY_ANALYSIS { registry().mutex.lock(); },
                                    []() FERRY_NO_THREAD_SAFETY_ANALYSIS { registry().mutex.unlock(); },
                                    []() FERRY_NO_THREAD_SAFETY_ANALYSIS { registry().mutex.unlock(); });
    if (rc != 0) throw_system_error("pthread_atfork", rc);
    return created;
  }();
  return *instance;
}

// Closed ledgers of this process that keep segments (HoldLedger::count_keeping_locked()).
std::atomic<std::size_t> g_ledgers_keeping_segments{0};

// Made before main(): a fork() while another thread is still making it would leave the child
// waiting for ever on the static's initialization guard.
[[maybe_unused]] const Registry& g_registry_made_at_start = registry();

// The allocator collects through this hook (memory/ does not depend on lifetime/). Linked
// with the ledgers: a program that makes none has nothing to collect.
[[maybe_unused]] const bool g_collector_installed =
    (install_returned_block_collector([](bool check_receivers) { detail::collect_returned_blocks(check_receivers); }),
     true);

// Takes the ledgers a forked child inherited out of the registry (caller holds the lock).
std::vector<std::shared_ptr<detail::HoldLedger>> take_inherited_locked(Registry& reg) FERRY_REQUIRES(reg.mutex) {
  std::vector<std::shared_ptr<detail::HoldLedger>> inherited;
  const std::uint64_t generation = detail::fork_generation();
  if (reg.generation != generation) {
    inherited.swap(reg.ledgers);
    reg.generation = generation;
  }
  return inherited;
}

// A socket whose reader shut its direction down (a duplex connection: the reader's process
// still holds the socket for the other direction) reports neither POLLERR nor POLLHUP; a
// send of no bytes fails with EPIPE, and sends nothing otherwise (ferry's sockets are all
// stream sockets, where an empty send is no message).
bool socket_reader_shut_down(int fd) {
  while (true) {
    if (::send(fd, nullptr, 0, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) return false;
    if (errno == EINTR) continue;
    return errno == EPIPE || errno == ECONNRESET;
  }
}

// A holder still registering has published its pid, not yet its start time: it counts as
// alive while a running process has that pid. One killed between the two steps of its
// registration never finishes it, and must not keep the pins for ever.
bool registering_holder_alive(std::int32_t pid) noexcept {
  std::optional<detail::ProcessIdentity> process;
  try {
    process = detail::identify_process(pid);
  } catch (...) {
    return true;  // exists but cannot be inspected: never reclaim from a live process
  }
  // No /proc entry: gone, or hidden from us (hidepid), which process_alive() tells apart.
  return detail::process_alive(process.value_or(detail::ProcessIdentity{pid, 0}));
}

}  // namespace

// `by_send`: the probe is a socket whose own sending side is open (after this side's
// shutdown(SHUT_WR) a zero-length send fails with EPIPE whatever the reader does).
bool detail::HoldLedger::ReceiverProbe::reader_gone() const {
  if (!fd) return false;
  pollfd entry{fd.get(), POLLOUT, 0};
  while (true) {
    const int rc = ::poll(&entry, 1, 0);
    if (rc >= 0) {
      if (rc > 0 && (entry.revents & (POLLERR | POLLHUP)) != 0) return true;
      return by_send && socket_reader_shut_down(fd.get());
    }
    if (errno != EINTR) return false;  // cannot tell: keep the pins
  }
}

detail::HoldLedger::HoldLedger() : board_(detail::ReturnBoard::create()), generation_(detail::fork_generation()) {}

std::shared_ptr<detail::HoldLedger> detail::HoldLedger::create() {
  auto ledger = std::shared_ptr<detail::HoldLedger>(new detail::HoldLedger());
  Registry& reg = registry();
  std::vector<std::shared_ptr<detail::HoldLedger>> dropped;
  {
    const detail::MutexLock lock(reg.mutex);
    dropped = take_inherited_locked(reg);
    // Forget ledgers of closed channels whose receivers gave everything back, so that a
    // program opening many channels keeps no stale boards mapped.
    for (auto it = reg.ledgers.begin(); it != reg.ledgers.end();) {
      if ((*it)->finished()) {
        dropped.push_back(std::move(*it));
        it = reg.ledgers.erase(it);
      } else {
        ++it;
      }
    }
    reg.ledgers.push_back(ledger);
  }
  return ledger;  // `dropped` dies here, outside the lock
}

detail::HoldLedger::~HoldLedger() {
  if (counted_keeping_.load(std::memory_order_relaxed))
    g_ledgers_keeping_segments.fetch_sub(1, std::memory_order_relaxed);
}

void detail::HoldLedger::count_keeping_locked() {
  const bool keeping = channel_ == ChannelState::Closed && !kept_segments_.empty();
  if (counted_keeping_.load(std::memory_order_relaxed) == keeping) return;
  counted_keeping_.store(keeping, std::memory_order_relaxed);
  if (keeping) {
    g_ledgers_keeping_segments.fetch_add(1, std::memory_order_relaxed);
  } else {
    g_ledgers_keeping_segments.fetch_sub(1, std::memory_order_relaxed);
  }
}

bool detail::HoldLedger::belongs_to_this_process() const noexcept { return generation_ == detail::fork_generation(); }

void detail::HoldLedger::pin(std::span<Pin> pins, std::uint64_t sequence) {
  const detail::MutexLock lock(mutex_);
  for (Pin& pin : pins) {
    if (pin.slot >= pins_.size()) pins_.resize(std::size_t{pin.slot} + 1);
    Entry& entry = pins_[pin.slot];
    if (entry.allocation == nullptr) ++pinned_;
    entry.allocation = std::move(pin.allocation);
    entry.sequence = sequence;
  }
}

void detail::HoldLedger::unpin_locked(std::uint32_t slot, std::vector<std::shared_ptr<Allocation>>& dropped) {
  if (slot >= pins_.size() || pins_[slot].allocation == nullptr) return;
  dropped.push_back(std::move(pins_[slot].allocation));  // leaves the pin empty
  --pinned_;
}

void detail::HoldLedger::unpin(std::span<const std::uint32_t> slots) {
  const SharedAllocator::ReleaseBatch batch;  // gives the blocks back under one lock, after `dropped`
  std::vector<std::shared_ptr<Allocation>> dropped;
  const detail::MutexLock lock(mutex_);
  for (const std::uint32_t slot : slots) unpin_locked(slot, dropped);
  // `dropped` dies after the lock is released: a block's death may lock its allocator.
}

void detail::HoldLedger::take_returned(std::vector<std::uint32_t>& out) {
  const detail::MutexLock lock(mutex_);
  out.insert(out.end(), returned_.begin(), returned_.end());
  returned_.clear();
}

void detail::HoldLedger::reclaim_unresolved_locked(std::vector<std::shared_ptr<Allocation>>& dropped) {
  const std::uint64_t resolved = board_->abandon_unresolved();
  for (std::uint32_t slot = 0; slot < pins_.size(); ++slot) {
    if (pins_[slot].allocation != nullptr && pins_[slot].sequence > resolved) {
      unpin_locked(slot, dropped);
      returned_.push_back(slot);
    }
  }
}

void detail::HoldLedger::reclaim_all_locked(std::vector<std::shared_ptr<Allocation>>& dropped) {
  board_->abandon_unresolved();
  for (std::uint32_t slot = 0; slot < pins_.size(); ++slot) {
    if (pins_[slot].allocation != nullptr) {
      unpin_locked(slot, dropped);
      returned_.push_back(slot);
    }
  }
}

std::uint64_t detail::HoldLedger::newest_pinned_sequence_locked() const {
  std::uint64_t newest = 0;
  for (const Entry& entry : pins_) {
    if (entry.allocation != nullptr) newest = std::max(newest, entry.sequence);
  }
  return newest;
}

void detail::HoldLedger::release_resolved_segments_locked(ReleasedSegments& released) {
  if (kept_segments_.empty()) return;
  const std::uint64_t resolved = board_->resolved();
  while (!kept_segments_.empty() && kept_segments_.front().first <= resolved) {
    released.push_back(std::move(kept_segments_.front()));
    kept_segments_.pop_front();
  }
  // The board's fd was kept for them (channel_closed()).
  if (channel_ == ChannelState::Closed && kept_segments_.empty()) board_->close_fd();
}

void detail::HoldLedger::take_board_returns_locked(std::vector<std::shared_ptr<Allocation>>& dropped) {
  scratch_.clear();
  // Handed over: the returns on the board are the other process's.
  if (board_reader_ == BoardReader::ThisProcess) {
    board_->take_returns(static_cast<std::uint32_t>(pins_.size()), scratch_);
  }
  // One allocation each, not one per doubling.
  dropped.reserve(dropped.size() + scratch_.size());
  returned_.reserve(returned_.size() + scratch_.size());
  for (const std::uint32_t slot : scratch_) {
    if (slot < pins_.size() && pins_[slot].allocation != nullptr) {
      dropped.push_back(std::move(pins_[slot].allocation));  // leaves the pin empty
      returned_.push_back(slot);
      --pinned_;
    }
  }
}

detail::HoldLedger::Reclaimed detail::HoldLedger::check_holders_locked(
    std::vector<std::shared_ptr<Allocation>>& dropped) {
  // Marked on the board while it runs: a process that registers as a holder meanwhile (a
  // receiver of a block forwarded from this connection) waits for its end and then sees
  // whether it reclaimed (ReturnBoard::reclaims_after_checks()). The mark ends however this
  // is left (an exception from holders() included).
  struct HolderCheck {
    detail::ReturnBoard& board;
    Reclaimed outcome = Reclaimed::Nothing;
    explicit HolderCheck(detail::ReturnBoard& checked) : board(checked) { board.begin_holder_check(); }
    ~HolderCheck() { board.end_holder_check(outcome == Reclaimed::Everything); }
    HolderCheck(const HolderCheck&) = delete;
    HolderCheck& operator=(const HolderCheck&) = delete;
  };
  HolderCheck check(*board_);
  const auto holders = board_->holders();
  const bool all_dead = !holders.empty() && std::none_of(holders.begin(), holders.end(), [](const auto& holder) {
    return holder.registering ? registering_holder_alive(holder.process.pid) : detail::process_alive(holder.process);
  });
  if (all_dead) {
    reclaim_all_locked(dropped);
    return check.outcome = Reclaimed::Everything;
  }
  if (receiver_ == ReceivingEnd::Reachable && !probe_.reader_gone()) return Reclaimed::Nothing;
  receiver_ = ReceivingEnd::Gone;
  // Nobody can resolve the frames still in flight; if no holder is registered, nobody
  // resolved any frame at all, or every process downstream that did let go of what came
  // through this connection (ReturnBoard::hold_registration()): nobody holds anything.
  if (holders.empty()) {
    reclaim_all_locked(dropped);
    return check.outcome = Reclaimed::Everything;
  }
  reclaim_unresolved_locked(dropped);
  return check.outcome = Reclaimed::Unresolved;
}

void detail::HoldLedger::collect(bool check_receivers) {
  // In a forked child the ledger is the parent's: leave it (and its lock) alone.
  if (!belongs_to_this_process()) return;
  const SharedAllocator::ReleaseBatch batch;  // gives the blocks back under one lock, after `dropped`
  std::vector<std::shared_ptr<Allocation>> dropped;
  ReleasedSegments released_segments;  // closed after the lock
  const detail::MutexLock lock(mutex_);
  collect_locked(check_receivers, dropped, released_segments);
  count_keeping_locked();
}

void detail::HoldLedger::collect_locked(bool check_receivers, std::vector<std::shared_ptr<Allocation>>& dropped,
                                        ReleasedSegments& released_segments) {
  release_resolved_segments_locked(released_segments);
  take_board_returns_locked(dropped);
  if (pinned_ == 0) {
    // Nothing pinned: every frame with a storage was given back or reclaimed. What is still
    // kept belongs to frames without one (a delivery-tracking frame's return board): kept
    // while the probe says a receiver may still open it, let go of once it cannot.
    if (!kept_segments_.empty() && probe_ && receiver_ == ReceivingEnd::Reachable &&
        !(check_receivers && probe_.reader_gone())) {
      return;
    }
    probe_ = ReceiverProbe{};
    release_kept_segments_locked(released_segments);
    return;
  }
  if (!check_receivers) return;
  const Reclaimed reclaimed = check_holders_locked(dropped);
  if (receiver_ == ReceivingEnd::Gone || reclaimed == Reclaimed::Everything) {
    release_kept_segments_locked(released_segments);
  }
  if (probe_ && kept_segments_.empty() && board_->resolved() >= newest_pinned_sequence_locked()) {
    probe_ = ReceiverProbe{};  // every pinned frame is resolved: the holders decide from now on
  }
}

bool detail::HoldLedger::idle() {
  // A connection that pinned storages before but pins none now: every frame asks (one that
  // never had a storage slot, such as a Distributor's channel of plain values, is not asked
  // at all: MessageEncoder::finish), so this skips collect()'s allocations and
  // take_returned()'s second lock.
  if (!belongs_to_this_process()) return true;  // see collect()
  const detail::MutexLock lock(mutex_);
  if (pinned_ != 0 || !kept_segments_.empty() || probe_ || !returned_.empty()) return false;
  // Returns of slots pinned before must still be cleared from the board (a slot is
  // reused); none of them holds an allocation any more (pinned_ is 0), so that is all. A
  // ledger that never pinned a slot has none to clear, and leaves alone the board's count
  // word, which shares a cache line with the delivery word its receiver writes per frame.
  if (board_reader_ == BoardReader::ThisProcess && !pins_.empty()) {
    scratch_.clear();
    board_->take_returns(static_cast<std::uint32_t>(pins_.size()), scratch_);
  }
  return true;
}

void detail::HoldLedger::receiver_gone() {
  if (!belongs_to_this_process()) return;  // a forked child's copy: the pins are the parent's
  {
    const detail::MutexLock lock(mutex_);
    receiver_ = ReceivingEnd::Gone;
  }
  collect(true);
}

void detail::HoldLedger::channel_closed(detail::UniqueFd probe, bool probe_by_send) {
  if (!belongs_to_this_process()) {
    // A forked child's copy of the parent's ledger (a channel end the child abandoned): the
    // pins are the parent's, and its lock may have been held by another thread at fork.
    // Only this process's copy of the board's fd goes.
    board_->close_fd();
    return;
  }
  {
    const detail::MutexLock lock(mutex_);
    channel_ = ChannelState::Closed;
    if ((pinned_ > 0 || !kept_segments_.empty()) && receiver_ == ReceivingEnd::Reachable) {
      probe_ = ReceiverProbe{std::move(probe), probe_by_send};
    }
    // No frame will carry the board any more; a receiver may still have to open it by fd
    // number, like the segments kept for it (then collect() closes it with the last one).
    if (kept_segments_.empty()) board_->close_fd();
    count_keeping_locked();
  }
  collect(false);
}

void detail::HoldLedger::release_kept_segments_locked(ReleasedSegments& released) {
  released.insert(released.end(), std::make_move_iterator(kept_segments_.begin()),
                  std::make_move_iterator(kept_segments_.end()));
  kept_segments_.clear();
  if (channel_ == ChannelState::Closed) board_->close_fd();  // kept for them (channel_closed())
}

void detail::HoldLedger::keep_until_resolved(std::deque<std::pair<std::uint64_t, std::shared_ptr<const void>>> segments,
                                             std::chrono::milliseconds exit_linger) {
  if (!belongs_to_this_process()) return;  // a forked child's copy: the segments are the parent's to keep
  {
    const detail::MutexLock lock(mutex_);
    for (auto& kept : segments) kept_segments_.push_back(std::move(kept));
    exit_linger_ = std::max(exit_linger_, exit_linger);
    count_keeping_locked();
  }
  if (exit_linger > std::chrono::milliseconds::zero()) {
    // Once per process (a forked child inherits the registration, and the flag with it).
    // Should the registration fail (no room), an exit does not wait: a receiver in a
    // forked process that reads after this process exited gets PeerDied.
    static std::once_flag registered;
    std::call_once(registered, [] { (void)std::atexit([] { detail::wait_for_kept_segments_at_exit(); }); });
  }
}

std::chrono::milliseconds detail::HoldLedger::exit_linger() const {
  if (!belongs_to_this_process()) return std::chrono::milliseconds::zero();
  const detail::MutexLock lock(mutex_);
  const bool keeping = channel_ == ChannelState::Closed && !kept_segments_.empty();
  return keeping ? exit_linger_ : std::chrono::milliseconds::zero();
}

void detail::HoldLedger::hand_over() {
  if (!belongs_to_this_process()) return;
  const detail::MutexLock lock(mutex_);
  board_reader_ = BoardReader::HandedOver;
}

void detail::HoldLedger::adopt_in_child(const std::shared_ptr<detail::HoldLedger>& ledger) {
  if (!ledger || ledger->belongs_to_this_process()) return;
  {
    // A forked process that adopts an end runs no other thread yet.
    const detail::MutexLock lock(ledger->mutex_);
    ledger->generation_ = detail::fork_generation();
  }
  Registry& reg = registry();
  std::vector<std::shared_ptr<detail::HoldLedger>> dropped;
  {
    const detail::MutexLock lock(reg.mutex);
    dropped = take_inherited_locked(reg);
    reg.ledgers.push_back(ledger);
  }
}

std::shared_ptr<Allocation> detail::HoldLedger::find_pinned(const detail::SharedSegment* segment,
                                                            std::size_t offset) const {
  const detail::MutexLock lock(mutex_);
  for (const Entry& entry : pins_) {
    const SharedBlock* block = entry.allocation ? entry.allocation->shared_block() : nullptr;
    if (block != nullptr && block->segment().get() == segment && block->offset() == offset) return entry.allocation;
  }
  return nullptr;
}

std::size_t detail::HoldLedger::pinned() const {
  const detail::MutexLock lock(mutex_);
  return pinned_;
}

bool detail::HoldLedger::finished() const {
  const detail::MutexLock lock(mutex_);
  return channel_ == ChannelState::Closed && pinned_ == 0 && kept_segments_.empty();
}

void detail::collect_returned_blocks(bool check_receivers) {
  Registry& reg = registry();
  std::vector<std::shared_ptr<detail::HoldLedger>> inherited;
  std::vector<std::shared_ptr<detail::HoldLedger>> ledgers;
  {
    const detail::MutexLock lock(reg.mutex);
    inherited = take_inherited_locked(reg);
    ledgers = reg.ledgers;
  }
  for (const auto& ledger : ledgers) ledger->collect(check_receivers);
  std::vector<std::shared_ptr<detail::HoldLedger>> finished;
  {
    const detail::MutexLock lock(reg.mutex);
    for (auto it = reg.ledgers.begin(); it != reg.ledgers.end();) {
      if ((*it)->finished()) {
        finished.push_back(std::move(*it));
        it = reg.ledgers.erase(it);
      } else {
        ++it;
      }
    }
  }
  // `finished`, `ledgers` and `inherited` die here, outside the registry's lock.
}

bool detail::closed_ledgers_keep_segments() noexcept {
  return g_ledgers_keeping_segments.load(std::memory_order_relaxed) != 0;
}

void detail::wait_for_kept_segments_at_exit() noexcept {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  try {
    while (true) {
      collect_returned_blocks(true);
      std::vector<std::shared_ptr<detail::HoldLedger>> ledgers;
      {
        Registry& reg = registry();
        const detail::MutexLock lock(reg.mutex);
        if (reg.generation == detail::fork_generation()) ledgers = reg.ledgers;
      }
      std::chrono::milliseconds longest = std::chrono::milliseconds::zero();
      for (const auto& ledger : ledgers) longest = std::max(longest, ledger->exit_linger());
      if (longest == std::chrono::milliseconds::zero() || Clock::now() - start >= longest) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } catch (...) {
    // Out of memory or /proc unreadable at exit: exit without waiting.
  }
}

std::shared_ptr<detail::HoldLedger> detail::own_ledger_of_board(const detail::FileIdentity& identity) {
  Registry& reg = registry();
  const detail::MutexLock lock(reg.mutex);
  if (reg.generation != detail::fork_generation()) return nullptr;  // the inherited ledgers are the parent's
  const auto it = std::find_if(reg.ledgers.begin(), reg.ledgers.end(),
                               [&identity](const auto& ledger) { return ledger->board()->identity() == identity; });
  return it == reg.ledgers.end() ? nullptr : *it;
}

std::size_t detail::live_hold_ledgers() {
  Registry& reg = registry();
  const detail::MutexLock lock(reg.mutex);
  return reg.generation == detail::fork_generation() ? reg.ledgers.size() : 0;
}

}  // namespace ferry
