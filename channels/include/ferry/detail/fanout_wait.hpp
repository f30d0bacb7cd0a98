// How a fan-out send waits while every consumer is full, and when it checks that its
// consumers still live (Distributor and Broadcast; see docs/design/fanout.md).
#pragma once

#include <chrono>

#include "ferry/detail/deadline.hpp"

namespace ferry {
namespace detail {
/// How a fanout send waits for a consumer to take something: yields for 50 us, then sleeps
/// that grow to 100 us (the delivery words have no wake-up of their own).
class FanoutWait {
 public:
  /// Yields or sleeps a little, or less when `deadline` comes first.
  void pause(const Deadline& deadline);

 private:
  unsigned rounds_ = 0;
  unsigned sleeps_ = 0;
  std::chrono::steady_clock::time_point spin_until_;
};

/// Tells when the consumers' liveness is due for a check: once per `interval` (at least
/// 1 ms), and at the first call.
class LivenessSchedule {
 public:
  explicit LivenessSchedule(std::chrono::milliseconds interval);
  bool due();

 private:
  std::chrono::milliseconds interval_;
  std::chrono::steady_clock::time_point next_check_;
};
}  // namespace detail
}  // namespace ferry
