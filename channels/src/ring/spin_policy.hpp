// How long a waiting end of a shared-memory ring spins before it sleeps on its futex,
// learned from how its earlier waits ended. Pure bookkeeping (no clock, no system call),
// so that the rules can be tested on their own; RingEnd feeds it.
#pragma once

#include <chrono>
#include <cstdint>

namespace ferry::detail {

/// Who ended a wait that slept, as far as the sleeper can tell (the waker leaves the CPU it
/// runs on in the futex word; see ring_layout.hpp).
enum class Waker {
  Unknown,   ///< no waker recorded: a timeout, or the condition held on a re-check
  SameCpu,   ///< a peer running on the CPU this end runs on now: it could not run while we spun
  OtherCpu,  ///< a peer running on another CPU: it runs alongside, so both ends spinning can meet
};

/// The spin budget of one ring end, between 0 and kLongestProbe settings.
///
/// Spinning pays only when the peer runs on another CPU at the same time and answers within
/// the setting. The rules:
/// - a wait that caught the peer while spinning sets the budget to twice the time it spun,
///   at least the setting and at most kLongestProbe settings: a peer that regularly answers
///   after a little more than the setting (a message that takes it 30 us to handle) keeps
///   being caught, instead of the budget falling back to the setting, spinning in vain and
///   paying a wake-up every other message;
/// - a wait that spun its whole budget in vain halves it (below 500 ns: zero), so spinning
///   fades out where the peer is slow; woken by a peer on our own CPU, it drops the budget
///   to zero at once (the peer could not run while we spun: more busy threads than CPUs).
///   One exception, once between two catches: woken by a peer on another CPU within
///   kLongestProbe settings of the wait's start (its spin included), the next wait spins as
///   long as this one lasted (at least the setting), as after a wait that did not spin
///   (below). The peer was late once: the host took its CPU for a while, or it was asleep
///   and its wake-up came on top of its work. Halving there made both ends of a steady
///   exchange miss each other in turn, each wait lengthened by the other's wake-up, until
///   neither spun. Once only, because a wait that spun in vain always lasts at least its
///   budget: stretching after every such wait would ratchet the budget up to kLongestProbe
///   settings for a peer that keeps missing it (one that our own spinning delays, while it
///   seems to run on another CPU; one whose answers alternate between quick and very slow);
/// - a wait that did not spin (budget zero) and was woken by a peer on another CPU within
///   kRestoreWithin settings spins again: both ends run on their own CPUs and answer
///   quickly, only the wake-ups made the waits long. Measured from its start, a wait counts
///   both ends' wake-ups, which on a VM can exceed the setting on their own; judged by time
///   alone, two sleeping ends would never spin again. The next wait spins as long as this
///   one lasted (at least the setting, at most kLongestProbe settings): when a sleeping
///   peer's wake-up alone outlasts the setting, only a longer spin can catch its answer,
///   and once one end catches, both stay awake and the setting suffices.
/// - a wait that did not spin and was woken by a peer on our own CPU leaves the budget at
///   zero: spinning would only have kept that peer from running;
/// - a wait that did not spin and has no waker recorded restores the setting when it
///   lasted at most the setting.
class SpinPolicy {
 public:
  /// A wait that slept restores the budget (see above) when it lasted at most this many
  /// settings.
  static constexpr std::int64_t kRestoreWithin = 16;
  /// The longest spin, in settings, after a wake from another CPU (see above).
  static constexpr std::int64_t kLongestProbe = 4;
  /// Below this, a halved budget becomes zero.
  static constexpr std::chrono::nanoseconds kMinimumBudget{500};
  /// A longer setting counts as this long (spinning for an hour and spinning without end
  /// are the same to a waiting end), so that the rules' sums of settings cannot overflow.
  static constexpr std::chrono::nanoseconds kLongestSetting = std::chrono::hours(1);

  /// `setting`: the longest spin; zero or less never spins; at most kLongestSetting.
  explicit SpinPolicy(std::chrono::nanoseconds setting) noexcept;

  /// The budget for the next wait.
  std::chrono::nanoseconds budget() const noexcept { return budget_; }
  std::chrono::nanoseconds setting() const noexcept { return setting_; }

  /// The wait caught the peer after spinning `spun`, as far as its last clock reading tells
  /// (zero when it read the clock at most once: a peer that answered within about 32 spins).
  void caught(std::chrono::nanoseconds spun = std::chrono::nanoseconds::zero()) noexcept;
  /// The wait slept after spinning `spun` (zero: it did not spin) and ended `waited` after
  /// it started, woken by `waker`.
  void slept(std::chrono::nanoseconds spun, std::chrono::nanoseconds waited, Waker waker) noexcept;

 private:
  std::chrono::nanoseconds setting_;
  std::chrono::nanoseconds budget_;
  bool stretched_ = false;  // a spin in vain stretched the budget since the last catch
};

}  // namespace ferry::detail
