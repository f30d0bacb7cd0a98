#include "ring/futex.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <ctime>
#include <string>

#include "ferry/error.hpp"

namespace ferry {
namespace {

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) &&
                  std::atomic<std::uint32_t>::is_always_lock_free,
              "a futex word must be a plain lock-free 32-bit integer");

long futex(const std::atomic<std::uint32_t>& word, int op, std::uint32_t value, const timespec* timeout) {
  // The kernel only reads the word's address; it never writes through it for WAIT/WAKE.
  auto* address = const_cast<std::uint32_t*>(reinterpret_cast<const std::uint32_t*>(&word));
  return ::syscall(SYS_futex, address, op, value, timeout, nullptr, 0);
}

}  // namespace

bool futex_wait(const std::atomic<std::uint32_t>& word, std::uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec relative{};
  const timespec* limit = nullptr;
  if (timeout >= std::chrono::nanoseconds::zero()) {
    relative.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
    relative.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
    limit = &relative;
  }
  if (futex(word, FUTEX_WAIT, expected, limit) == 0) return false;
  // EAGAIN: the word changed before we slept; ETIMEDOUT and EINTR: the caller re-checks.
  if (errno == EINTR) return true;
  if (errno == EAGAIN || errno == ETIMEDOUT) return false;
  throw_errno("futex(FUTEX_WAIT)");
}

bool futex_wait_any(std::span<std::atomic<std::uint32_t>* const> words, std::uint32_t expected,
                    std::chrono::steady_clock::time_point deadline) {
  if (words.size() > kMaxFutexWaitWords) {
    throw Error("futex_wait_any: at most " + std::to_string(kMaxFutexWaitWords) + " words, not " +
                std::to_string(words.size()));
  }
  std::array<FutexExpectation, kMaxFutexWaitWords> expectations{};
  for (std::size_t i = 0; i < words.size(); ++i) expectations[i] = FutexExpectation{words[i], expected};
  return futex_wait_any(std::span<const FutexExpectation>(expectations.data(), words.size()), deadline);
}

bool futex_wait_any(std::span<const FutexExpectation> words, std::chrono::steady_clock::time_point deadline) {
  if (words.size() > kMaxFutexWaitWords) {
    throw Error("futex_wait_any: at most " + std::to_string(kMaxFutexWaitWords) + " words, not " +
                std::to_string(words.size()));
  }
  std::array<futex_waitv, kMaxFutexWaitWords> waiters{};
  for (std::size_t i = 0; i < words.size(); ++i) {
    waiters[i].val = words[i].expected;
    waiters[i].uaddr = reinterpret_cast<std::uintptr_t>(words[i].word);
    waiters[i].flags = FUTEX_32;  // shared between processes: not FUTEX_PRIVATE_FLAG
  }
  // futex_waitv takes an absolute time on the clock it is given; steady_clock is CLOCK_MONOTONIC.
  timespec until{};
  const timespec* limit = nullptr;
  if (deadline != std::chrono::steady_clock::time_point::max()) {
    const auto since_epoch = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch());
    until.tv_sec = static_cast<time_t>(since_epoch.count() / 1'000'000'000);
    until.tv_nsec = static_cast<long>(since_epoch.count() % 1'000'000'000);
    limit = &until;
  }
  if (::syscall(SYS_futex_waitv, waiters.data(), static_cast<unsigned>(words.size()), 0u, limit, CLOCK_MONOTONIC) >=
      0) {
    return true;
  }
  if (errno == ENOSYS || errno == EPERM) return false;  // before Linux 5.16, or refused by a seccomp filter
  if (errno == EAGAIN || errno == ETIMEDOUT || errno == EINTR) return true;
  throw_errno("futex_waitv");
}

void futex_wake(const std::atomic<std::uint32_t>& word, int count) {
  if (futex(word, FUTEX_WAKE, static_cast<std::uint32_t>(count), nullptr) < 0) throw_errno("futex(FUTEX_WAKE)");
}

}  // namespace ferry
