#include "support/process.hpp"

#include "ferry/detail/live_ends.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
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
  const detail::UniqueFd read_end(fds[0]);
  keep_alive_ = detail::UniqueFd(fds[1]);
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
      const std::optional<detail::ProcessIdentity> identity = detail::identify_process(pid);
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

namespace ferry::test {
namespace {

// The state letter of /proc/<pid>/task/<tid>/stat ('?' when it cannot be read).
char thread_state(const std::filesystem::path& stat_path) {
  std::FILE* stat = std::fopen(stat_path.c_str(), "r");
  if (stat == nullptr) return '?';
  char state = '?';
  if (std::fscanf(stat, "%*d (%*[^)]) %c", &state) != 1) state = '?';
  std::fclose(stat);
  return state;
}

// True while any thread of `pid` runs. A zombie (which whoever adopted it has not reaped
// yet) is gone, but only once all its threads are: a killed process's main thread can be a
// zombie while another thread (a sanitizer's background thread) still exits, and the
// process's descriptors (a listening socket) close only when the last thread is gone.
bool is_running(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", error)) {
    const char state = thread_state(task.path() / "stat");
    if (state != 'Z' && state != 'X' && state != '?') return true;
  }
  return false;
}

}  // namespace

UnrelatedProcess::UnrelatedProcess(const std::function<void()>& body) {
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  detail::UniqueFd read_end(ends[0]);
  detail::UniqueFd write_end(ends[1]);
  std::fflush(nullptr);
  const pid_t middle = ::fork();
  if (middle < 0) throw std::runtime_error("fork failed");
  if (middle == 0) {
    read_end.reset();
    const pid_t middle_pid = ::getpid();
    const pid_t grandchild = ::fork();
    if (grandchild < 0) ::_exit(2);
    if (grandchild > 0) {
      (void)!::write(write_end.get(), &grandchild, sizeof grandchild);
      ::_exit(0);
    }
    // Re-parented once the middle process exited: wait for that, so that no ancestor of
    // this process is the test.
    while (::getppid() == middle_pid) std::this_thread::sleep_for(std::chrono::microseconds(50));
    int status = 1;
    try {
      detail::abandon_live_ends_except({});
      body();
      status = 0;
    } catch (const std::exception& error) {
      std::fprintf(stderr, "unrelated process %d failed: %s\n", ::getpid(), error.what());
    } catch (...) {
      std::fprintf(stderr, "unrelated process %d failed with an unknown exception\n", ::getpid());
    }
    std::fflush(nullptr);
    if (status == 0) (void)!::write(write_end.get(), "ok", 2);
    ::_exit(status);
  }
  write_end.reset();
  int status = 0;
  while (::waitpid(middle, &status, 0) < 0 && errno == EINTR) {
  }
  if (::read(read_end.get(), &pid_, sizeof pid_) != static_cast<ssize_t>(sizeof pid_)) {
    throw std::runtime_error("the unrelated process did not start");
  }
  outcome_ = std::move(read_end);
}

UnrelatedProcess::~UnrelatedProcess() {
  if (!finished_) kill();
}

bool UnrelatedProcess::succeeded(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string outcome;
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd entry{outcome_.get(), POLLIN, 0};
    const int rc = ::poll(&entry, 1, static_cast<int>(std::max<long>(0, left.count())));
    if (rc == 0) {
      std::fprintf(stderr, "unrelated process %d timed out and was killed\n", pid_);
      kill();
      return false;
    }
    if (rc < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    char buffer[8];
    const ssize_t got = ::read(outcome_.get(), buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    outcome.append(buffer, static_cast<std::size_t>(got));
  }
  // End of file: every copy of the write end is closed, so the process has exited (or
  // closed it while exiting). Wait until the pid is gone.
  while (is_running(pid_)) std::this_thread::sleep_for(std::chrono::microseconds(200));
  finished_ = true;
  if (outcome != "ok") std::fprintf(stderr, "unrelated process %d did not finish its work\n", pid_);
  return outcome == "ok";
}

void UnrelatedProcess::kill() {
  if (finished_ || pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  // Not our child: wait until it is gone (init reaps it).
  for (int i = 0; i < 20000 && is_running(pid_); ++i) std::this_thread::sleep_for(std::chrono::microseconds(200));
  finished_ = true;
}

}  // namespace ferry::test
