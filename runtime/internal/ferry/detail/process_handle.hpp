// The one way ferry watches another process: a pidfd, which never names a later process
// that reuses the pid, together with the process's start time (ProcessIdentity).
#pragma once

#include <sys/types.h>

#include <chrono>

#include "ferry/detail/process_identity.hpp"
#include "ferry/detail/unique_fd.hpp"

namespace ferry::detail {

/// A pidfd on one process (close-on-exec), or an empty handle that remembers why it could
/// not be opened. Move-only.
class ProcessHandle {
 public:
  ProcessHandle() = default;
  /// Opens a handle on the process that has pid `pid` now. Never throws: when pidfd_open
  /// fails the handle is empty and error() is its errno (ESRCH: no such process; ENOSYS: a
  /// kernel without pidfds).
  static ProcessHandle open(pid_t pid) noexcept;
  /// Opens a handle on `process`: empty with ESRCH when its pid names a later process now.
  static ProcessHandle open(const ProcessIdentity& process) noexcept;

  /// True when the handle holds a pidfd.
  explicit operator bool() const noexcept { return static_cast<bool>(fd_); }
  int fd() const noexcept { return fd_.get(); }
  pid_t pid() const noexcept { return identity_.pid; }
  /// The process's pid and start time (start time 0 when it could not be read).
  const ProcessIdentity& identity() const noexcept { return identity_; }
  /// The errno of a failed open (0 when the handle holds a pidfd).
  int error() const noexcept { return error_; }

  /// True when the process has exited (a zombie counts), waiting up to `grace` for an exit
  /// in progress. Without a pidfd: true when the open found no such process; otherwise it
  /// asks /proc (pid and start time, see process_alive()) or, lacking a start time,
  /// kill(pid, 0), without waiting. A failing poll reads as running.
  bool exited(std::chrono::milliseconds grace = std::chrono::milliseconds(0)) const noexcept;
  /// Hands the pidfd over; the handle is empty afterwards.
  UniqueFd release_fd() noexcept { return std::move(fd_); }

 private:
  ProcessIdentity identity_;
  UniqueFd fd_;
  int error_ = 0;
};

}  // namespace ferry::detail
