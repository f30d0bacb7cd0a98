// ferry.Tensor (a ferry::Tensor seen from Python: shape, dtype, __dlpack__,
// __dlpack_device__, a writable __array_interface__) and ferry.empty().
#pragma once

#include <pybind11/pybind11.h>

#include <string_view>

#include "ferry/dtype.hpp"

namespace ferry::python {

/// Adds ferry.Tensor and the module-level tensor functions to `module`.
void bind_tensor(pybind11::module_& module);

/// The DType named `name` ("float32", "bool", ...); ValueError for another name.
DType dtype_from_name(std::string_view name);

}  // namespace ferry::python
