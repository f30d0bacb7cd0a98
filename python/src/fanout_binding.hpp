// ferry.Selector (many receivers waited on from one thread), ferry.Distributor (each
// message to one consumer) and ferry.Broadcast (each message to every consumer) over
// Python ends: the C++ classes for ferry.Value messages, waiting without the GIL.
#pragma once

#include <pybind11/pybind11.h>

namespace ferry::python {

/// Adds ferry.Selector, ferry.Distributor and ferry.Broadcast to `module`.
void bind_fanout(pybind11::module_& module);

}  // namespace ferry::python
