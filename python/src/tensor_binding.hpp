// ferry.Tensor (a ferry::Tensor seen from Python: shape, dtype, __dlpack__,
// __dlpack_device__, a writable __array_interface__) and ferry.empty(). ferry.Tensor is a
// plain CPython type holding the Tensor inline (cheap to make for every received tensor).
#pragma once

#include <pybind11/pybind11.h>

#include <string_view>

#include "ferry/dtype.hpp"
#include "ferry/tensor.hpp"

namespace ferry::python {

/// Adds ferry.Tensor and the module-level tensor functions to `module`.
void bind_tensor(pybind11::module_& module);

/// A new ferry.Tensor holding `tensor` (what a received message's tensors become). Needs the GIL.
pybind11::object wrap_tensor(Tensor&& tensor);
/// True when `object` is a ferry.Tensor.
bool is_tensor(pybind11::handle object);
/// The tensor a ferry.Tensor holds; TypeError for another object.
const Tensor& tensor_of(pybind11::handle object);

/// The DType named `name` ("float32", "bool", ...); ValueError for another name.
DType dtype_from_name(std::string_view name);

}  // namespace ferry::python
