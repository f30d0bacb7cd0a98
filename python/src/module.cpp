// The extension module ferry._ferry; the package ferry (python/ferry/__init__.py) is its
// public face.
#include <pybind11/pybind11.h>

#include "channel_binding.hpp"
#include "endpoints_binding.hpp"
#include "ends_binding.hpp"
#include "errors.hpp"
#include "fanout_binding.hpp"
#include "handover_binding.hpp"
#include "introspection_binding.hpp"
#include "share_binding.hpp"
#include "spawn_binding.hpp"
#include "tensor_binding.hpp"

PYBIND11_MODULE(_ferry, module) {
  module.doc() = "ferry: typed messages between processes, tensors without copies (C++ core).";
  module.attr("__version__") = FERRY_PYTHON_VERSION;  // the project version CMake knows
  ferry::python::bind_errors(module);
  ferry::python::bind_tensor(module);
  ferry::python::bind_ends(module);
  ferry::python::bind_endpoints(module);
  ferry::python::bind_channels(module);
  ferry::python::bind_fanout(module);
  ferry::python::bind_spawn(module);
  ferry::python::bind_share(module);
  ferry::python::bind_handover(module);
  ferry::python::bind_introspection(module);
}
