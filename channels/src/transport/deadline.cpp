#include "ferry/detail/deadline.hpp"

#include <poll.h>

#include <cerrno>

#include <algorithm>

#include "ferry/detail/end_stats.hpp"
#include "ferry/detail/live_ends.hpp"

#include "ferry/error.hpp"
#include "ferry/wait_interruption.hpp"

namespace ferry {

std::chrono::nanoseconds detail::Deadline::remaining() const {
  if (at_ == Clock::time_point::min()) return std::chrono::nanoseconds::zero();
  const auto left = at_ - Clock::now();
  return left > Clock::duration::zero() ? std::chrono::duration_cast<std::chrono::nanoseconds>(left)
                                        : std::chrono::nanoseconds::zero();
}

timespec detail::Deadline::remaining_timespec() const { return detail::to_timespec(remaining()); }

std::chrono::nanoseconds detail::sleep_limit(const detail::Deadline& deadline, bool& sliced,
                                             detail::SignalWake wake) noexcept {
  const std::chrono::nanoseconds left = deadline.is_never() ? std::chrono::nanoseconds::max() : deadline.remaining();
  const std::chrono::nanoseconds slice = detail::wait_interruption_slice(wake);
  sliced = slice < left;
  return sliced ? slice : left;
}

timespec detail::to_timespec(std::chrono::nanoseconds duration) noexcept {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(duration.count() / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(duration.count() % 1'000'000'000);
  return ts;
}

bool detail::wait_for_fd(int fd, short events, const detail::Deadline& deadline, detail::EndStats* charged) {
  pollfd entry{fd, events, 0};
  detail::BlockedSpan blocked(charged);
  if (blocked.active() && !deadline.expired()) blocked.begin_now();
  while (true) {
    // At most kReleaseCheck at a time while ends were copied by fork(): a long wait lets go
    // of this process's copies of ends that other processes own, which would keep their
    // peers waiting (live_ends.hpp); and at most the wait-interruption slice, so that an
    // installed check runs. Otherwise it sleeps until the descriptor or the deadline.
    bool sliced = false;
    const std::chrono::nanoseconds release = detail::release_check_slice();
    const std::chrono::nanoseconds limit = std::min(sleep_limit(deadline, sliced), release);
    const bool forever = limit == std::chrono::nanoseconds::max();
    const timespec timeout = to_timespec(limit);
    const int rc = ::ppoll(&entry, 1, forever ? nullptr : &timeout, nullptr);
    if (rc > 0) return true;
    if (rc == 0) {
      if (limit >= release / 2) detail::release_ends_owned_elsewhere();
      if (!deadline.is_never() && deadline.expired()) return false;
      if (sliced) detail::wait_interruption_point();
      continue;
    }
    if (errno != EINTR) throw_errno("ppoll on fd " + std::to_string(fd));
    detail::wait_interruption_point(true);
  }
}

}  // namespace ferry
