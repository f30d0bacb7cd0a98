// PyValue: a ferry::Value message as the Python module sends and receives it. On the wire it
// is ferry::Value (the same type name, so the same fingerprint: a C++ end of Value and a
// Python end talk). Sent, it holds the Value converted from Python beforehand; read from a
// frame, its load builds the Python objects straight from the frame body under the GIL,
// with every check of Value's decoder (detail::read_value) and no Value tree in between.
// Taken from an in-process channel, it holds the sender's Value, converted when taken.
#pragma once

#include <pybind11/pybind11.h>

#include <string_view>
#include <utility>

#include "ferry/detail/archive.hpp"
#include "ferry/detail/type_name.hpp"
#include "ferry/value.hpp"

namespace ferry::python {

class PyValue {
 public:
  PyValue() = default;
  explicit PyValue(Value value) : value_(std::move(value)) {}
  PyValue(const PyValue& other);
  PyValue& operator=(const PyValue& other);
  PyValue(PyValue&& other) noexcept : value_(std::move(other.value_)), object_(std::exchange(other.object_, nullptr)) {}
  PyValue& operator=(PyValue&& other) noexcept;
  /// Drops the Python object it holds, taking the GIL for that if need be.
  ~PyValue();

  /// The message as a Python object (built when it was read, or converted from the Value
  /// now). Needs the GIL; leaves this empty.
  pybind11::object take();

  const Value& value() const noexcept { return value_; }
  /// Takes ownership of `object` (a new reference), dropping what it held. Needs the GIL.
  void reset(PyObject* object) noexcept;

 private:
  void release() noexcept;

  Value value_;
  PyObject* object_ = nullptr;  // owned
};

/// Writes the Value it holds (a PyValue being sent holds one).
void CEREAL_SAVE_FUNCTION_NAME(detail::FrameOutputArchive& archive, const PyValue& value);
/// Reads a Value body into Python objects, taking the GIL; ProtocolError as Value's decoder.
void CEREAL_LOAD_FUNCTION_NAME(detail::FrameInputArchive& archive, PyValue& value);

}  // namespace ferry::python

namespace ferry {
template <>
constexpr std::string_view detail::type_name<python::PyValue>() {
  return detail::type_name<Value>();
}
}  // namespace ferry
