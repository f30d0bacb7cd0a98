// Interrupting ferry's blocking calls from the thread that waits in them.
//
// Contract: a thread installs a check with ScopedWaitInterruption; while it lives, every
// blocking wait of ferry in that thread (a send on a full transport, recv, accept, connect,
// Selector::wait, WorkerGroup::join, a close waiting for room) calls the check at least
// every kWaitInterruptionPeriod (or the period the scope gives) while it sleeps, and at once when a signal handler ran
// in the thread (the kernel wait ended with EINTR). The check returns to go on waiting, or throws WaitInterrupted (or a
// class derived from it) to abandon the wait: ferry lets that exception out of the blocking call unchanged, and the end
// stays usable (nothing was sent or taken by the abandoned wait, or, for a message that had begun to go out, it is
// finished first: see docs/design/interruption.md). Waits that never sleep (data or room
// already there, a spinning ring end) never call it, so an installed check costs nothing
// on the hot path. Checks nest: the innermost runs first, then the ones around it.
//
// The Python package installs one around each blocking call made from the main thread,
// whose check runs the interpreter's signal handlers (Ctrl-C raises KeyboardInterrupt).
#pragma once

#include <chrono>
#include <exception>

namespace ferry {

/// The longest a blocking wait of ferry sleeps between two calls of an installed check,
/// unless the check was installed with another period.
inline constexpr std::chrono::milliseconds kWaitInterruptionPeriod{50};

/// What a wait-interruption check throws to abandon the wait. Not a ferry::Error: code that
/// handles ferry's failures does not catch an interruption by mistake.
class WaitInterrupted : public std::exception {
 public:
  const char* what() const noexcept override;
};

/// A check: returns to let the wait go on, throws WaitInterrupted to abandon it.
using WaitInterruptionCheck = void (*)(void* context);

/// Installs `check(context)` for the calling thread until destroyed (innermost first).
/// Must be destroyed on the thread that made it, in the reverse order of construction.
/// `period`: how long a wait may sleep between two calls of the checks (the shortest
/// period of the installed scopes applies); a caller whose check needs calling only after
/// a signal (which ends the sleep with EINTR) may give a longer one, to wake less often.
class ScopedWaitInterruption {
 public:
  ScopedWaitInterruption(WaitInterruptionCheck check, void* context,
                         std::chrono::nanoseconds period = kWaitInterruptionPeriod) noexcept;
  ~ScopedWaitInterruption();
  ScopedWaitInterruption(const ScopedWaitInterruption&) = delete;
  ScopedWaitInterruption& operator=(const ScopedWaitInterruption&) = delete;

 private:
  friend struct WaitInterruptionAccess;
  WaitInterruptionCheck check_;
  void* context_;
  ScopedWaitInterruption* outer_;
  std::chrono::nanoseconds period_;  // the shortest of this scope's and the outer ones'
};

namespace detail {

/// Whether a check is installed in this thread (one thread-local load).
bool wait_interruptible() noexcept;

/// What a signal handler running in the waiting thread does to a sleep: most kernel waits
/// (ppoll, poll, futex) end with EINTR (Ends); a condition variable's or semaphore's wait,
/// or std::this_thread::sleep_for, sleeps on (Deaf). A Deaf sleep runs the checks at least
/// every kWaitInterruptionPeriod, whatever longer period the installed scopes gave.
enum class SignalWake { Ends, Deaf };

/// For a wait about to sleep in the kernel: how long it may sleep before the next check is
/// due; nanoseconds::max() when no check is installed. The first call in a blocking call
/// starts the period (one clock read, only on the way to sleep).
std::chrono::nanoseconds wait_interruption_slice(SignalWake wake = SignalWake::Ends) noexcept;

/// After a kernel sleep that ended without what the wait waits for: runs the installed
/// checks when one is due, or at once when `signalled` (the sleep ended with EINTR). May
/// throw what the checks throw (WaitInterrupted).
void wait_interruption_point(bool signalled = false, SignalWake wake = SignalWake::Ends);

/// Sleeps `duration` (a retry pause), in slices that honour the installed checks.
void interruptible_sleep_for(std::chrono::nanoseconds duration);

/// No check runs in this scope, in this thread: for a destructor that closes an end, and
/// for the rest of a frame that already began to go out (the stream never holds half a
/// frame).
class WaitInterruptionSuspended {
 public:
  WaitInterruptionSuspended() noexcept;
  ~WaitInterruptionSuspended();
  WaitInterruptionSuspended(const WaitInterruptionSuspended&) = delete;
  WaitInterruptionSuspended& operator=(const WaitInterruptionSuspended&) = delete;

 private:
  ScopedWaitInterruption* saved_;
};

}  // namespace detail
}  // namespace ferry
