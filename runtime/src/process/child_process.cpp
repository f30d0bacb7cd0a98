#include "ferry/detail/child_process.hpp"
#include "ferry/detail/worker_table.hpp"

#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "ferry/detail/process_handle.hpp"
#include "ferry/error.hpp"

namespace ferry {
namespace {

int send_pidfd_signal(int pidfd, int signal) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, signal, nullptr, 0));
}

ExitStatus status_from(const siginfo_t& info) {
  ExitStatus status;
  if (info.si_code == CLD_EXITED) {
    status.exited = true;
    status.code = info.si_status;
  } else {
    status.signal = info.si_status;  // CLD_KILLED or CLD_DUMPED
  }
  return status;
}

}  // namespace

std::string detail::signal_name(int signal) {
  if (signal >= SIGRTMIN && signal <= SIGRTMAX) {
    return signal == SIGRTMIN ? "SIGRTMIN" : "SIGRTMIN+" + std::to_string(signal - SIGRTMIN);
  }
  if (const char* abbreviation = ::sigabbrev_np(signal)) return std::string("SIG") + abbreviation;
  return "signal " + std::to_string(signal);
}

std::string ExitStatus::describe() const {
  if (exited) return "exited with status " + std::to_string(code);
  std::string text = "was killed by signal " + detail::signal_name(signal);
  if (const char* description = ::sigdescr_np(signal)) text += std::string(" (") + description + ")";
  return text;
}

detail::ChildProcess::ChildProcess(pid_t pid) : pid_(pid), owner_(::getpid()) {
  detail::ProcessHandle handle = detail::ProcessHandle::open(pid);
  if (!handle) {
    const int error = handle.error();
    ::kill(pid, SIGKILL);
    int ignored = 0;
    ::waitpid(pid, &ignored, 0);
    throw_system_error(
        "pidfd_open of child process " + std::to_string(pid) + " (ferry needs Linux 5.4 or newer to supervise workers)",
        error);
  }
  pidfd_ = handle.release_fd();
}

detail::ChildProcess::ChildProcess(detail::ChildProcess&& other) noexcept
    : pid_(other.pid_), owner_(other.owner_), pidfd_(std::move(other.pidfd_)), status_(other.status_) {
  other.pid_ = -1;
  other.status_.reset();
}

detail::ChildProcess& detail::ChildProcess::operator=(detail::ChildProcess&& other) noexcept {
  if (this != &other) {
    kill_and_reap();
    pid_ = other.pid_;
    owner_ = other.owner_;
    pidfd_ = std::move(other.pidfd_);
    status_ = other.status_;
    other.pid_ = -1;
    other.status_.reset();
  }
  return *this;
}

detail::ChildProcess::~ChildProcess() { kill_and_reap(); }

void detail::ChildProcess::kill_and_reap() noexcept {
  if (!running()) return;
  if (::getpid() != owner_) {  // a forked copy: the process is not ours to kill
    pidfd_.reset();
    return;
  }
  (void)send_pidfd_signal(pidfd_.get(), SIGKILL);
  try {
    reap(true);
  } catch (const Error&) {
    // Somebody else reaped it (SIGCHLD ignored); there is nothing left to clean up.
  }
  pidfd_.reset();
}

std::optional<ExitStatus> detail::ChildProcess::reap(bool block) {
  if (!running()) return status_;
  siginfo_t info;
  std::memset(&info, 0, sizeof info);
  while (::waitid(P_PIDFD, static_cast<id_t>(pidfd_.get()), &info, WEXITED | (block ? 0 : WNOHANG)) != 0) {
    if (errno == EINTR) continue;
    const int error = errno;
    pidfd_.reset();
    if (error == ECHILD) {
      throw SystemError("cannot wait for child process " + std::to_string(pid_) +
                            ": it was reaped by someone else (is SIGCHLD ignored, or does a SIGCHLD handler "
                            "call wait()?); ferry must reap its own workers",
                        error);
    }
    throw_system_error("waitid for child process " + std::to_string(pid_), error);
  }
  if (info.si_pid == 0) return std::nullopt;  // still running (WNOHANG)
  status_ = status_from(info);
  detail::record_child_ended(pid_, *status_);  // introspection's list of workers
  pidfd_.reset();
  return status_;
}

std::optional<ExitStatus> detail::ChildProcess::try_wait() { return reap(false); }

ExitStatus detail::ChildProcess::wait() {
  if (pid_ < 0) throw Error("ChildProcess::wait on an empty ChildProcess");
  return *reap(true);
}

void detail::ChildProcess::send_signal(int signal) {
  if (!running() || ::getpid() != owner_) return;
  if (send_pidfd_signal(pidfd_.get(), signal) != 0 && errno != ESRCH) {
    throw_errno("sending " + detail::signal_name(signal) + " to child process " + std::to_string(pid_));
  }
}

}  // namespace ferry
