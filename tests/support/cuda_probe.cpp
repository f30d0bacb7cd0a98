#include "support/cuda_probe.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>

#include "ferry/cuda.hpp"

namespace ferry::test {
namespace {

std::string probe_in_child() {
  int ends[2];
  if (::pipe(ends) != 0) return "cannot probe for a GPU: pipe() failed";
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return "cannot probe for a GPU: fork() failed";
  if (pid == 0) {
    ::close(ends[0]);
    std::string reason;
    try {
      reason = cuda_unavailable_reason();
      if (reason.empty() && cuda_device_count() == 0) reason = "no CUDA device";
    } catch (const std::exception& error) {
      reason = error.what();
    }
    const char* data = reason.data();
    std::size_t left = reason.size();
    while (left > 0) {
      const ssize_t n = ::write(ends[1], data, left);
      if (n <= 0) break;
      data += n;
      left -= static_cast<std::size_t>(n);
    }
    ::_exit(0);
  }
  ::close(ends[1]);
  std::string reason;
  char buffer[512];
  for (ssize_t n; (n = ::read(ends[0], buffer, sizeof buffer)) > 0;) reason.append(buffer, static_cast<std::size_t>(n));
  ::close(ends[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "the GPU probe process crashed";
  return reason;
}

}  // namespace

std::string gpu_unavailable_reason() {
  static std::once_flag once;
  static std::string reason;
  std::call_once(once, [] { reason = probe_in_child(); });
  return reason;
}

}  // namespace ferry::test
