// How a fan-out send waits while its consumers are full, and when it checks that its
// consumers still live (Distributor and Broadcast; see docs/design/fanout.md).
#pragma once

#include <time.h>

#include <chrono>
#include <span>

#include "ferry/detail/deadline.hpp"
#include "ferry/detail/return_board.hpp"

namespace ferry::detail {

/// Sleeps until one of `doorbells` rings (its word no longer holds the value seen when the
/// wake-up was requested) or `until` comes: one futex_waitv over all of them (the first
/// 128; Linux 5.16; on an older kernel, a futex wait on the first, at most 200 us at a
/// time when there are several). Returns early on a signal. Throws SystemError when the
/// kernel refuses the wait for another reason.
void sleep_on_doorbells(std::span<const ReturnBoard::DeliveryWake> doorbells,
                        std::chrono::steady_clock::time_point until);

/// The state of one fan-out send's waits for room (FanoutConsumers::wait_for_room()).
class FanoutWait {
 public:
  /// Polls for a consumer that has no doorbell (InProcess ends): yields for 50 us, then
  /// sleeps that grow to 100 us, or less when `until` comes first.
  void pause(std::chrono::steady_clock::time_point until);
  /// Whether this send already slept once waiting for half a consumer's bound to drain.
  bool waited_for_half() const noexcept { return waited_for_half_; }
  void set_waited_for_half() noexcept { waited_for_half_ = true; }

 private:
  bool waited_for_half_ = false;
  unsigned rounds_ = 0;
  unsigned sleeps_ = 0;
  std::chrono::steady_clock::time_point spin_until_;
};

/// CLOCK_MONOTONIC_COARSE: CLOCK_MONOTONIC (steady_clock's clock) as of the last tick.
inline std::chrono::steady_clock::time_point coarse_steady_now() noexcept {
  timespec now{};
  (void)::clock_gettime(CLOCK_MONOTONIC_COARSE, &now);  // cannot fail for a valid clock id
  return std::chrono::steady_clock::time_point(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec)));
}

/// Tells when the consumers' liveness is due for a check: once per `interval` (at least
/// 1 ms), and at the first call. due() runs at every send, so for an interval of at least
/// two ticks of the coarse monotonic clock (a tick is a few ms) it reads that clock (a few
/// ns, one tick late at most) rather than the precise one.
class LivenessSchedule {
 public:
  explicit LivenessSchedule(std::chrono::milliseconds interval);
  bool due() noexcept {  // inline: a send's one call into it
    const auto now = now_on(coarse_);
    if (now < next_check_) return false;
    next_check_ = now + interval_;
    return true;
  }
  /// due(), read at one call in kCallStride: for a caller that asks at every send whether
  /// a check is due, though nothing it sends depends on the answer (a Distributor with a
  /// consumer that has room), so that only every kCallStride-th send reads the clock.
  bool due_every_few_calls() noexcept { return ++calls_ % kCallStride == 0 && due(); }
  static constexpr unsigned kCallStride = 8;
  /// When the next check is due.
  std::chrono::steady_clock::time_point next() const noexcept { return next_check_; }

 private:
  static std::chrono::steady_clock::time_point now_on(bool coarse) noexcept {
    return coarse ? coarse_steady_now() : std::chrono::steady_clock::now();
  }

  std::chrono::milliseconds interval_;
  bool coarse_;         // reads CLOCK_MONOTONIC_COARSE
  unsigned calls_ = 0;  // of due_every_few_calls()
  std::chrono::steady_clock::time_point next_check_;
};
}  // namespace ferry::detail
