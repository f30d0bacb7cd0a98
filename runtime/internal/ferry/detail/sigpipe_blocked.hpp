// Writing to a pipe without touching the process's SIGPIPE disposition.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <cerrno>

namespace ferry::detail {

/// Blocks SIGPIPE in the calling thread for its lifetime (a write to a pipe), and takes back
/// the SIGPIPE that a write to a pipe without readers raises (consume() after EPIPE), so that
/// neither the process's disposition (which exec'd children inherit) nor its other threads
/// are touched. A SIGPIPE that was pending before, blocked by the program, stays pending.
/// Two system calls (three when the program blocks SIGPIPE itself).
class SigpipeBlocked {
 public:
  SigpipeBlocked() noexcept {
    ::sigemptyset(&sigpipe_);
    ::sigaddset(&sigpipe_, SIGPIPE);
    // Cannot fail with a valid `how` and valid sets.
    (void)::pthread_sigmask(SIG_BLOCK, &sigpipe_, &previous_);
    if (::sigismember(&previous_, SIGPIPE) == 1) {
      sigset_t pending;
      already_pending_ = ::sigpending(&pending) != 0 || ::sigismember(&pending, SIGPIPE) == 1;
    }
  }
  ~SigpipeBlocked() { (void)::pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  SigpipeBlocked(const SigpipeBlocked&) = delete;
  SigpipeBlocked& operator=(const SigpipeBlocked&) = delete;

  /// After a write failed with EPIPE: consumes the SIGPIPE it raised. Keeps errno.
  void consume() noexcept {
    if (already_pending_) return;
    const int saved = errno;
    const timespec zero{};
    while (::sigtimedwait(&sigpipe_, nullptr, &zero) < 0 && errno == EINTR) {
    }
    errno = saved;
  }

 private:
  sigset_t sigpipe_;
  sigset_t previous_;
  bool already_pending_ = false;
};

}  // namespace ferry::detail
