// Helpers for tests that run code in real child processes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ferry/detail/process_identity.hpp"
#include "ferry/detail/unique_fd.hpp"

namespace ferry::test {

/// Thrown by CHILD_CHECK inside a child process; the child exits with status 1.
struct ChildCheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Throws ChildCheckFailed naming the failed CHILD_CHECK (out of line: one call per check).
[[noreturn]] void child_check_failed(const char* file, int line, const char* condition);

/// Checks `condition` in a forked child (gtest assertions do not reach the parent).
#define CHILD_CHECK(condition)                                                           \
  do {                                                                                   \
    if (!(condition)) ::ferry::test::child_check_failed(__FILE__, __LINE__, #condition); \
  } while (false)

/// Forks; the child runs `body` and exits 0, or 1 after printing an exception's message.
pid_t fork_child(const std::function<void()>& body);

/// How a child ended.
struct ChildExit {
  bool exited = false;
  int code = -1;   ///< exit status when exited
  int signal = 0;  ///< terminating signal otherwise
  std::string describe() const;
};

/// Waits for `pid` (at most `timeout`, then kills it with SIGKILL and reports that).
ChildExit wait_child(pid_t pid, std::chrono::milliseconds timeout = std::chrono::seconds(30));

/// True when this process has no child processes at all (running or zombie).
bool has_no_children();

/// Waits for `pid` and returns true when it exited with status 0; prints why not.
bool child_succeeded(pid_t pid, std::chrono::milliseconds timeout = std::chrono::seconds(30));

/// `count` child processes (each `/bin/cat` reading a pipe) that do nothing but live until
/// end() (or the destructor) lets them exit and reaps them: living processes to fill a
/// return board's holder places.
class LivingChildren {
 public:
  explicit LivingChildren(std::size_t count);
  ~LivingChildren() { end(); }
  LivingChildren(const LivingChildren&) = delete;
  LivingChildren& operator=(const LivingChildren&) = delete;
  /// Their identities, as register_holder() takes them.
  const std::vector<detail::ProcessIdentity>& identities() const noexcept { return identities_; }
  /// Lets every child exit and reaps it; true when all exited with status 0.
  bool end();

 private:
  detail::UniqueFd keep_alive_;  // the write end of the pipe the children wait on
  std::vector<pid_t> pids_;
  std::vector<detail::ProcessIdentity> identities_;
};

}  // namespace ferry::test

namespace ferry::test {

/// A process that is not this one's descendant: forked twice, its middle parent exits at
/// once, so it is re-parented (to init or a subreaper) before `body` runs. It runs `body`
/// and exits; its outcome comes back through a pipe (it is not this process's child, so
/// waitpid cannot see it). It inherits this process's state as any fork does: `body`
/// should let go of what it must not hold (ferry ends: abandoned before `body` runs).
class UnrelatedProcess {
 public:
  explicit UnrelatedProcess(const std::function<void()>& body);
  ~UnrelatedProcess();
  UnrelatedProcess(const UnrelatedProcess&) = delete;
  UnrelatedProcess& operator=(const UnrelatedProcess&) = delete;
  pid_t pid() const noexcept { return pid_; }
  /// Waits (at most `timeout`, then kills it) for the process to end; true when `body`
  /// returned normally. Prints why not.
  bool succeeded(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  /// Kills it with SIGKILL and waits until it is gone.
  void kill();

 private:
  pid_t pid_ = -1;
  detail::UniqueFd outcome_;  // read end: "ok" once body returned; end of file when it exited
  bool finished_ = false;
};

}  // namespace ferry::test
