#include "tool_runner.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace ferry::test {
namespace {

std::string read_whole(int fd) {
  std::string text;
  ::lseek(fd, 0, SEEK_SET);
  char buffer[65536];
  ssize_t got;
  while ((got = ::read(fd, buffer, sizeof buffer)) > 0) text.append(buffer, static_cast<std::size_t>(got));
  return text;
}

std::vector<char*> argv_of(const std::string& program, const std::vector<std::string>& args) {
  std::vector<char*> argv{const_cast<char*>(program.c_str())};
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  return argv;
}

}  // namespace

ToolRun run_tool(const std::vector<std::string>& args, std::optional<uid_t> uid) {
  int out = ::memfd_create("ferry-tool-out", MFD_CLOEXEC);
  int err = ::memfd_create("ferry-tool-err", MFD_CLOEXEC);
  if (out < 0 || err < 0) throw std::runtime_error(std::string("memfd_create: ") + std::strerror(errno));
  std::string program = FERRY_TOOL_PATH;
  std::vector<char*> argv = argv_of(program, args);
  auto started = std::chrono::steady_clock::now();
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    int null = ::open("/dev/null", O_RDONLY);
    ::dup2(null, STDIN_FILENO);
    if (uid && (::setgid(*uid) != 0 || ::setuid(*uid) != 0)) ::_exit(126);
    ::execv(program.c_str(), argv.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ToolRun run;
  run.took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.out = read_whole(out);
  run.err = read_whole(err);
  ::close(out);
  ::close(err);
  return run;
}

FakeServer::FakeServer(const std::vector<std::string>& args) {
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  std::string program = FERRY_FAKE_SERVER_PATH;
  std::vector<char*> argv = argv_of(program, args);
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    ::dup2(ready[1], STDOUT_FILENO);
    ::execv(program.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(ready[1]);
  pollfd polled{ready[0], POLLIN, 0};
  char line[16] = {};
  bool ok = ::poll(&polled, 1, 10000) == 1 && ::read(ready[0], line, sizeof line - 1) > 0 &&
            std::strncmp(line, "ready", 5) == 0;
  ::close(ready[0]);
  if (!ok) {
    kill();
    throw std::runtime_error("the fake introspection server did not start");
  }
}

FakeServer::~FakeServer() { kill(); }

void FakeServer::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

}  // namespace ferry::test
