#include "ferry/detail/unique_fd.hpp"

#include <fcntl.h>

#include "ferry/error.hpp"

namespace ferry {

detail::UniqueFd detail::UniqueFd::duplicate() const {
  const int copy = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) throw_errno("fcntl(F_DUPFD_CLOEXEC) on fd " + std::to_string(fd_));
  return detail::UniqueFd(copy);
}

}  // namespace ferry
