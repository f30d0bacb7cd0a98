#include "support/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <thread>

namespace ferry::test {

void child_check_failed(const char* file, int line, const char* condition) {
  throw ChildCheckFailed(std::string(file) + ":" + std::to_string(line) + ": CHILD_CHECK(" + condition + ") failed");
}

pid_t fork_child(const std::function<void()>& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int status = 0;
    try {
      body();
    } catch (const std::exception& error) {
      std::fprintf(stderr, "child %d failed: %s\n", ::getpid(), error.what());
      status = 1;
    } catch (...) {
      std::fprintf(stderr, "child %d failed with an unknown exception\n", ::getpid());
      status = 1;
    }
    std::fflush(nullptr);
    ::_exit(status);
  }
  return pid;
}

std::string ChildExit::describe() const {
  if (exited) return "exited with status " + std::to_string(code);
  return std::string("killed by signal ") + ::strsignal(signal);
}

ChildExit wait_child(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (true) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0) return ChildExit{};
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      std::fprintf(stderr, "child %d timed out and was killed\n", pid);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ChildExit result;
  if (WIFEXITED(status)) {
    result.exited = true;
    result.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  return result;
}

bool child_succeeded(pid_t pid, std::chrono::milliseconds timeout) {
  const ChildExit result = wait_child(pid, timeout);
  if (result.exited && result.code == 0) return true;
  std::fprintf(stderr, "child %d %s\n", pid, result.describe().c_str());
  return false;
}

bool has_no_children() {
  siginfo_t info{};
  return ::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 && errno == ECHILD;
}

LivingChildren::LivingChildren(std::size_t count) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  const UniqueFd read_end(fds[0]);
  keep_alive_ = UniqueFd(fds[1]);
  // Each child is `cat` reading the pipe, which ends when the write end closes: spawned, not
  // forked, since forking a sanitizer-instrumented test process hundreds of times takes seconds.
  posix_spawn_file_actions_t actions;
  if (::posix_spawn_file_actions_init(&actions) != 0) throw std::runtime_error("posix_spawn_file_actions_init failed");
  ::posix_spawn_file_actions_adddup2(&actions, read_end.get(), STDIN_FILENO);
  char program[] = "/bin/cat";
  char* const argv[] = {program, nullptr};
  char* const envp[] = {nullptr};
  try {
    for (std::size_t i = 0; i < count; ++i) {
      pid_t pid = -1;
      if (const int rc = ::posix_spawn(&pid, program, &actions, nullptr, argv, envp); rc != 0) {
        throw std::runtime_error(std::string("posix_spawn of /bin/cat failed: ") + std::strerror(rc));
      }
      pids_.push_back(pid);
      const std::optional<ProcessIdentity> identity = identify_process(pid);
      if (!identity) throw std::runtime_error("a living child has no identity in /proc");
      identities_.push_back(*identity);
    }
  } catch (...) {
    ::posix_spawn_file_actions_destroy(&actions);
    end();  // no destructor runs: reap the children spawned so far
    throw;
  }
  ::posix_spawn_file_actions_destroy(&actions);
}

bool LivingChildren::end() {
  keep_alive_.reset();  // every child's read returns 0
  bool all_succeeded = true;
  for (const pid_t pid : pids_) all_succeeded = child_succeeded(pid) && all_succeeded;
  pids_.clear();
  return all_succeeded;
}

}  // namespace ferry::test
