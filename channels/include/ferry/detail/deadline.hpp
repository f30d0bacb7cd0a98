// A point in time after which a blocking call gives up.
#pragma once

#include <chrono>
#include <ctime>

#include "ferry/timeout.hpp"
#include "ferry/wait_interruption.hpp"

namespace ferry::detail {

struct EndStats;

/// When a blocking operation stops waiting: never, now (poll once), or at a time point.
class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  /// Wait as long as it takes.
  static Deadline never() { return Deadline(Clock::time_point::max()); }
  /// Do not wait at all.
  static Deadline now() { return Deadline(Clock::time_point::min()); }
  /// Wait at most `timeout` from now (any duration; more than 100 years waits for ever).
  static Deadline after(Timeout limit) {
    const std::chrono::nanoseconds timeout = limit.nanoseconds();
    if (timeout <= std::chrono::nanoseconds::zero()) return now();
    if (timeout > std::chrono::hours(24 * 365 * 100)) return never();
    return Deadline(Clock::now() + timeout);
  }

  bool is_never() const { return at_ == Clock::time_point::max(); }
  bool expired() const { return !is_never() && Clock::now() >= at_; }
  /// Time left (zero when expired); meaningless for never().
  std::chrono::nanoseconds remaining() const;
  /// Time left as a timespec for ppoll/futex; nullptr-equivalent handled by callers.
  timespec remaining_timespec() const;
  Clock::time_point time_point() const { return at_; }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

/// How long a kernel wait may sleep now: what is left of `deadline` (nanoseconds::max() for
/// never), cut short where the thread's wait-interruption check (ferry/wait_interruption.hpp)
/// is due first; `sliced` says whether it was. After a sliced sleep that found nothing, the
/// caller calls detail::wait_interruption_point() and waits again. `wake`: whether the
/// sleep ends when a signal handler runs (detail::SignalWake).
std::chrono::nanoseconds sleep_limit(const Deadline& deadline, bool& sliced,
                                     detail::SignalWake wake = detail::SignalWake::Ends) noexcept;

/// `duration` (>= 0) as a timespec for ppoll/futex.
timespec to_timespec(std::chrono::nanoseconds duration) noexcept;

/// Waits until `fd` is ready for `events` (POLLIN/POLLOUT) or the deadline passes.
/// Returns false on timeout; true when ready or when the fd reports an error or hang-up
/// (the next read/write then says which). Honours the thread's wait-interruption check
/// (its exception leaves this function), retries on other EINTRs; throws SystemError on
/// other failures. The time blocked is charged to `charged` (a transport end's
/// waits_charged_to(); nullptr: nobody).
bool wait_for_fd(int fd, short events, const Deadline& deadline, EndStats* charged);

}  // namespace ferry::detail
