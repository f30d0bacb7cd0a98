// The errors of starting and supervising worker processes.
#pragma once

#include <sys/types.h>

#include <string>

#include "ferry/error.hpp"

namespace ferry {

/// A spawn request that cannot be carried out; raised before any process starts
/// (n <= 0, a worker name that is not registered, a missing ferry::init, a channel end
/// that cannot be handed to a worker ...).
class SpawnError : public Error {
 public:
  using Error::Error;
};

/// How a worker failed.
enum class WorkerFailure {
  Exception,    ///< the worker function threw; exception_type() and exception_message() say what
  ExitCode,     ///< the process exited with a non-zero status (exit_code())
  Signal,       ///< the process was killed by a signal (signal())
  StartFailed,  ///< the process could not start its worker (exec failed, init not called ...)
};

/// Raised by WorkerGroup::join() when a worker failed; the other workers of the group
/// were terminated before it was raised. what() names the rank and the cause, e.g.
/// "worker 2 of 4 (pid 1234) failed: std::runtime_error: bad input".
class WorkerFailed : public Error {
 public:
  /// Everything known about the failure; what() is composed from it.
  struct Details {
    int rank = -1;       ///< the failed worker's rank
    int world_size = 0;  ///< the size of its group
    pid_t pid = -1;      ///< its process id
    WorkerFailure failure = WorkerFailure::ExitCode;
    int exit_code = 0;            ///< the exit status (ExitCode, also set for Exception)
    int signal = 0;               ///< the signal (Signal)
    std::string exception_type;   ///< demangled, e.g. "std::runtime_error" (Exception)
    std::string message;          ///< the exception's what() (Exception) or what went wrong (StartFailed)
    int terminated_siblings = 0;  ///< how many other workers were still running and were terminated
  };

  /// Builds the error and its message ("worker 2 of 4 (pid 1234) failed: ...").
  explicit WorkerFailed(Details details);

  int rank() const noexcept { return details_.rank; }
  int world_size() const noexcept { return details_.world_size; }
  pid_t pid() const noexcept { return details_.pid; }
  WorkerFailure failure() const noexcept { return details_.failure; }
  int exit_code() const noexcept { return details_.exit_code; }
  int signal() const noexcept { return details_.signal; }
  const std::string& exception_type() const noexcept { return details_.exception_type; }
  /// The worker exception's what(), or the description of a start failure.
  const std::string& message() const noexcept { return details_.message; }
  const Details& details() const noexcept { return details_; }

 private:
  Details details_;
};

}  // namespace ferry
