#include "tensor_binding.hpp"

#include <pybind11/stl.h>

#include <string>
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
    throw py::value_error("__dlpack__: a CPU tensor takes no stream (got " + py::repr(stream).cast<std::string>() + ")");
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

DType dtype_from_name(std::string_view name) {
  for (int raw = 0; raw < kDTypeCount; ++raw) {
    const auto dtype = static_cast<DType>(raw);
    if (dtype_name(dtype) == name) return dtype;
  }
  throw py::value_error("ferry has no dtype '" + std::string(name) +
                        "'; use bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32 or float64");
}

void bind_tensor(py::module_& module) {
  py::class_<Tensor>(module, "Tensor",
                     "A tensor in ferry's memory. torch.from_dlpack(t) and numpy.asarray(t) view its elements "
                     "without a copy; a tensor received from a channel views the sender's pages.")
      .def_property_readonly("shape", [](const Tensor& t) { return to_tuple(t.shape()); })
      .def_property_readonly("strides", [](const Tensor& t) { return to_tuple(t.strides()); },
                             "Strides in elements (not bytes, unlike NumPy).")
      .def_property_readonly("dtype", [](const Tensor& t) { return std::string(dtype_name(t.dtype())); })
      .def_property_readonly("device", [](const Tensor& t) { return t.device().to_string(); })
      .def_property_readonly("storage_offset", &Tensor::storage_offset)
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def_property_readonly("is_shared", &Tensor::is_shared,
                             "True when the elements are in shared memory: sending copies no bytes.")
      .def_property_readonly("data_ptr", [](const Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.data_ptr()); })
      .def("numel", &Tensor::numel)
      .def("dim", &Tensor::dim)
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("shares_storage_with", &Tensor::shares_storage_with, py::arg("other"))
      .def("__dlpack__", &dlpack_capsule, py::arg("stream") = py::none(),
           "A DLPack capsule viewing the elements (data at element 0); bool tensors are refused (DLPack 0.6).")
      .def("__dlpack_device__", &dlpack_device)
      .def_property_readonly("__array_interface__", &array_interface)
      .def("__repr__", &Tensor::to_string);

  module.def(
      "_empty",
      [](const std::vector<std::int64_t>& shape, std::string_view dtype) {
        return Tensor::empty(shape_from(shape), dtype_from_name(dtype), Device::SharedCpu);
      },
      py::arg("shape"), py::arg("dtype"));
}

}  // namespace ferry::python
