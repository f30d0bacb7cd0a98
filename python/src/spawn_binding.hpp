// What ferry.spawn (python/ferry/_spawn.py) needs from C++: a WorkerGroup whose forked
// workers run Python, the re-executed interpreter's entry for the spawn start method, and
// the handover of channel ends (keep only a worker's own ends in it, let go of them in the
// parent, describe them for a new interpreter).
#pragma once

#include <pybind11/pybind11.h>

namespace ferry::python {

/// Adds _ferry._WorkerGroup, _ferry._run_exec_worker and the end handover helpers to `module`.
void bind_spawn(pybind11::module_& module);

}  // namespace ferry::python
