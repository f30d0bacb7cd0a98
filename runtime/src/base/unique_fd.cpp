#include "ferry/detail/unique_fd.hpp"

#include <fcntl.h>
#include <unistd.h>

#include "ferry/error.hpp"

namespace ferry {

void detail::UniqueFd::reset(int fd) noexcept {
  if (fd_ >= 0) {
    // close() may report EINTR/EIO, but the descriptor is released on Linux either way,
    // and a destructor has no one to report to.
    (void)::close(fd_);
  }
  fd_ = fd;
}

detail::UniqueFd detail::UniqueFd::duplicate() const {
  const int copy = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) throw_errno("fcntl(F_DUPFD_CLOEXEC) on fd " + std::to_string(fd_));
  return detail::UniqueFd(copy);
}

}  // namespace ferry
