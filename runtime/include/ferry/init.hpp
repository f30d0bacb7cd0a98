// ferry::init: the one line a program adds at the start of main() to use the spawn start
// method.
#pragma once

namespace ferry {

/// Call first thing in main(). In a process that ferry started as a worker (start method
/// Spawn: this program's binary re-executed), runs the worker and ends the process with
/// its exit status: it never returns there. In any other process it records argv (the
/// spawn start method re-executes the program with the same arguments) and returns.
void init(int argc, char** argv);

/// Whether init() was called in this process.
bool initialized() noexcept;

}  // namespace ferry
