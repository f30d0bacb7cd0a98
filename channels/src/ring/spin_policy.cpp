#include "ring/spin_policy.hpp"

#include <algorithm>

namespace ferry::detail {

using std::chrono::nanoseconds;

SpinPolicy::SpinPolicy(nanoseconds setting) noexcept
    : setting_(std::clamp(setting, nanoseconds::zero(), kLongestSetting)), budget_(setting_) {}

void SpinPolicy::caught(nanoseconds spun) noexcept {
  if (setting_ == nanoseconds::zero()) return;
  budget_ = std::clamp(2 * spun, setting_, setting_ * kLongestProbe);
  stretched_ = false;
}

void SpinPolicy::slept(nanoseconds spun, nanoseconds waited, Waker waker) noexcept {
  if (setting_ == nanoseconds::zero()) return;
  if (spun > nanoseconds::zero()) {
    // Spun in vain: the peer could not run meanwhile, was late once, was just slower than a
    // budget that earlier long waits had cut, or takes longer than we should spin.
    if (waker == Waker::SameCpu) {
      budget_ = nanoseconds::zero();
    } else if (waker == Waker::OtherCpu && waited <= setting_ * kLongestProbe && !stretched_) {
      // The peer answered soon after the spin gave up: spin as long as this wait lasted
      // next time (at least the setting), once until the next catch.
      budget_ = std::max(waited, setting_);
      stretched_ = true;
    } else {
      budget_ /= 2;
      if (budget_ < kMinimumBudget) budget_ = nanoseconds::zero();
    }
    return;
  }
  switch (waker) {
    case Waker::OtherCpu:
      if (waited <= setting_ * kRestoreWithin) budget_ = std::clamp(waited, setting_, setting_ * kLongestProbe);
      break;
    case Waker::SameCpu: break;
    case Waker::Unknown:
      if (waited <= setting_) budget_ = setting_;
      break;
  }
}

}  // namespace ferry::detail
