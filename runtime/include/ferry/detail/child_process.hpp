// RAII ownership of a child process: its pid and a pidfd that poll() reports readable
// once the process has exited.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

#include "ferry/detail/unique_fd.hpp"
#include "ferry/exit_status.hpp"

namespace ferry::detail {

/// The name of a signal: "SIGSEGV", "SIGKILL", "SIGRTMIN+3"; "signal 99" when unknown.
std::string signal_name(int signal);

/// Owns a child process of this process. The owner must reap it (wait() or try_wait());
/// destroying a ChildProcess that still runs kills it with SIGKILL and reaps it, so no
/// child is ever left running or as a zombie by accident. A copy that a forked process
/// inherited is not its child: it never signals or kills the process. Move-only.
class ChildProcess {
 public:
  ChildProcess() = default;
  /// Takes ownership of `pid`, a child of this process that nobody has reaped yet. Opens a
  /// pidfd for it; throws SystemError (and kills and reaps the child) when that fails.
  explicit ChildProcess(pid_t pid);
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  /// The process id (kept after the process was reaped, for messages); -1 when empty.
  pid_t pid() const noexcept { return pid_; }
  /// A descriptor that poll() reports readable once the process exited; -1 once reaped.
  int pidfd() const noexcept { return pidfd_.get(); }
  /// True until the process has been reaped.
  bool running() const noexcept { return pidfd_.valid(); }
  /// How the process ended, once reaped.
  const std::optional<ExitStatus>& status() const noexcept { return status_; }

  /// Reaps the process if it has exited; returns its status then, std::nullopt while it
  /// runs. Throws SystemError when the process cannot be waited for (for instance when
  /// SIGCHLD is ignored and the kernel reaped it already).
  std::optional<ExitStatus> try_wait();
  /// Waits for the process to exit and reaps it.
  ExitStatus wait();
  /// Sends `signal` to the process (nothing when it was reaped already, or in a forked copy).
  /// Throws SystemError.
  void send_signal(int signal);

 private:
  std::optional<ExitStatus> reap(bool block);
  void kill_and_reap() noexcept;

  pid_t pid_ = -1;
  pid_t owner_ = -1;  // the process whose child it is
  UniqueFd pidfd_;
  std::optional<ExitStatus> status_;
};

}  // namespace ferry::detail
