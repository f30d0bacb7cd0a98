#include "ferry/detail/fanout_wait.hpp"

#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <thread>

#include "ring/futex.hpp"

namespace ferry::detail {
namespace {
// A consumer takes a small message in about a microsecond: spin (yielding) this long before
// sleeping, since a sleep lasts 50 us or more whatever it asks for (the kernel's timer slack).
constexpr std::chrono::microseconds kSpinFor{50};
constexpr std::chrono::microseconds kFirstSleep{5};
constexpr std::chrono::microseconds kLongestSleep{100};
// Without futex_waitv, the doorbells after the first are looked at this often.
constexpr std::chrono::microseconds kSingleFutexSlice{200};

const std::atomic<std::uint32_t>& doorbell(const ReturnBoard::DeliveryWake& wake) {
  // A plain 32-bit word of the board's shared mapping (futex.cpp checks that the layouts agree).
  return *reinterpret_cast<const std::atomic<std::uint32_t>*>(wake.doorbell);
}

// The coarse clock's tick (a few ms; the kernel's HZ); a day when it cannot be read, so
// that the precise clock is used.
std::chrono::nanoseconds coarse_tick() noexcept {
  timespec tick{};
  if (::clock_getres(CLOCK_MONOTONIC_COARSE, &tick) != 0) return std::chrono::hours(24);
  return std::chrono::seconds(tick.tv_sec) + std::chrono::nanoseconds(tick.tv_nsec);
}
}  // namespace

void sleep_on_doorbells(std::span<const ReturnBoard::DeliveryWake> doorbells,
                        std::chrono::steady_clock::time_point until) {
  if (doorbells.empty()) return;
  // More than futex_waitv takes: the rest are seen at the next wake-up or liveness check.
  const std::size_t count = std::min(doorbells.size(), kMaxFutexWaitWords);
  std::array<FutexExpectation, kMaxFutexWaitWords> words{};
  for (std::size_t i = 0; i < count; ++i) words[i] = FutexExpectation{&doorbell(doorbells[i]), doorbells[i].rung};
  if (futex_wait_any(std::span<const FutexExpectation>(words.data(), count), until)) return;
  // A kernel without futex_waitv (before Linux 5.16): the first doorbell, a slice at a time.
  auto slice = std::max(until - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration::zero());
  if (count > 1) slice = std::min<std::chrono::steady_clock::duration>(slice, kSingleFutexSlice);
  futex_wait(doorbell(doorbells[0]), doorbells[0].rung, std::chrono::duration_cast<std::chrono::nanoseconds>(slice));
}

LivenessSchedule::LivenessSchedule(std::chrono::milliseconds interval)
    : interval_(std::max(interval, std::chrono::milliseconds(1))),
      coarse_(interval_ >= 2 * coarse_tick()),
      next_check_(now_on(coarse_)) {}

void FanoutWait::pause(std::chrono::steady_clock::time_point until) {
  const auto now = std::chrono::steady_clock::now();
  if (rounds_++ == 0) spin_until_ = now + kSpinFor;
  if (now < spin_until_) {
    std::this_thread::yield();
    return;
  }
  // 5, 10, 20, ... 100 us: a consumer that frees a place is seen within about 100 us at worst.
  const unsigned doublings = std::min(5u, sleeps_++ / 4);
  auto sleep = std::min<std::chrono::nanoseconds>(kFirstSleep * (1u << doublings), kLongestSleep);
  sleep = std::min<std::chrono::nanoseconds>(
      sleep, std::max<std::chrono::nanoseconds>(until - now, std::chrono::nanoseconds(0)));
  std::this_thread::sleep_for(sleep);
}

}  // namespace ferry::detail
