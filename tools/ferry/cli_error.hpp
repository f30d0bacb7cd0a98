// The `ferry` tool's errors and exit codes. Contract: every failure the tool reports is a
// CliError carrying the exit code the program ends with; main() prints its message on stderr
// prefixed by "ferry: " and exits with that code. The codes are documented in `ferry --help`.
#pragma once

#include <stdexcept>
#include <string>

namespace ferry::cli {

/// The tool's exit codes (stable: scripts test them).
enum class ExitCode : int {
  ok = 0,
  failure = 1,          ///< anything else: /proc/net/unix unreadable, terminal error, ...
  usage = 2,            ///< bad command line
  no_such_process = 3,  ///< no process with that pid has introspection on
  permission = 4,       ///< the process belongs to another user (run as that user or root)
  bad_reply = 5,        ///< the process did not answer properly: timed out, garbage, squatted name
};

class CliError : public std::runtime_error {
 public:
  CliError(ExitCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ExitCode code() const noexcept { return code_; }

 private:
  ExitCode code_;
};

}  // namespace ferry::cli
