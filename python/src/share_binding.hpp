// What ferry.share (python/ferry/_share.py) asks C++: whether a range of memory already
// lies in a ferry storage handed to Python (then sending it copies nothing).
#pragma once

#include <pybind11/pybind11.h>

namespace ferry::python {

/// Adds _ferry._in_ferry_memory to `module`.
void bind_share(pybind11::module_& module);

}  // namespace ferry::python
