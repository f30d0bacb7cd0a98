// ferry's exceptions as Python classes (ferry.Error and its subclasses ChannelClosed,
// PeerDied, ProtocolError, TypeMismatch), raised with the C++ message.
#pragma once

#include <pybind11/pybind11.h>

namespace ferry::python {

/// Adds the exception classes to `module` and translates ferry's C++ exceptions to them.
void bind_errors(pybind11::module_& module);

}  // namespace ferry::python
