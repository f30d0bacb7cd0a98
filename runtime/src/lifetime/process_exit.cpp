#include "lifetime/process_exit.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "ferry/detail/unique_fd.hpp"

namespace ferry {

bool process_has_exited(pid_t pid, std::chrono::milliseconds grace) {
  if (pid <= 0) return false;
  // A pidfd becomes readable when the process exits (when it turns into a zombie), which a
  // plain kill(pid, 0) cannot see.
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd) {
    if (errno == ESRCH) return true;  // no such process: exited and reaped
    // No pidfds (kernel before 5.3, seccomp): only a reaped process can be recognised.
    return ::kill(pid, 0) != 0 && errno == ESRCH;
  }
  return pidfd_has_exited(pidfd.get(), grace);
}

bool pidfd_has_exited(int pidfd, std::chrono::milliseconds grace) {
  pollfd entry{pidfd, POLLIN, 0};
  while (true) {
    const int rc = ::poll(&entry, 1, static_cast<int>(grace.count()));
    if (rc >= 0) return rc > 0;
    if (errno != EINTR) return false;  // cannot tell: report the process as running
  }
}

}  // namespace ferry
