// Helpers for the `ferry` tool's tests: run the tool and capture what it prints, and start
// fake introspection servers (fake_introspection_server.cpp) as real processes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ferry::test {

struct ToolRun {
  int exit_code = -1;  ///< -1 when it did not exit normally
  std::string out;
  std::string err;
  std::chrono::milliseconds took{0};
};

/// Runs the `ferry` binary with `args`; as `uid` (and gid) when given (needs root).
ToolRun run_tool(const std::vector<std::string>& args, std::optional<uid_t> uid = std::nullopt);

/// A fake introspection server process, killed and reaped by the destructor.
class FakeServer {
 public:
  /// Starts fake_introspection_server with `args`; returns once it listens.
  explicit FakeServer(const std::vector<std::string>& args);
  ~FakeServer();
  FakeServer(const FakeServer&) = delete;
  FakeServer& operator=(const FakeServer&) = delete;
  pid_t pid() const noexcept { return pid_; }
  /// Kills it with SIGKILL and reaps it.
  void kill();

 private:
  pid_t pid_ = -1;
};

}  // namespace ferry::test
