// GCC 12 warns that ThreadSanitizer cannot see std::atomic_thread_fence (publish() uses
// one); the warning is reported at <atomic>, so it is off for this file. Every access the
// fence orders is atomic, so ThreadSanitizer has no race to miss here.
#if defined(__SANITIZE_THREAD__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic ignored "-Wtsan"
#endif

#include "ring/ring_end.hpp"

#include "ferry/detail/end_stats.hpp"
#include "ferry/detail/live_ends.hpp"

#include <poll.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>

#include "ferry/error.hpp"
#include "ferry/wait_interruption.hpp"
#include "ring/futex.hpp"

namespace ferry::detail {
namespace {

// CLOCK_MONOTONIC at the resolution of the scheduler tick, in nanoseconds.
std::int64_t coarse_now() noexcept {
  timespec now{};
  // Cannot fail: the clock exists on every Linux since 2.6.32 and `now` is valid.
  (void)::clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  return static_cast<std::int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

// The longest interval between peer checks: a longer one counts as this long, so that the
// interval in nanoseconds, added to the clock, cannot overflow.
constexpr std::chrono::milliseconds kLongestPeerCheck = std::chrono::hours(1);

// The word's values (kRingSleeping, kRingWokenOnCpu + n) are in ring_layout.hpp.
std::uint32_t woken_word() noexcept {
  const int cpu = ::sched_getcpu();  // a few nanoseconds (vDSO or rdpid); -1 if unsupported
  return cpu >= 0 ? kRingWokenOnCpu + static_cast<std::uint32_t>(cpu) : 0;
}

Waker waker_of(std::uint32_t word) noexcept {
  if (word < kRingWokenOnCpu) return Waker::Unknown;
  const int cpu = ::sched_getcpu();
  if (cpu < 0) return Waker::Unknown;
  return word - kRingWokenOnCpu == static_cast<std::uint32_t>(cpu) ? Waker::SameCpu : Waker::OtherCpu;
}

}  // namespace

RingEnd::RingEnd(std::shared_ptr<const RingSegment> segment, UniqueFd companion, const RingTiming& timing)
    : segment_(std::move(segment)),
      data_(segment_->data()),
      capacity_(segment_->capacity()),
      companion_(std::move(companion)),
      peer_check_interval_(std::clamp(timing.peer_check_interval, std::chrono::milliseconds(1), kLongestPeerCheck)),
      spin_(timing.spin) {}

bool RingEnd::peer_gone() {
  if (peer_gone_) return true;
  if (!companion_) return peer_gone_ = true;
  next_peer_check_ = coarse_now() + std::chrono::duration_cast<std::chrono::nanoseconds>(peer_check_interval_).count();
  pollfd entry{companion_.get(), POLLRDHUP, 0};
  while (true) {
    const int rc = ::poll(&entry, 1, 0);
    if (rc >= 0) break;
    if (errno != EINTR) throw_errno("poll of a ring's companion socket");
  }
  // Only segment fds travel on the companion socket (POLLIN): a hang-up or a shutdown of
  // the peer's side means it is gone.
  peer_gone_ = (entry.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
  return peer_gone_;
}

bool RingEnd::peer_gone_lately() {
  if (peer_gone_) return true;
  if (coarse_now() < next_peer_check_) return false;
  // As often, copies of ends other processes own are let go of (live_ends.hpp): one of
  // them may be what keeps this end's peer from seeing its owner die.
  release_ends_owned_elsewhere();
  return peer_gone();
}

WaitOutcome RingEnd::wait(std::atomic<std::uint32_t>& word, Condition ready, const Deadline& deadline,
                          EndStats* charged, std::chrono::nanoseconds first_sleep) {
  if (ready()) return WaitOutcome::Ready;
  if (peer_gone_) return WaitOutcome::PeerGone;
  if (deadline.expired()) {  // a poll (try_recv, a zero timeout) or a deadline already past
    if (peer_gone_lately() && !ready()) return WaitOutcome::PeerGone;
    return ready() ? WaitOutcome::Ready : WaitOutcome::Timeout;
  }
  using Clock = Deadline::Clock;
  std::optional<Clock::time_point> start;
  // Blocked from the first clock reading (after 16 rounds) or the sleep: a peer that
  // answers sooner costs nothing here either.
  BlockedSpan blocked(charged);
  const std::chrono::nanoseconds budget = spin_.budget();
  if (budget > std::chrono::nanoseconds::zero()) {
    // The clock is read every 16 rounds only, the first time after 16 of them: a peer that
    // answers sooner (a ping-pong between two awake ends) costs no clock read at all. A
    // catch is timed by the last reading, at most 16 rounds short, so that no clock read
    // stands between seeing the peer's position and returning to the caller.
    Clock::time_point stop = Clock::time_point::max();
    Clock::time_point last_read{};
    for (unsigned i = 1;; ++i) {
      cpu_relax();
      if (ready()) {
        spin_.caught(start ? last_read - *start : std::chrono::nanoseconds::zero());
        blocked.end_at(to_ns(last_read));
        return WaitOutcome::Ready;
      }
      if (i % 16 != 0) continue;
      const Clock::time_point now = Clock::now();
      last_read = now;
      if (!start) {
        start = now;
        blocked.begin_at(to_ns(now));
        stop = std::min(now + budget, deadline.time_point());
      } else if (now >= stop) {
        break;
      }
    }
  }
  if (!start && spin_.setting() > std::chrono::nanoseconds::zero()) start = Clock::now();
  if (start) {
    blocked.begin_at(to_ns(*start));
  } else {
    blocked.begin_now();
  }
  Waker waker = Waker::Unknown;
  const WaitOutcome outcome = sleep(word, ready, deadline, first_sleep, waker);
  if (outcome == WaitOutcome::Ready && start) {
    const Clock::time_point now = Clock::now();
    spin_.slept(budget, now - *start, waker);
    blocked.end_at(to_ns(now));
  }
  return outcome;
}

WaitOutcome RingEnd::sleep(std::atomic<std::uint32_t>& word, Condition ready, const Deadline& deadline,
                           std::chrono::nanoseconds first_sleep, Waker& waker) {
  struct Awake {  // leaves the word at 0 however the wait ends
    std::atomic<std::uint32_t>& word;
    ~Awake() { word.store(0, std::memory_order_relaxed); }
  } awake{word};
  using Clock = std::chrono::steady_clock;
  // Until when a sleep is cut short for a re-check (see below); none before an announcement.
  Clock::time_point recheck_until = Clock::time_point::min();
  while (true) {
    // Announce the sleep (unless the word still says so), then re-check. The store (or the
    // load that finds the 1 already there) and the position loads in ready() are
    // sequentially consistent, and the peer's publishing store is separated from its look
    // at this word by a fence (publish(); publish_unfenced() owes it until settle()):
    // either the peer sees the 1 and wakes us, or we see its new position. A peer's
    // publish_unfenced() can miss the 1 only while it is being stored, and its position is
    // visible soon after (in practice within microseconds; the C++ model promises only
    // "in a finite time"): so for `first_sleep` after a new announcement we sleep at most
    // until then, and re-check.
    if (word.load(std::memory_order_seq_cst) != kRingSleeping) {
      word.store(kRingSleeping, std::memory_order_seq_cst);
      if (first_sleep != std::chrono::nanoseconds::max()) recheck_until = Clock::now() + first_sleep;
    }
    if (ready()) return WaitOutcome::Ready;
    if (peer_gone_lately()) return ready() ? WaitOutcome::Ready : WaitOutcome::PeerGone;
    if (deadline.expired()) return WaitOutcome::Timeout;
    auto timeout = std::chrono::nanoseconds(next_peer_check_ - coarse_now());
    if (recheck_until != Clock::time_point::min()) {
      const Clock::time_point now = Clock::now();
      if (now < recheck_until) {
        timeout = std::min<std::chrono::nanoseconds>(timeout, recheck_until - now);
      } else {
        recheck_until = Clock::time_point::min();  // past: no clock reads on later rounds
      }
    }
    if (!deadline.is_never()) timeout = std::min(timeout, deadline.remaining());
    timeout = std::min(timeout, wait_interruption_slice());  // the thread's check, if any
    const bool signalled = futex_wait(word, kRingSleeping, std::max(timeout, std::chrono::nanoseconds(1000)));
    // Woken with work to do: return without announcing a sleep again, which would make
    // a streaming peer pay a needless wake-up.
    if (ready()) {
      waker = waker_of(word.load(std::memory_order_relaxed));
      return WaitOutcome::Ready;
    }
    wait_interruption_point(signalled);  // may throw: the Awake guard leaves the word at 0
  }
}

void RingEnd::wake(std::atomic<std::uint32_t>& word) noexcept {
  if (word.load(std::memory_order_seq_cst) != kRingSleeping) return;
  std::uint32_t sleeping = kRingSleeping;
  if (!word.compare_exchange_strong(sleeping, woken_word(), std::memory_order_seq_cst)) return;
  try {
    // Every waiter: a Selector may sleep on a ring's word while a thread sleeps in its recv().
    futex_wake(word, std::numeric_limits<int>::max());
  } catch (const SystemError&) {
    // FUTEX_WAKE fails only for an address outside our mappings, which a ring's word never
    // is. Were it to fail, the sleeper would still notice at its next peer check: better
    // than failing a send whose frame is already published.
  }
}

void RingEnd::publish(std::atomic<std::uint64_t>& position, std::uint64_t value,
                      std::atomic<std::uint32_t>& word) noexcept {
  position.store(value, std::memory_order_release);
  settle(word);
}

bool RingEnd::publish_unfenced(std::atomic<std::uint64_t>& position, std::uint64_t value,
                               std::atomic<std::uint32_t>& word) noexcept {
  position.store(value, std::memory_order_release);
  // A peer asleep for a while has its 1 in the word, seen here without the fence.
  if (word.load(std::memory_order_relaxed) != kRingSleeping) return true;
  settle(word);
  return false;
}

void RingEnd::settle(std::atomic<std::uint32_t>& word) noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  wake(word);
}

void RingEnd::close() noexcept {
  segment_.reset();
  data_ = nullptr;
  companion_.reset();
}

std::vector<int> RingEnd::descriptors() const {
  std::vector<int> out;
  if (segment_) out.push_back(segment_->fd());
  if (companion_) out.push_back(companion_.get());
  return out;
}

}  // namespace ferry::detail
