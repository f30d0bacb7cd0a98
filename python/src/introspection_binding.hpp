// ferry.snapshot(), ferry.enable_introspection() and ferry.disable_introspection(): the
// C++ introspection (ferry/introspection.hpp) for Python.
#pragma once

#include <pybind11/pybind11.h>

namespace ferry::python {

/// Adds _snapshot_json, enable_introspection, disable_introspection and
/// introspection_enabled to `module` (ferry.snapshot() parses the JSON, _introspection.py).
void bind_introspection(pybind11::module_& module);

}  // namespace ferry::python
