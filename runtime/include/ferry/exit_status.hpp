// How a process ended: what WorkerGroup::exit_status() reports for a worker.
#pragma once

#include <string>

namespace ferry {

/// How a process ended.
struct ExitStatus {
  bool exited = false;  ///< it called exit(); `code` holds the status
  int code = 0;         ///< exit status when `exited`
  int signal = 0;       ///< the signal that killed it when !exited

  /// True for exit status 0.
  bool success() const noexcept { return exited && code == 0; }
  /// "exited with status 3", "was killed by signal SIGSEGV (Segmentation fault)".
  std::string describe() const;
};

}  // namespace ferry
