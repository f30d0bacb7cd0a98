// ferry.listen, ferry.Listener (accept_sender / accept_receiver) and ferry.connect_sender /
// connect_receiver: ends of ferry::Value by address, as ferry/endpoint.hpp makes them in C++.
// Waiting (for a client, for a listener) releases the GIL.
#pragma once

#include <pybind11/pybind11.h>

namespace ferry::python {

/// Adds the endpoint functions and ferry.Listener to `module`.
void bind_endpoints(pybind11::module_& module);

}  // namespace ferry::python
