#include "ferry/wait_interruption.hpp"

#include <algorithm>
#include <thread>

namespace ferry {

// The innermost installed check of this thread, and when the next call of the checks is
// due (time_point::min(): not yet started in the current blocking call).
struct WaitInterruptionAccess {
  static thread_local ScopedWaitInterruption* innermost;
  static thread_local std::chrono::steady_clock::time_point due;

  static std::chrono::nanoseconds period(detail::SignalWake wake) noexcept {
    return wake == detail::SignalWake::Deaf
               ? std::min<std::chrono::nanoseconds>(innermost->period_, kWaitInterruptionPeriod)
               : innermost->period_;
  }

  static void run_all() {
    for (ScopedWaitInterruption* scope = innermost; scope != nullptr; scope = scope->outer_) {
      scope->check_(scope->context_);
    }
  }
};

thread_local ScopedWaitInterruption* WaitInterruptionAccess::innermost = nullptr;
thread_local std::chrono::steady_clock::time_point WaitInterruptionAccess::due =
    std::chrono::steady_clock::time_point::min();

const char* WaitInterrupted::what() const noexcept {
  return "a blocking ferry call was interrupted by the check installed with ScopedWaitInterruption";
}

ScopedWaitInterruption::ScopedWaitInterruption(WaitInterruptionCheck check, void* context,
                                               std::chrono::nanoseconds period) noexcept
    : check_(check),
      context_(context),
      outer_(WaitInterruptionAccess::innermost),
      period_(outer_ != nullptr ? std::min(outer_->period_, period) : period) {
  WaitInterruptionAccess::innermost = this;
  if (outer_ == nullptr) WaitInterruptionAccess::due = std::chrono::steady_clock::time_point::min();
}

ScopedWaitInterruption::~ScopedWaitInterruption() { WaitInterruptionAccess::innermost = outer_; }

namespace detail {

bool wait_interruptible() noexcept { return WaitInterruptionAccess::innermost != nullptr; }

std::chrono::nanoseconds wait_interruption_slice(SignalWake wake) noexcept {
  if (WaitInterruptionAccess::innermost == nullptr) return std::chrono::nanoseconds::max();
  const auto now = std::chrono::steady_clock::now();
  auto& due = WaitInterruptionAccess::due;
  if (due == std::chrono::steady_clock::time_point::min()) due = now + WaitInterruptionAccess::period(wake);
  return std::max(std::chrono::nanoseconds::zero(), std::chrono::duration_cast<std::chrono::nanoseconds>(due - now));
}

void wait_interruption_point(bool signalled, SignalWake wake) {
  if (WaitInterruptionAccess::innermost == nullptr) return;
  const auto now = std::chrono::steady_clock::now();
  auto& due = WaitInterruptionAccess::due;
  if (due == std::chrono::steady_clock::time_point::min()) due = now + WaitInterruptionAccess::period(wake);
  if (!signalled && now < due) return;
  due = now + WaitInterruptionAccess::period(wake);
  WaitInterruptionAccess::run_all();
}

void interruptible_sleep_for(std::chrono::nanoseconds duration) {
  const auto until = std::chrono::steady_clock::now() + duration;
  while (true) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) return;
    // sleep_for sleeps on through a signal (it retries nanosleep after EINTR).
    std::this_thread::sleep_for(
        std::min<std::chrono::nanoseconds>(until - now, wait_interruption_slice(SignalWake::Deaf)));
    wait_interruption_point(false, SignalWake::Deaf);
  }
}

WaitInterruptionSuspended::WaitInterruptionSuspended() noexcept : saved_(WaitInterruptionAccess::innermost) {
  WaitInterruptionAccess::innermost = nullptr;
}

WaitInterruptionSuspended::~WaitInterruptionSuspended() { WaitInterruptionAccess::innermost = saved_; }

}  // namespace detail
}  // namespace ferry
