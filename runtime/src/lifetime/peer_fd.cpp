#include "ferry/detail/peer_fd.hpp"

#include <fcntl.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>

#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438  // the same number on every architecture (Linux 5.6)
#endif

namespace ferry {
namespace {

bool allowed_by_environment() noexcept {
  const char* value = std::getenv("FERRY_NO_PIDFD_GETFD");
  return value == nullptr || *value == '\0';
}

std::atomic<bool> g_allowed{allowed_by_environment()};
std::atomic<bool> g_missing{false};  // the kernel (or a filter) answered ENOSYS once
std::atomic<std::uint64_t> g_taken_by_pidfd{0};
std::atomic<std::uint64_t> g_taken_by_proc{0};
std::atomic<std::uint64_t> g_fallbacks{0};

bool pidfd_getfd_usable() noexcept {
  return g_allowed.load(std::memory_order_relaxed) && !g_missing.load(std::memory_order_relaxed);
}

// Failures that /proc would meet as well: the process or its fd is gone, or this process
// is out of fds. Everything else (EPERM above all) may be a refusal of pidfd_getfd alone.
bool peer_side_failure(int error) noexcept {
  return error == ESRCH || error == EBADF || error == EMFILE || error == ENFILE || error == ENOMEM;
}

}  // namespace

bool detail::fds_takeable_by_peers() noexcept {
  // The kernel's rule (ptrace_may_access with PTRACE_MODE_READ, which opening
  // /proc/<pid>/fd/<n> needs): a process that is not dumpable (SUID_DUMP_USER, 1) is
  // refused to unprivileged peers, and so is one whose permitted capabilities the peer lacks.
  if (::prctl(PR_GET_DUMPABLE) != 1) return false;
  if (::geteuid() == 0) return true;
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3]{};
  if (::syscall(SYS_capget, &header, data) != 0) return false;  // cannot tell: pass fds
  for (const auto& word : data) {
    if (word.permitted != 0) return false;
  }
  return true;
}

bool detail::PeerFdOpener::ensure_pidfd(pid_t pid, Taken& taken) {
  if (pid_ == pid) return !refused_;
  refused_ = false;
  pid_ = pid;
  pidfd_ = detail::ProcessHandle::open(pid);
  if (pidfd_) return true;
  const int error = pidfd_.error();
  if (error == ENOSYS) {
    g_missing.store(true, std::memory_order_relaxed);
    pid_ = 0;
    g_fallbacks.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  if (peer_side_failure(error)) {
    pid_ = 0;  // nothing kept: ask again next time
    taken.error = error;
    return false;
  }
  refused_ = true;
  g_fallbacks.fetch_add(1, std::memory_order_relaxed);
  return false;
}

detail::PeerFdOpener::Taken detail::PeerFdOpener::take(pid_t pid, int fd) {
  Taken taken;
  if (pidfd_getfd_usable()) {
    if (ensure_pidfd(pid, taken)) {
      // The new descriptor is close-on-exec (pidfd_getfd(2) sets FD_CLOEXEC).
      const long got = ::syscall(SYS_pidfd_getfd, pidfd_.fd(), fd, 0);
      if (got >= 0) {
        taken.fd.reset(static_cast<int>(got));
        g_taken_by_pidfd.fetch_add(1, std::memory_order_relaxed);
        return taken;
      }
      const int error = errno;
      if (peer_side_failure(error)) {
        taken.error = error;
        return taken;
      }
      if (error == ENOSYS) {
        g_missing.store(true, std::memory_order_relaxed);
      } else {
        refused_ = true;  // EPERM: the pidfd stays, to tell when the peer exits
      }
      g_fallbacks.fetch_add(1, std::memory_order_relaxed);
    } else if (taken.error != 0) {
      return taken;
    }
  }
  return take_by_proc(pid, fd);
}

detail::PeerFdOpener::Taken detail::PeerFdOpener::take_by_proc(pid_t pid, int fd) {
  Taken taken;
  taken.method = Method::ProcPath;
  const std::string path = describe(pid, fd, Method::ProcPath);
  taken.fd.reset(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!taken.fd) {
    taken.error = errno;
  } else {
    g_taken_by_proc.fetch_add(1, std::memory_order_relaxed);
  }
  return taken;
}

std::string detail::PeerFdOpener::describe(pid_t pid, int fd, Method method) {
  std::string text = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  if (method == Method::PidfdGetfd) text += " (taken with pidfd_getfd)";
  return text;
}

bool detail::PeerFdOpener::exited(pid_t pid, std::chrono::milliseconds grace) const {
  // The kept pidfd never names a later process that reused the pid.
  return pid == pid_ && pidfd_ ? pidfd_.exited(grace) : detail::ProcessHandle::open(pid).exited(grace);
}

void detail::PeerFdOpener::reset() noexcept {
  pidfd_ = detail::ProcessHandle();
  pid_ = 0;
  refused_ = false;
}

void detail::PeerFdOpener::allow_pidfd_getfd(bool allowed) noexcept {
  g_allowed.store(allowed, std::memory_order_relaxed);
}

std::uint64_t detail::PeerFdOpener::taken_count(Method method) noexcept {
  return (method == Method::PidfdGetfd ? g_taken_by_pidfd : g_taken_by_proc).load(std::memory_order_relaxed);
}

std::uint64_t detail::PeerFdOpener::fallback_count() noexcept { return g_fallbacks.load(std::memory_order_relaxed); }

}  // namespace ferry
