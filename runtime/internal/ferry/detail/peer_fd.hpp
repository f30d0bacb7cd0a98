// Copying a file descriptor out of another process: how a receiver takes a segment that
// its sender names by fd number (transports that cannot pass fds: the pipe, the ring).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "ferry/detail/process_handle.hpp"
#include "ferry/detail/unique_fd.hpp"

namespace ferry::detail {

/// True when another process of the same user may take this process's descriptors
/// (pidfd_getfd, /proc/<pid>/fd/<n>) as far as this process can tell: it is dumpable and
/// holds no capabilities (or runs as root, whose peers are root too). False after
/// prctl(PR_SET_DUMPABLE, 0), a setuid() from root, or an exec of a binary with file
/// capabilities: the kernel then refuses such peers. Two system calls.
bool fds_takeable_by_peers() noexcept;

/// Takes descriptors of one peer process. Prefers pidfd_getfd(2) through a pidfd opened
/// once for the peer (one system call per descriptor); falls back to opening
/// /proc/<pid>/fd/<n> (path walk, permission checks, a new open file: about twice the
/// cost) where pidfd_getfd is missing (ENOSYS) or refused (EPERM: a seccomp profile, Yama
/// ptrace_scope, another user), and remembers the refusal so that it is not asked again.
///
/// The pidfd names the process that held `pid` when it was first asked for, never a later
/// one: once that process has exited, take() fails for its pid (and exited() says so)
/// instead of reaching a new process that reused the pid. One per connection (its sender is
/// one process); not thread-safe.
class PeerFdOpener {
 public:
  /// How a descriptor was taken.
  enum class Method : std::uint8_t { PidfdGetfd, ProcPath };
  /// A taken descriptor (close-on-exec), or an empty one with the errno of the failure.
  struct Taken {
    UniqueFd fd;
    int error = 0;
    Method method = Method::PidfdGetfd;
  };

  /// Takes descriptor `fd` of process `pid`. Never throws for a failure of the peer's
  /// side (see Taken::error); throws SystemError only for an unexpected local failure.
  Taken take(pid_t pid, int fd);
  /// How `take(pid, fd)` with `method` is named in messages ("/proc/12/fd/5" or
  /// "fd 5 of process 12 (pidfd_getfd)").
  static std::string describe(pid_t pid, int fd, Method method);
  /// After a failed take(): true when the process has exited, waiting up to `grace` for
  /// an exit in progress to complete. Asks the kept pidfd when there is one for `pid` (so a
  /// reused pid reads as exited), a new ProcessHandle otherwise.
  bool exited(pid_t pid, std::chrono::milliseconds grace) const;
  /// Closes the kept pidfd (the connection is over).
  void reset() noexcept;

  /// Process-wide switch, for tests and measurements: false makes every opener use
  /// /proc paths, as on a kernel without pidfd_getfd. Initially true, or false when the
  /// environment variable FERRY_NO_PIDFD_GETFD is set to a non-empty value.
  static void allow_pidfd_getfd(bool allowed) noexcept;
  /// Descriptors taken so far by this process with `method` (all openers together).
  static std::uint64_t taken_count(Method method) noexcept;
  /// Times pidfd_getfd was refused or missing and the opener fell back to /proc.
  static std::uint64_t fallback_count() noexcept;

 private:
  // Opens the pidfd of `pid` unless kept; false when pidfd_getfd is not to be used for it
  // (`taken.error` set when the process is gone or out of fds).
  bool ensure_pidfd(pid_t pid, Taken& taken);
  Taken take_by_proc(pid_t pid, int fd);

  pid_t pid_ = 0;  // the process pidfd_ names, or whose refusal is remembered
  ProcessHandle pidfd_;
  bool refused_ = false;  // pidfd_getfd refused for pid_: use /proc
};

}  // namespace ferry::detail
