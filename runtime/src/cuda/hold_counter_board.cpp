#include "ferry/detail/cuda/hold_counter_board.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ferry/detail/process_handle.hpp"
#include "ferry/error.hpp"
#include "ferry/storage.hpp"

namespace ferry::cuda {
namespace {

static_assert(std::atomic_ref<std::int64_t>::is_always_lock_free, "board counters must be lock-free in shared memory");
static_assert(std::atomic_ref<std::int32_t>::is_always_lock_free, "board pids must be lock-free in shared memory");
static_assert(sizeof(std::uint64_t) + kHoldCounterBoardConsumers * sizeof(std::int32_t) ==
              kHoldCounterBoardHeaderBytes);

// Header layout: magic, then the consumer pids (0 = free entry).
constexpr std::size_t kConsumersAt = sizeof(std::uint64_t);

std::int32_t* consumer_slots(std::byte* segment) { return reinterpret_cast<std::int32_t*>(segment + kConsumersAt); }

// Every live board of this process (for the exit warning).
struct BoardRegistry {
  std::mutex mutex;
  std::vector<std::weak_ptr<HoldCounterBoard>> boards;
};

BoardRegistry& registry() {
  static auto* instance = new BoardRegistry();  // leaked: used from an exit handler
  return *instance;
}

}  // namespace

// ---- producer side -------------------------------------------------------------------

HoldCounterBoard::HoldCounterBoard(std::shared_ptr<Storage> storage, std::uint32_t capacity,
                                   std::shared_ptr<const void> keepalive)
    : storage_(std::move(storage)), capacity_(capacity), keepalive_(std::move(keepalive)) {
  free_counters_.reserve(capacity);
  for (std::uint32_t i = capacity; i-- > 0;) free_counters_.push_back(i);  // hand out 0, 1, 2 ... first
}

HoldCounterBoard::~HoldCounterBoard() = default;

std::shared_ptr<HoldCounterBoard> HoldCounterBoard::create(std::uint32_t capacity,
                                                           std::shared_ptr<const void> keepalive,
                                                           const std::optional<SharedAllocator>& pool) {
  if (capacity == 0) throw Error("HoldCounterBoard::create: a board needs at least one counter");
  const std::size_t bytes = kHoldCounterBoardHeaderBytes + std::size_t{capacity} * sizeof(std::int64_t);
  // Zeroed: a recycled block keeps old contents, and every counter and consumer entry must
  // start at 0.
  auto storage = Storage::allocate(bytes, pool ? *pool : SharedAllocator::global(), true);
  std::memcpy(storage->data(), &kHoldCounterBoardMagic, sizeof kHoldCounterBoardMagic);
  auto board =
      std::shared_ptr<HoldCounterBoard>(new HoldCounterBoard(std::move(storage), capacity, std::move(keepalive)));
  BoardRegistry& boards = registry();
  std::lock_guard lock(boards.mutex);
  std::erase_if(boards.boards, [](const auto& weak) { return weak.expired(); });
  boards.boards.push_back(board);
  return board;
}

std::int64_t* HoldCounterBoard::counter_address(std::uint32_t counter) const noexcept {
  return reinterpret_cast<std::int64_t*>(storage_->data() + kHoldCounterBoardHeaderBytes) + counter;
}

bool HoldCounterBoard::acquire(std::uint32_t& counter) {
  std::lock_guard lock(mutex_);
  if (free_counters_.empty()) return false;
  counter = free_counters_.back();
  free_counters_.pop_back();
  std::atomic_ref<std::int64_t>(*counter_address(counter)).store(0, std::memory_order_relaxed);
  return true;
}

void HoldCounterBoard::free(std::uint32_t counter) noexcept {
  std::lock_guard lock(mutex_);
  free_counters_.push_back(counter);
}

void HoldCounterBoard::add(std::uint32_t counter, std::int64_t delta) noexcept {
  std::atomic_ref<std::int64_t>(*counter_address(counter)).fetch_add(delta, std::memory_order_acq_rel);
}

std::int64_t HoldCounterBoard::value(std::uint32_t counter) const noexcept {
  return std::atomic_ref<std::int64_t>(*counter_address(counter)).load(std::memory_order_acquire);
}

bool HoldCounterBoard::released(std::uint32_t counter) {
  // A receiver that subtracts more than it was given is broken, not holding anything.
  if (value(counter) <= 0) return true;
  std::lock_guard lock(mutex_);
  return consumers_all_dead_locked();
}

bool HoldCounterBoard::consumers_all_dead_locked() {
  // Learn about consumers that registered since the last look.
  std::int32_t* slots = consumer_slots(storage_->data());
  for (std::size_t i = 0; i < kHoldCounterBoardConsumers; ++i) {
    const pid_t pid = std::atomic_ref<std::int32_t>(slots[i]).load(std::memory_order_acquire);
    if (pid <= 0) continue;
    const bool known =
        std::any_of(consumers_.begin(), consumers_.end(), [pid](const auto& c) { return c.pid() == pid; });
    if (known) continue;
    // Without pidfd support, the handle asks /proc (ProcessHandle::exited()).
    consumers_.push_back(ferry::detail::ProcessHandle::open(pid));
  }
  // Nobody registered yet: the frames are still in flight, or were never read.
  if (consumers_.empty()) return false;
  return std::all_of(consumers_.begin(), consumers_.end(),
                     [](const ferry::detail::ProcessHandle& consumer) { return consumer.exited(); });
}

std::vector<pid_t> HoldCounterBoard::live_consumers() {
  std::lock_guard lock(mutex_);
  consumers_all_dead_locked();  // refreshes the list
  std::vector<pid_t> alive;
  for (const ferry::detail::ProcessHandle& consumer : consumers_) {
    if (!consumer.exited()) alive.push_back(consumer.pid());
  }
  return alive;
}

std::size_t HoldCounterBoard::held_counters() const noexcept {
  std::size_t held = 0;
  for (std::uint32_t i = 0; i < capacity_; ++i) held += value(i) > 0 ? 1 : 0;
  return held;
}

// ---- receiver side -------------------------------------------------------------------

HoldCounterView::HoldCounterView(std::shared_ptr<Allocation> segment) : segment_(std::move(segment)) {
  if (!segment_ || segment_->device() != Device::SharedCpu) {
    throw ProtocolError("the hold-counter board of a CUDA storage is not a shared-memory segment");
  }
  const std::size_t bytes = segment_->size();
  if (bytes < kHoldCounterBoardHeaderBytes + sizeof(std::int64_t)) {
    throw ProtocolError("the hold-counter board of a CUDA storage has only " + std::to_string(bytes) + " bytes");
  }
  std::uint64_t magic = 0;
  std::memcpy(&magic, segment_->data(), sizeof magic);
  if (magic != kHoldCounterBoardMagic)
    throw ProtocolError("the hold-counter board of a CUDA storage has a wrong magic number");
  const std::size_t counters = (bytes - kHoldCounterBoardHeaderBytes) / sizeof(std::int64_t);
  capacity_ = static_cast<std::uint32_t>(std::min<std::size_t>(counters, UINT32_MAX));
  // Register this process, so that the producer can tell when it died holding counters.
  const auto self = static_cast<std::int32_t>(::getpid());
  std::int32_t* slots = consumer_slots(segment_->data());
  for (std::size_t i = 0; i < kHoldCounterBoardConsumers; ++i) {
    std::atomic_ref<std::int32_t> slot(slots[i]);
    std::int32_t seen = slot.load(std::memory_order_acquire);
    if (seen == self) return;
    if (seen == 0 && slot.compare_exchange_strong(seen, self, std::memory_order_acq_rel)) return;
    if (seen == self) return;  // lost the race to another thread of this process
  }
  // Every entry is taken: the producer cannot watch this process's death (it never hangs
  // for it; it may keep memory that this process held when it died).
}

void HoldCounterView::release(std::uint32_t counter) const noexcept {
  auto* counters = reinterpret_cast<std::int64_t*>(segment_->data() + kHoldCounterBoardHeaderBytes);
  std::atomic_ref<std::int64_t>(counters[counter]).fetch_sub(1, std::memory_order_acq_rel);
}

// ---- holds and sets ------------------------------------------------------------------

ConsumerHold& ConsumerHold::operator=(ConsumerHold&& other) noexcept {
  if (this != &other) {
    if (board_) board_->free(counter_);
    board_ = std::move(other.board_);
    counter_ = other.counter_;
  }
  return *this;
}

ConsumerHold::~ConsumerHold() {
  if (board_) board_->free(counter_);
}

HoldCounterBoardSet::HoldCounterBoardSet(std::shared_ptr<const void> keepalive, std::uint32_t capacity,
                                         std::optional<SharedAllocator> pool)
    : keepalive_(std::move(keepalive)), capacity_(capacity), pool_(std::move(pool)) {}

ConsumerHold HoldCounterBoardSet::acquire() {
  std::uint32_t counter = 0;
  for (const auto& board : boards_) {
    if (board->acquire(counter)) return ConsumerHold(board, counter);
  }
  boards_.push_back(HoldCounterBoard::create(capacity_, keepalive_, pool_));
  if (!boards_.back()->acquire(counter)) throw Error("a new hold-counter board has no free counter");
  return ConsumerHold(boards_.back(), counter);
}

bool HoldCounterBoardSet::owns(const HoldCounterBoard& board) const noexcept {
  return std::any_of(boards_.begin(), boards_.end(), [&board](const auto& mine) { return mine.get() == &board; });
}

// ---- exit warning --------------------------------------------------------------------

OutstandingHolds outstanding_holds() {
  std::vector<std::shared_ptr<HoldCounterBoard>> boards;
  {
    BoardRegistry& all = registry();
    std::lock_guard lock(all.mutex);
    for (const auto& weak : all.boards) {
      if (auto board = weak.lock()) boards.push_back(std::move(board));
    }
  }
  OutstandingHolds result;
  for (const auto& board : boards) {
    const std::vector<pid_t> alive = board->live_consumers();
    if (alive.empty()) continue;  // nobody left who could use the memory
    const std::size_t held = board->held_counters();
    if (held == 0) continue;
    result.counters += held;
    for (const pid_t pid : alive) {
      if (std::find(result.consumers.begin(), result.consumers.end(), pid) == result.consumers.end()) {
        result.consumers.push_back(pid);
      }
    }
  }
  return result;
}

namespace {

void warn_about_outstanding_holds() {
  try {
    const OutstandingHolds holds = outstanding_holds();
    if (holds.counters == 0) return;
    std::string pids;
    for (const pid_t pid : holds.consumers) pids += (pids.empty() ? "" : ", ") + std::to_string(pid);
    std::fprintf(stderr,
                 "ferry: warning: process %d exits while processes %s still hold %zu CUDA storage(s) it sent. "
                 "That device memory is freed with this process: those processes must not use the tensors any "
                 "more. Keep a producer alive until its consumers drop the CUDA tensors they received "
                 "(see README, 'CUDA').\n",
                 static_cast<int>(::getpid()), pids.c_str(), holds.counters);
  } catch (...) {
    // Exiting: nothing sensible to do about a failure to warn.
  }
}

}  // namespace

void warn_at_exit_about_outstanding_holds() {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(warn_about_outstanding_holds); });
}

}  // namespace ferry::cuda
