#include "tensor_binding.hpp"

#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "export_registry.hpp"
#include "ferry/dlpack.hpp"
#include "ferry/tensor.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

constexpr const char* kCapsuleName = "dltensor";

// A capsule no consumer took still owns its DLManagedTensor (a consumer renames it to
// "used_dltensor" and calls the deleter itself).
void release_unconsumed_capsule(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, kCapsuleName) == 0) return;  // consumed (renamed): not ours any more
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

py::capsule dlpack_capsule(const Tensor& tensor, const py::object& stream) {
  if (!stream.is_none() && tensor.device().is_cpu()) {
    throw py::value_error("__dlpack__: a CPU tensor takes no stream (got " + py::repr(stream).cast<std::string>() +
                          ")");
  }
  ExportRegistry::instance().add(tensor.storage());
  DLManagedTensor* managed = to_dlpack(tensor);
  PyObject* capsule = PyCapsule_New(managed, kCapsuleName, release_unconsumed_capsule);
  if (capsule == nullptr) {
    managed->deleter(managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

py::tuple dlpack_device(const Tensor& tensor) {
  const Device device = tensor.device();
  if (device.kind == DeviceKind::Cuda) return py::make_tuple(static_cast<int>(kDLCUDA), device.index);
  return py::make_tuple(static_cast<int>(kDLCPU), 0);
}

// NumPy's type string of `dtype`; NumPy has no bfloat16.
const char* array_typestr(DType dtype) {
  switch (dtype) {
    case DType::Bool: return "|b1";
    case DType::UInt8: return "|u1";
    case DType::Int8: return "|i1";
    case DType::Int16: return "<i2";
    case DType::Int32: return "<i4";
    case DType::Int64: return "<i8";
    case DType::Float16: return "<f2";
    case DType::Float32: return "<f4";
    case DType::Float64: return "<f8";
    case DType::BFloat16: break;
  }
  throw py::type_error("__array_interface__: NumPy has no bfloat16 type; use torch.from_dlpack(tensor) instead");
}

py::dict array_interface(const Tensor& tensor) {
  if (!tensor.defined()) throw py::value_error("__array_interface__: the tensor is undefined");
  if (!tensor.device().is_cpu()) {
    throw py::type_error("__array_interface__: the tensor lives on " + tensor.device().to_string() +
                         "; NumPy reads CPU memory only");
  }
  ExportRegistry::instance().add(tensor.storage());
  py::list shape;
  py::list strides;
  for (std::int64_t d = 0; d < tensor.dim(); ++d) {
    shape.append(tensor.size(d));
    strides.append(tensor.stride(d) * static_cast<std::int64_t>(tensor.element_size()));
  }
  py::dict interface;
  interface["version"] = 3;
  interface["typestr"] = array_typestr(tensor.dtype());
  interface["shape"] = py::tuple(shape);
  interface["strides"] = py::tuple(strides);
  // Writable; NumPy keeps this Tensor object (and so the storage) alive as the array's base.
  interface["data"] = py::make_tuple(reinterpret_cast<std::uintptr_t>(tensor.data_ptr()), false);
  return interface;
}

py::tuple to_tuple(const Shape& entries) {
  py::tuple tuple(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) tuple[i] = entries[i];
  return tuple;
}

Shape shape_from(const std::vector<std::int64_t>& extents) {
  Shape shape;
  for (const std::int64_t extent : extents) {
    if (extent < 0) throw py::value_error("a tensor's shape has a negative size " + std::to_string(extent));
    shape.push_back(extent);
  }
  return shape;
}

}  // namespace

// ---- the ferry.Tensor type ------------------------------------------------------------------
//
// A plain CPython heap type holding the ferry::Tensor inline, not a pybind11 class: a
// received message makes one of these per tensor, and pybind11's instances cost a type
// lookup, a holder allocation and an entry in its instance registry each (about 2,000
// instructions to make and free one; this type takes a few hundred). The methods are
// pybind11 functions taking the object as a handle.

namespace {

struct TensorObject {
  PyObject_HEAD Tensor tensor;
};

PyTypeObject* tensor_type = nullptr;  // made by bind_tensor; one reference kept for the process

void tensor_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  std::destroy_at(&reinterpret_cast<TensorObject*>(self)->tensor);
  type->tp_free(self);
  Py_DECREF(type);  // an instance of a heap type holds a reference to it
}

const char* const kTensorDoc =
    "A tensor in ferry's memory. torch.from_dlpack(t) and numpy.asarray(t) view its elements "
    "without a copy; a tensor received from a channel views the sender's pages.";

}  // namespace

bool is_tensor(py::handle object) { return tensor_type != nullptr && PyObject_TypeCheck(object.ptr(), tensor_type); }

const Tensor& tensor_of(py::handle object) {
  if (!is_tensor(object)) {
    throw py::type_error("expected a ferry.Tensor, not " +
                         py::str(py::type::of(object).attr("__qualname__")).cast<std::string>());
  }
  return reinterpret_cast<TensorObject*>(object.ptr())->tensor;
}

py::object wrap_tensor(Tensor&& tensor) {
  PyObject* made = tensor_type->tp_alloc(tensor_type, 0);  // zeroed; takes a reference to the type
  if (made == nullptr) throw py::error_already_set();
  static_assert(std::is_nothrow_move_constructible_v<Tensor>);
  new (&reinterpret_cast<TensorObject*>(made)->tensor) Tensor(std::move(tensor));
  return py::reinterpret_steal<py::object>(made);
}

DType dtype_from_name(std::string_view name) {
  for (int raw = 0; raw < kDTypeCount; ++raw) {
    const auto dtype = static_cast<DType>(raw);
    if (dtype_name(dtype) == name) return dtype;
  }
  throw py::value_error("ferry has no dtype '" + std::string(name) +
                        "'; use bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32 or float64");
}

// tp_new: only ferry makes ferry.Tensor objects (wrap_tensor), so that each holds a
// constructed Tensor; also copy.copy, pickle and type(t)() come here (Python before 3.10 has
// no Py_TPFLAGS_DISALLOW_INSTANTIATION).
PyObject* refuse_new(PyTypeObject* /*type*/, PyObject* /*args*/, PyObject* /*kwargs*/) {
  PyErr_SetString(PyExc_TypeError,
                  "ferry.Tensor objects are made by ferry.empty() and by receiving messages; they cannot be "
                  "constructed, copied or pickled (use torch.from_dlpack or numpy.asarray to copy one)");
  return nullptr;
}

void bind_tensor(py::module_& module) {
  PyType_Slot slots[] = {
      {Py_tp_dealloc, reinterpret_cast<void*>(&tensor_dealloc)},
      {Py_tp_new, reinterpret_cast<void*>(&refuse_new)},
      {Py_tp_doc, const_cast<char*>(kTensorDoc)},
      {0, nullptr},
  };
  unsigned int flags = Py_TPFLAGS_DEFAULT;
#ifdef Py_TPFLAGS_DISALLOW_INSTANTIATION
  flags |= Py_TPFLAGS_DISALLOW_INSTANTIATION;  // made by ferry only (ferry.empty, received messages)
#endif
  PyType_Spec spec{"ferry._ferry.Tensor", static_cast<int>(sizeof(TensorObject)), 0, flags, slots};
  const py::object type = py::reinterpret_steal<py::object>(PyType_FromSpec(&spec));
  if (!type) throw py::error_already_set();
  tensor_type = reinterpret_cast<PyTypeObject*>(type.inc_ref().ptr());

  const py::object property = py::module_::import("builtins").attr("property");
  const auto add_property = [&](const char* name, auto&& getter, const char* doc = "") {
    type.attr(name) = property(py::cpp_function([getter](py::handle self) { return getter(tensor_of(self)); }),
                               py::none(), py::none(), doc);
  };
  const auto add_method = [&](const char* name, auto&& method, auto&&... extra) {
    type.attr(name) =
        py::cpp_function(std::forward<decltype(method)>(method), py::name(name), py::is_method(type),
                         py::sibling(py::getattr(type, name, py::none())), std::forward<decltype(extra)>(extra)...);
  };
  add_property(
      "shape", [](const Tensor& t) { return to_tuple(t.shape()); }, "The extent of each dimension (a tuple).");
  add_property(
      "strides", [](const Tensor& t) { return to_tuple(t.strides()); },
      "Strides in elements (not bytes, unlike NumPy).");
  add_property(
      "dtype", [](const Tensor& t) { return std::string(dtype_name(t.dtype())); },
      "The element type's name, such as 'float32'.");
  add_property(
      "device", [](const Tensor& t) { return t.device().to_string(); },
      "Where the elements live: 'cpu' (private memory), 'shared_cpu' (ferry shared memory) or 'cuda:N'.");
  add_property(
      "storage_offset", [](const Tensor& t) { return t.storage_offset(); },
      "Index of element 0 in its storage, in elements.");
  add_property(
      "nbytes", [](const Tensor& t) { return t.nbytes(); }, "Bytes of the elements (numel() * element size).");
  add_property(
      "is_shared", [](const Tensor& t) { return t.is_shared(); },
      "True when the elements are in shared memory: sending copies no bytes.");
  add_property(
      "data_ptr", [](const Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.data_ptr()); },
      "The address of element 0 in this process.");
  add_property("__array_interface__", [](const Tensor& t) { return array_interface(t); });
  add_method(
      "numel", [](py::handle self) { return tensor_of(self).numel(); }, "The number of elements.");
  add_method(
      "dim", [](py::handle self) { return tensor_of(self).dim(); }, "The number of dimensions.");
  add_method(
      "is_contiguous", [](py::handle self) { return tensor_of(self).is_contiguous(); },
      "True when the elements are dense in row-major order.");
  add_method(
      "shares_storage_with",
      [](py::handle self, py::handle other) { return tensor_of(self).shares_storage_with(tensor_of(other)); },
      py::arg("other"), "True when `other` views the same storage (the same memory).");
  add_method(
      "__dlpack__", [](py::handle self, const py::object& stream) { return dlpack_capsule(tensor_of(self), stream); },
      py::arg("stream") = py::none(),
      "A DLPack capsule viewing the elements (data at element 0); bool tensors are refused (DLPack 0.6).");
  add_method("__dlpack_device__", [](py::handle self) { return dlpack_device(tensor_of(self)); });
  add_method("__repr__", [](py::handle self) { return tensor_of(self).to_string(); });
  module.add_object("Tensor", type);

  module.def(
      "_empty",
      [](const std::vector<std::int64_t>& shape, std::string_view dtype) {
        return wrap_tensor(Tensor::empty(shape_from(shape), dtype_from_name(dtype), Device::SharedCpu));
      },
      py::arg("shape"), py::arg("dtype"));
}

}  // namespace ferry::python
