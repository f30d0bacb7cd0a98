// Telling whether another process has exited, for errors that a dead peer explains.
#pragma once

#include <sys/types.h>

#include <chrono>

namespace ferry {

/// True when process `pid` has exited (it is a zombie, was reaped, or never existed),
/// waiting up to `grace` for an exit in progress to complete; false when it is still
/// running after `grace`. A pid that has been reused by another process reads as running.
bool process_has_exited(pid_t pid, std::chrono::milliseconds grace);

/// True when the process behind `pidfd` has exited (a pidfd turns readable then, and never
/// names a later process with the same pid), waiting up to `grace`; false when it still
/// runs after `grace`, or when poll fails (the process is then taken as running).
bool pidfd_has_exited(int pidfd, std::chrono::milliseconds grace);

}  // namespace ferry
