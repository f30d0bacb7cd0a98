#include "ferry/detail/return_board.hpp"
#include "ferry/detail/thread_annotations.hpp"

#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <thread>
#include <unordered_map>

#include "ferry/error.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kMagic = 0x5352555445525946;  // "FYRETURS"
// 2: the acknowledgement request word; 3: reclaims, 64 holders; 4: holder checks counted;
// 5: 252 holders; 6: the delivery wake-up request and doorbell
constexpr std::uint64_t kVersion = 6;
constexpr std::uint64_t kAbandoned = std::uint64_t{1} << 63;
constexpr std::uint64_t kRegistering = std::uint64_t{1} << 63;
constexpr std::size_t kPage = 4096;
constexpr std::size_t kBitmapWords = detail::ReturnBoard::kSlots / 64;
constexpr std::size_t kSummaryWords = kBitmapWords / 64;

// Byte offsets of the fields.
constexpr std::size_t kMagicAt = 0;
constexpr std::size_t kVersionAt = 8;  // version << 32 | slot capacity
constexpr std::size_t kResolvedAt = 16;
constexpr std::size_t kPostedAt = 24;
constexpr std::size_t kAcknowledgementsAt = 32;  // non-zero: the sender asked for acknowledgements
// Low 16 bits: checks of the holders in progress (a Sender handed to a forked worker is
// checked by both processes); above: reclaims.
constexpr std::size_t kReclaimsAt = 40;
constexpr std::uint64_t kCheck = 1;
constexpr std::uint64_t kReclaim = std::uint64_t{1} << 16;
constexpr std::uint64_t kChecks = kReclaim - 1;
// Non-zero: the sender sleeps until the frame of this sequence is resolved (request_delivery_wake()).
constexpr std::size_t kWakeAtAt = 48;
// Low 32 bits: the doorbell, a futex word the receiver bumps and wakes when it resolves
// the frame kWakeAtAt asks for.
constexpr std::size_t kDoorbellAt = 56;
constexpr std::size_t kHoldersAt = 64;  // kMaxHolders x {pid word, start time}
constexpr std::size_t kSummaryAt = kPage;
constexpr std::size_t kBitmapAt = 2 * kPage;
static_assert(kHoldersAt + detail::ReturnBoard::kMaxHolders * 16 == kPage, "the holders fill the header page");
static_assert(kSummaryWords * 8 <= kPage);
static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free, "shared-memory atomics must be lock-free");

using Atomic = std::atomic_ref<std::uint64_t>;

// This process's own registrations as a holder, by board: how many board objects hold a
// share of it (hold_registration(); one per connection that brought the board), whether one
// came downstream of the board's connection (a forwarder passed it on), and whether the
// process keeps it for good (it handed its blocks over to a forked process). A forked child
// starts from none: the parent's objects it inherited never drop the parent's registration,
// and it registers for itself.
struct Registrations {
  struct Registration {
    std::size_t objects = 0;
    bool downstream = false;
    bool kept = false;
  };
  detail::Mutex mutex;
  std::uint64_t generation FERRY_GUARDED_BY(mutex) = 0;
  std::unordered_map<detail::FileIdentity, Registration, detail::FileIdentityHash> boards FERRY_GUARDED_BY(mutex);

  std::unordered_map<detail::FileIdentity, Registration, detail::FileIdentityHash>& of_this_generation()
      FERRY_REQUIRES(mutex) {
    if (const std::uint64_t now = detail::fork_generation(); generation != now) {
      boards.clear();
      generation = now;
    }
    return boards;
  }
};

Registrations& registrations() {
  // Leaked on purpose: boards may die during static destruction.
  static auto* made = [] {
    auto* created = new Registrations();
    // A fork while another thread holds the lock would leave it locked in the child.
    if (const int rc = ::pthread_atfork([]() FERRY_NO_THREAD_SAFETY_ANALYSIS { registrations().mutex.lock(); },
                                        []() FERRY_NO_THREAD_SAFETY_ANALYSIS { registrations().mutex.unlock(); },
                                        []() FERRY_NO_THREAD_SAFETY_ANALYSIS { registrations().mutex.unlock(); });
        rc != 0) {
      throw_system_error("pthread_atfork", rc);
    }
    return created;
  }();
  return *made;
}

// Made before main(), so that no fork can meet its initialization half done.
[[maybe_unused]] const Registrations& g_registrations_made_at_start = registrations();

}  // namespace

std::size_t detail::ReturnBoard::bytes() noexcept { return kBitmapAt + kBitmapWords * 8; }

std::uint64_t* detail::ReturnBoard::word(std::size_t byte_offset) const noexcept {
  return reinterpret_cast<std::uint64_t*>(memory_.data() + byte_offset);
}

std::shared_ptr<detail::ReturnBoard> detail::ReturnBoard::create() {
  auto board = std::shared_ptr<detail::ReturnBoard>(
      new detail::ReturnBoard(detail::SharedMemory::create(bytes(), "ferry-returns")));
  *board->word(kMagicAt) = kMagic;
  *board->word(kVersionAt) = kVersion << 32 | kSlots;
  return board;  // the rest of a new memfd reads as zero
}

std::shared_ptr<detail::ReturnBoard> detail::ReturnBoard::open_received(detail::SharedMemory memory) {
  if (memory.size() != bytes()) {
    throw ProtocolError("received return board has " + std::to_string(memory.size()) + " bytes, expected " +
                        std::to_string(bytes()));
  }
  auto board = std::shared_ptr<detail::ReturnBoard>(new detail::ReturnBoard(std::move(memory)));
  if (Atomic(*board->word(kMagicAt)).load(std::memory_order_relaxed) != kMagic ||
      Atomic(*board->word(kVersionAt)).load(std::memory_order_relaxed) != (kVersion << 32 | kSlots)) {
    throw ProtocolError(
        "received return board has a wrong magic number or version; build both sides from the "
        "same ferry");
  }
  return board;
}

namespace {
constinit thread_local detail::ReturnBoard::PostBatch* t_post_batch = nullptr;  // the outermost open one
}  // namespace

void detail::ReturnBoard::post_return(std::uint32_t slot) noexcept {
  if (slot >= kSlots) return;
  if (PostBatch* batch = t_post_batch; batch != nullptr && batch->board_ == this) {
    batch->add(slot);
    return;
  }
  post_bits(slot / 64, std::uint64_t{1} << (slot % 64));
  Atomic(*word(kPostedAt)).fetch_add(1, std::memory_order_release);
}

void detail::ReturnBoard::post_bits(std::size_t w, std::uint64_t bits) noexcept {
  const std::uint64_t before = Atomic(*word(kBitmapAt + w * 8)).fetch_or(bits, std::memory_order_release);
  // Whoever makes a bitmap word non-zero marks it in the summary; a post into a word that
  // already has bits needs not (the sender takes the whole word once it sees the mark, and
  // a word it emptied is marked again by the next post).
  if (before == 0) {
    Atomic(*word(kSummaryAt + (w / 64) * 8)).fetch_or(std::uint64_t{1} << (w % 64), std::memory_order_release);
  }
}

detail::ReturnBoard::PostBatch::PostBatch(detail::ReturnBoard* board) noexcept
    : board_(board), outermost_(t_post_batch == nullptr) {
  if (outermost_) t_post_batch = this;
}

detail::ReturnBoard::PostBatch::~PostBatch() {
  if (!outermost_) return;
  t_post_batch = nullptr;
  post_word();
  // The count goes up after the bits are set: a sender that sees it finds them.
  if (count_ > 0) Atomic(*board_->word(kPostedAt)).fetch_add(count_, std::memory_order_release);
}

void detail::ReturnBoard::PostBatch::post_word() noexcept {
  if (bits_ == 0) return;
  board_->post_bits(word_, bits_);
  bits_ = 0;
}

bool detail::ReturnBoard::register_holder(const detail::ProcessIdentity& process) noexcept {
  const auto pid = static_cast<std::uint64_t>(process.pid);
  // Takes place `i` if its pid word still reads `expected`: marks it registering, then
  // publishes the start time and clears the mark. seq_cst: a sender's check of the holders
  // (begin_holder_check(), then holders()) and a registration followed by
  // reclaims_after_checks() see at least one another's store.
  const auto claim = [this, pid, &process](std::size_t i, std::uint64_t& expected) {
    Atomic pid_word(*word(kHoldersAt + i * 16));
    if (!pid_word.compare_exchange_strong(expected, pid | kRegistering, std::memory_order_seq_cst)) return false;
    Atomic(*word(kHoldersAt + i * 16 + 8)).store(process.start_time, std::memory_order_relaxed);
    pid_word.store(pid, std::memory_order_release);
    return true;
  };
  const auto is_this_process = [this, pid, &process](std::size_t i, std::uint64_t pid_word) {
    return pid_word == pid &&
           Atomic(*word(kHoldersAt + i * 16 + 8)).load(std::memory_order_relaxed) == process.start_time;
  };
  // Places are cleared when a process unregisters: look for this process's own place
  // everywhere before taking a free one, so that it never holds two.
  for (std::size_t i = 0; i < kMaxHolders; ++i) {
    if (is_this_process(i, Atomic(*word(kHoldersAt + i * 16)).load(std::memory_order_seq_cst))) return true;
  }
  for (std::size_t i = 0; i < kMaxHolders; ++i) {
    std::uint64_t current = Atomic(*word(kHoldersAt + i * 16)).load(std::memory_order_seq_cst);
    if (current != 0) continue;
    if (claim(i, current)) return true;
    if (is_this_process(i, current)) return true;
  }
  // Full: take the place of a holder that exited. A process that dies keeps its place, and
  // every process a long-lived connection's blocks were forwarded to registers on its
  // board; a dead holder keeps nothing pinned, so replacing it changes no check's outcome
  // (one that read it dead before sees the same; one that reads the slot after sees us).
  for (std::size_t i = 0; i < kMaxHolders; ++i) {
    std::uint64_t current = Atomic(*word(kHoldersAt + i * 16)).load(std::memory_order_seq_cst);
    if (current == 0 || (current & kRegistering) != 0) continue;  // a registration in progress: skip it
    const detail::ProcessIdentity holder{static_cast<std::int32_t>(current & 0x7fffffff),
                                         Atomic(*word(kHoldersAt + i * 16 + 8)).load(std::memory_order_relaxed)};
    if (!detail::process_alive(holder) && claim(i, current)) return true;
  }
  return false;
}

void detail::ReturnBoard::unregister_holder(const detail::ProcessIdentity& process) noexcept {
  const auto pid = static_cast<std::uint64_t>(process.pid);
  for (std::size_t i = 0; i < kMaxHolders; ++i) {
    Atomic pid_word(*word(kHoldersAt + i * 16));
    std::uint64_t current = pid_word.load(std::memory_order_seq_cst);
    if (current != pid ||
        Atomic(*word(kHoldersAt + i * 16 + 8)).load(std::memory_order_relaxed) != process.start_time) {
      continue;
    }
    // Nobody else changes a living process's place: only free places are claimed, and only
    // those of holders that exited are taken over. The start time stays; a free place is
    // known by its pid word.
    pid_word.compare_exchange_strong(current, 0, std::memory_order_seq_cst);
  }
}

bool detail::ReturnBoard::hold_registration(HolderRole role) {
  const detail::ProcessIdentity self = detail::current_process();
  Registrations& all = registrations();
  const detail::MutexLock lock(all.mutex);
  auto& boards = all.of_this_generation();
  const std::uint64_t generation = detail::fork_generation();
  auto& registration = boards[identity()];
  if (!register_holder(self)) {
    if (registration.objects == 0 && !registration.kept) boards.erase(identity());
    return false;
  }
  if (role == HolderRole::Downstream) registration.downstream = true;
  if (!holds_registration_ || registration_generation_ != generation) {
    ++registration.objects;
    holds_registration_ = true;
    registration_generation_ = generation;
  }
  return true;
}

void detail::ReturnBoard::keep_registration() noexcept {
  Registrations& all = registrations();
  const detail::MutexLock lock(all.mutex);
  if (!holds_registration_ || registration_generation_ != detail::fork_generation()) return;
  all.of_this_generation().find(identity())->second.kept = true;  // present: this object holds a share
}

detail::ReturnBoard::~ReturnBoard() {
  if (!holds_registration_) return;
  Registrations& all = registrations();
  const detail::MutexLock lock(all.mutex);
  if (registration_generation_ != detail::fork_generation()) return;  // the parent's, inherited by fork
  auto& boards = all.of_this_generation();
  const auto it = boards.find(identity());
  if (it == boards.end() || --it->second.objects > 0 || it->second.kept) return;
  const bool downstream = it->second.downstream;
  boards.erase(it);
  // The last object of the board in this process: nothing that came through it lives here
  // any more. A receiver that only ever received on the connection itself stays registered
  // (as it always has: its sender's checks need no change).
  if (!downstream) return;
  try {
    unregister_holder(detail::current_process());
  } catch (...) {
    // /proc unreadable: staying registered only keeps the upstream sender's pins longer.
  }
}

std::uint32_t detail::ReturnBoard::reclaims() const noexcept {
  return static_cast<std::uint32_t>(Atomic(*word(kReclaimsAt)).load(std::memory_order_seq_cst) / kReclaim);
}

std::optional<std::uint32_t> detail::ReturnBoard::reclaims_after_checks(
    std::chrono::milliseconds patience) const noexcept {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  Atomic reclaims_word(*word(kReclaimsAt));
  while (true) {
    const std::uint64_t value = reclaims_word.load(std::memory_order_seq_cst);
    if ((value & kChecks) == 0) return static_cast<std::uint32_t>(value / kReclaim);
    // A check reads a few /proc entries: it ends within microseconds unless its process
    // stopped (killed halfway, or frozen).
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void detail::ReturnBoard::begin_holder_check() noexcept {
  Atomic(*word(kReclaimsAt)).fetch_add(kCheck, std::memory_order_seq_cst);
}

void detail::ReturnBoard::end_holder_check(bool reclaimed) noexcept {
  // One step, as two processes may check at once: their checks end in any order, and one
  // ending neither hides the other nor loses its reclaim (modular: minus kCheck).
  Atomic(*word(kReclaimsAt)).fetch_add((reclaimed ? kReclaim : 0) - kCheck, std::memory_order_seq_cst);
}

bool detail::ReturnBoard::claim_resolved(std::uint64_t sequence) noexcept {
  // seq_cst, like acknowledgements_requested() after it and the sender's side in
  // request_acknowledgements(): of the two stores, at least one is seen by the other side.
  Atomic resolved_word(*word(kResolvedAt));
  std::uint64_t current = resolved_word.load(std::memory_order_seq_cst);
  while (true) {
    if (current & kAbandoned) return false;
    if (current >= sequence) return true;
    if (resolved_word.compare_exchange_weak(current, sequence, std::memory_order_seq_cst)) break;
  }
  // A sender asleep until this frame (request_delivery_wake()): ring its doorbell, once.
  // seq_cst, like the claim above and the sender's request then its read of the claim.
  Atomic wake_at(*word(kWakeAtAt));
  std::uint64_t wanted = wake_at.load(std::memory_order_seq_cst);
  if (wanted != 0 && wanted <= sequence && wake_at.compare_exchange_strong(wanted, 0, std::memory_order_seq_cst)) {
    ring_doorbell();
  }
  return true;
}

void detail::ReturnBoard::ring_doorbell() const noexcept {
  std::atomic_ref<std::uint32_t> doorbell(*doorbell_word());
  doorbell.fetch_add(1, std::memory_order_seq_cst);
  // Shared futex (the board is a shared mapping). It cannot fail for a valid, aligned
  // word; were it to, the sender's sleep is bounded (it polls the word again then).
  (void)::syscall(SYS_futex, doorbell_word(), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

bool detail::ReturnBoard::acknowledgements_requested() const noexcept {
  return Atomic(*word(kAcknowledgementsAt)).load(std::memory_order_seq_cst) != 0;
}

void detail::ReturnBoard::take_returns(std::uint32_t slot_limit, std::vector<std::uint32_t>& out) noexcept {
  const std::uint64_t posted = Atomic(*word(kPostedAt)).load(std::memory_order_acquire);
  if (posted == last_posted_) return;
  last_posted_ = posted;
  const std::size_t words = (std::min<std::size_t>(slot_limit, kSlots) + 63) / 64;
  const std::size_t summaries = (words + 63) / 64;
  for (std::size_t i = 0; i < summaries; ++i) {
    Atomic summary(*word(kSummaryAt + i * 8));
    if (summary.load(std::memory_order_relaxed) == 0) continue;
    std::uint64_t marked = summary.exchange(0, std::memory_order_acq_rel);
    while (marked != 0) {
      const std::size_t w = i * 64 + static_cast<std::size_t>(std::countr_zero(marked));
      marked &= marked - 1;
      std::uint64_t bits = Atomic(*word(kBitmapAt + w * 8)).exchange(0, std::memory_order_acq_rel);
      while (bits != 0) {
        out.push_back(static_cast<std::uint32_t>(w * 64 + static_cast<std::size_t>(std::countr_zero(bits))));
        bits &= bits - 1;
      }
    }
  }
}

std::uint64_t detail::ReturnBoard::resolved() const noexcept {
  return Atomic(*word(kResolvedAt)).load(std::memory_order_acquire) & ~kAbandoned;
}

std::uint64_t detail::ReturnBoard::request_acknowledgements() noexcept {
  Atomic(*word(kAcknowledgementsAt)).store(1, std::memory_order_seq_cst);
  return Atomic(*word(kResolvedAt)).load(std::memory_order_seq_cst) & ~kAbandoned;
}

detail::ReturnBoard::DeliveryWake detail::ReturnBoard::request_delivery_wake(std::uint64_t sequence) noexcept {
  DeliveryWake wake;
  wake.doorbell = doorbell_word();
  wake.rung = std::atomic_ref<std::uint32_t>(*wake.doorbell).load(std::memory_order_seq_cst);
  Atomic(*word(kWakeAtAt)).store(sequence, std::memory_order_seq_cst);
  wake.resolved = Atomic(*word(kResolvedAt)).load(std::memory_order_seq_cst) & ~kAbandoned;
  return wake;
}

void detail::ReturnBoard::cancel_delivery_wake() noexcept {
  Atomic wake_at(*word(kWakeAtAt));
  if (wake_at.load(std::memory_order_relaxed) != 0) wake_at.store(0, std::memory_order_relaxed);
}

std::uint32_t* detail::ReturnBoard::doorbell_word() const noexcept {
  return reinterpret_cast<std::uint32_t*>(word(kDoorbellAt));  // the low half (little-endian)
}

std::uint64_t detail::ReturnBoard::abandon_unresolved() noexcept {
  Atomic resolved_word(*word(kResolvedAt));
  std::uint64_t current = resolved_word.load(std::memory_order_acquire);
  while (!(current & kAbandoned)) {
    if (resolved_word.compare_exchange_weak(current, current | kAbandoned, std::memory_order_acq_rel)) break;
  }
  return current & ~kAbandoned;
}

std::vector<detail::ReturnBoard::Holder> detail::ReturnBoard::holders() const {
  std::vector<Holder> out;
  for (std::size_t i = 0; i < kMaxHolders; ++i) {
    const std::uint64_t pid_word = Atomic(*word(kHoldersAt + i * 16)).load(std::memory_order_seq_cst);
    if (pid_word == 0) continue;
    Holder holder;
    holder.process.pid = static_cast<std::int32_t>(pid_word & 0x7fffffff);
    holder.registering = (pid_word & kRegistering) != 0;
    if (!holder.registering) {
      holder.process.start_time = Atomic(*word(kHoldersAt + i * 16 + 8)).load(std::memory_order_relaxed);
    }
    out.push_back(holder);
  }
  return out;
}

}  // namespace ferry
