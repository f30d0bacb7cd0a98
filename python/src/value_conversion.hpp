// Python objects to ferry::Value (what a Python send converts; received messages become
// Python objects in py_value.cpp). Python sends and receives exactly what Value holds: None, bool, int (int64), float,
// str, bytes, ferry.Tensor, list (a tuple goes as a list), dict with str keys; a torch or NumPy tensor goes as a
// Tensor: a view of ferry's memory without a copy when its elements lie in a ferry storage, else copied once into
// shared memory.
#pragma once

#include <pybind11/pybind11.h>

#include "ferry/value.hpp"

namespace ferry::python {

/// Converts `object`; TypeError for another type (naming it), OverflowError for an int
/// outside int64, ValueError for nesting deeper than kMaxValueDepth. Needs the GIL.
Value to_value(pybind11::handle object);

}  // namespace ferry::python
