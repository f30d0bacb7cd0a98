// A forked helper process for ping-pong benchmarks: started before the timing loop,
// reaped (or killed) when the benchmark function returns.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <functional>

namespace ferry::bench {

/// Runs `body` in a forked child that then exits; the destructor waits for it for up to
/// two seconds and kills it with SIGKILL if it is still running. With two or more CPUs,
/// the child is pinned to the last CPU and the calling thread to the first (restored by
/// the destructor), so that a ping-pong always crosses two cores.
class ChildProcess {
 public:
  explicit ChildProcess(const std::function<void()>& body);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
  bool restore_affinity_ = false;
  cpu_set_t saved_affinity_{};
};

}  // namespace ferry::bench
