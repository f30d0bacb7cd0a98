// A forked helper process for ping-pong benchmarks: started before the timing loop,
// reaped (or killed) when the benchmark function returns.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <chrono>
#include <functional>

namespace ferry::bench {

/// Where a benchmark child (and the calling thread) run, on a machine with two or more CPUs.
enum class Placement {
  /// The child on the last CPU and the calling thread on the first (restored by the
  /// destructor), so that a ping-pong between them always crosses two cores.
  AcrossFromCaller,
  /// The child on the first CPU; the calling thread stays where it is.
  FirstCpu,
  /// The child on the last CPU; the calling thread stays where it is.
  LastCpu,
  /// Neither is pinned: both are left to the scheduler.
  Anywhere,
};

/// Runs `body` in a forked child that then exits (status 1, with the message on stderr, if
/// `body` throws); the destructor waits for it for up to `grace` and kills it with SIGKILL
/// if it is still running. Pinning is best effort: an unpinned run is still valid.
class ChildProcess {
 public:
  explicit ChildProcess(const std::function<void()>& body, Placement placement = Placement::AcrossFromCaller,
                        std::chrono::milliseconds grace = std::chrono::seconds(2));
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
  std::chrono::milliseconds grace_;
  bool restore_affinity_ = false;
  cpu_set_t saved_affinity_{};
};

}  // namespace ferry::bench
