// Futex waits and wakes on 32-bit words in memory shared between processes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>

namespace ferry {

/// Sleeps while `word` holds `expected`, at most `timeout` (negative: no limit). Returns
/// when woken, when the word no longer holds `expected`, on a signal or on timeout; the
/// caller re-checks its condition in every case. The word may live in a MAP_SHARED mapping
/// seen by other processes (the wait is not FUTEX_PRIVATE). Returns true when a signal
/// handler ended the sleep (EINTR). Throws SystemError on errors other than those four
/// outcomes.
bool futex_wait(const std::atomic<std::uint32_t>& word, std::uint32_t expected, std::chrono::nanoseconds timeout);

/// The most words futex_wait_any() waits on (the kernel's FUTEX_WAITV_MAX).
inline constexpr std::size_t kMaxFutexWaitWords = 128;

/// Sleeps while every word of `words` holds `expected`, at most until `deadline` (on the
/// steady clock; time_point::max(): no limit), with the same outcomes as futex_wait (at
/// most kMaxFutexWaitWords words; Error beyond). Returns false, without waiting, on a
/// kernel without futex_waitv (before Linux 5.16) or a seccomp filter that refuses it: the
/// caller then has to poll. Throws SystemError on other errors.
bool futex_wait_any(std::span<std::atomic<std::uint32_t>* const> words, std::uint32_t expected,
                    std::chrono::steady_clock::time_point deadline);
/// A word futex_wait_any() sleeps on, and the value it sleeps while the word holds.
struct FutexExpectation {
  const std::atomic<std::uint32_t>* word;
  std::uint32_t expected;
};
/// Like futex_wait_any() above, with a value of its own for each word.
bool futex_wait_any(std::span<const FutexExpectation> words, std::chrono::steady_clock::time_point deadline);
/// Wakes up to `count` waiters of `word` in any process that maps it. Throws SystemError
/// if the kernel refuses.
void futex_wake(const std::atomic<std::uint32_t>& word, int count);

}  // namespace ferry
