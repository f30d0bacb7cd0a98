// Handing ferry.Sender / ferry.Receiver over to another process: the private functions
// python/ferry/_reductions.py builds multiprocessing's reductions on (describe an end for
// another process, mark it handed away, rebuild it from duplicated descriptors), and the
// ends' detach() / adopt() for a handover after os.fork().
#pragma once

#include <pybind11/pybind11.h>

namespace ferry::python {

/// Adds _describe_for_handover, _hand_away, _rebuild_end and the ends' detach()/adopt().
void bind_handover(pybind11::module_& module);

}  // namespace ferry::python
