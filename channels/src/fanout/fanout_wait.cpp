#include "ferry/detail/fanout_wait.hpp"

#include <algorithm>
#include <thread>

namespace ferry::detail {
namespace {
// A consumer takes a small message in about a microsecond: spin (yielding) this long before
// sleeping, since a sleep lasts 50 us or more whatever it asks for (the kernel's timer slack).
constexpr std::chrono::microseconds kSpinFor{50};
constexpr std::chrono::microseconds kFirstSleep{5};
constexpr std::chrono::microseconds kLongestSleep{100};
}  // namespace

LivenessSchedule::LivenessSchedule(std::chrono::milliseconds interval)
    : interval_(std::max(interval, std::chrono::milliseconds(1))), next_check_(std::chrono::steady_clock::now()) {}

void FanoutWait::pause(const Deadline& deadline) {
  const auto now = std::chrono::steady_clock::now();
  if (rounds_++ == 0) spin_until_ = now + kSpinFor;
  if (now < spin_until_) {
    std::this_thread::yield();
    return;
  }
  // 5, 10, 20, ... 100 us: a consumer that frees a place is seen within about 100 us at worst.
  const unsigned doublings = std::min(5u, sleeps_++ / 4);
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
