// A forked helper process for ping-pong benchmarks: started before the timing loop,
// reaped (or killed) when the benchmark function returns.
#pragma once

#include <sys/types.h>

#include <functional>

namespace ferry::bench {

/// Runs `body` in a forked child that then exits; the destructor waits for it for up to
/// two seconds and kills it with SIGKILL if it is still running.
class ChildProcess {
 public:
  explicit ChildProcess(const std::function<void()>& body);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
};

}  // namespace ferry::bench
