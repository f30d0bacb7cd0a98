#include "ferry/detail/deadline.hpp"

#include <poll.h>

#include <cerrno>

#include <algorithm>

#include "ferry/detail/live_ends.hpp"

#include "ferry/error.hpp"

namespace ferry {

std::chrono::nanoseconds Deadline::remaining() const {
  if (at_ == Clock::time_point::min()) return std::chrono::nanoseconds::zero();
  const auto left = at_ - Clock::now();
  return left > Clock::duration::zero() ? std::chrono::duration_cast<std::chrono::nanoseconds>(left)
                                        : std::chrono::nanoseconds::zero();
}

timespec Deadline::remaining_timespec() const {
  const auto left = remaining();
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(left.count() / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(left.count() % 1'000'000'000);
  return ts;
}

bool wait_for_fd(int fd, short events, const Deadline& deadline) {
  pollfd entry{fd, events, 0};
  while (true) {
    // At most kReleaseCheck at a time: a long wait lets go of this process's copies of
    // ends that other processes own, which would keep their peers waiting (live_ends.hpp).
    std::chrono::nanoseconds slice = detail::kReleaseCheck;
    if (!deadline.is_never()) slice = std::min(slice, deadline.remaining());
    const timespec timeout{static_cast<time_t>(slice.count() / 1'000'000'000),
                           static_cast<long>(slice.count() % 1'000'000'000)};
    const int rc = ::ppoll(&entry, 1, &timeout, nullptr);
    if (rc > 0) return true;
    if (rc == 0) {
      if (slice >= detail::kReleaseCheck / 2) detail::release_ends_owned_elsewhere();
      if (!deadline.is_never() && deadline.expired()) return false;
      continue;
    }
    if (errno != EINTR) throw_errno("ppoll on fd " + std::to_string(fd));
  }
}

}  // namespace ferry
