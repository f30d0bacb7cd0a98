#include "introspection_binding.hpp"

#include <string>

#include "ferry/introspection.hpp"

namespace py = pybind11;

namespace ferry::python {

void bind_introspection(py::module_& module) {
  module.def(
      "_snapshot_json",
      [] {
        py::gil_scoped_release release;  // reads other threads' ends, never waits on them
        return to_json(snapshot());
      },
      "This process's figures as one line of JSON (ferry.snapshot() returns it parsed).");
  module.def(
      "enable_introspection",
      [] {
        py::gil_scoped_release release;
        enable_introspection();
      },
      "Turns introspection on: a background thread serves snapshots to `ferry ps`, `ferry top` and "
      "`ferry show` on the abstract socket @ferry-introspect.<pid>, for processes of the same user. "
      "Setting FERRY_INTROSPECT=1 before starting the process does the same.");
  module.def(
      "disable_introspection",
      [] {
        py::gil_scoped_release release;
        disable_introspection();
      },
      "Turns introspection off: the thread stops and the socket closes.");
  module.def("introspection_enabled", &introspection_enabled, "Whether introspection is on in this process.");
}

}  // namespace ferry::python
