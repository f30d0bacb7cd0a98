#include <algorithm>
#include <thread>

#include "ferry/fanout.hpp"

namespace ferry::detail {
namespace {
constexpr unsigned kYieldRounds = 32;
constexpr std::chrono::microseconds kFirstSleep{5};
constexpr std::chrono::microseconds kLongestSleep{100};
}  // namespace

LivenessSchedule::LivenessSchedule(std::chrono::milliseconds interval)
    : interval_(std::max(interval, std::chrono::milliseconds(1))), next_check_(std::chrono::steady_clock::now()) {}

void FanoutWait::pause(const Deadline& deadline) {
  ++rounds_;
  if (rounds_ <= kYieldRounds) {
    std::this_thread::yield();
    return;
  }
  // 5, 10, 20, ... 100 us: a consumer that frees a place is seen within 100 us at worst.
  const unsigned doublings = std::min(5u, (rounds_ - kYieldRounds) / 4);
  auto sleep = std::min<std::chrono::nanoseconds>(kFirstSleep * (1u << doublings), kLongestSleep);
  if (!deadline.is_never()) sleep = std::min(sleep, std::max(deadline.remaining(), std::chrono::nanoseconds(0)));
  std::this_thread::sleep_for(sleep);
}

bool LivenessSchedule::due() {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_check_) return false;
  next_check_ = now + interval_;
  return true;
}

}  // namespace ferry::detail
