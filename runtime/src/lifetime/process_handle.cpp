#include "ferry/detail/process_handle.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <optional>

namespace ferry {
namespace {

// The start time of `pid`, or 0 when it cannot be read (gone, or /proc unreadable).
std::uint64_t start_time_of(pid_t pid) noexcept {
  try {
    const std::optional<detail::ProcessIdentity> process = detail::identify_process(pid);
    return process ? process->start_time : 0;
  } catch (...) {
    return 0;
  }
}

}  // namespace

detail::ProcessHandle detail::ProcessHandle::open(pid_t pid) noexcept {
  detail::ProcessHandle handle;
  handle.identity_.pid = pid;
  if (pid <= 0) {
    handle.error_ = EINVAL;
    return handle;
  }
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0) {
    handle.error_ = errno;
    if (handle.error_ == ESRCH) return handle;  // no such process: nothing to read
  } else {
    handle.fd_.reset(static_cast<int>(fd));
  }
  // Read after the pidfd opened: the same process, unless it exited since (the pidfd tells).
  handle.identity_.start_time = start_time_of(pid);
  return handle;
}

detail::ProcessHandle detail::ProcessHandle::open(const detail::ProcessIdentity& process) noexcept {
  detail::ProcessHandle handle = open(process.pid);
  const std::uint64_t found = handle.identity_.start_time;
  if (found != 0 && process.start_time != 0 && found != process.start_time) {
    handle.fd_.reset();  // a later process with the same pid: `process` has exited
    handle.error_ = ESRCH;
  }
  if (handle.error_ == ESRCH || handle.identity_.start_time == 0) handle.identity_ = process;
  return handle;
}

bool detail::ProcessHandle::exited(std::chrono::milliseconds grace) const noexcept {
  if (fd_) {
    // A pidfd turns readable when the process exits (when it becomes a zombie).
    pollfd entry{fd_.get(), POLLIN, 0};
    while (true) {
      const int rc = ::poll(&entry, 1, static_cast<int>(grace.count()));
      if (rc >= 0) return rc > 0;
      if (errno != EINTR) return false;  // cannot tell: report the process as running
    }
  }
  if (identity_.pid <= 0) return false;
  if (error_ == ESRCH) return true;  // there was no such process when the handle was opened
  // No pidfd (a kernel before 5.3, seccomp, out of fds).
  if (identity_.start_time != 0) return !detail::process_alive(identity_);
  return ::kill(identity_.pid, 0) != 0 && errno == ESRCH;  // only a reaped process is recognised
}

}  // namespace ferry
