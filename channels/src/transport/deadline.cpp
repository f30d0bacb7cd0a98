#include "ferry/detail/deadline.hpp"

#include <poll.h>

#include <cerrno>

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
    timespec left{};
    const timespec* timeout = nullptr;
    if (!deadline.is_never()) {
      left = deadline.remaining_timespec();
      timeout = &left;
    }
    const int rc = ::ppoll(&entry, 1, timeout, nullptr);
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) throw_errno("ppoll on fd " + std::to_string(fd));
  }
}

}  // namespace ferry
