#include "value_conversion.hpp"

#include <dlpack/dlpack.h>

#include <optional>
#include <string>

#include "export_registry.hpp"
#include "ferry/dlpack.hpp"
#include "ferry/tensor.hpp"
#include "tensor_binding.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

// A foreign tensor's elements as found in its __array_interface__ or DLPack capsule.
struct ForeignView {
  const std::byte* element0 = nullptr;
  DType dtype = DType::Float32;
  Shape shape;
  Shape strides;  // in elements
};

// The tensor to send for `view`: a view of the ferry storage its elements lie in, or a
// copy in shared memory.
Tensor tensor_for(const ForeignView& view) {
  std::int64_t count = 1;
  std::int64_t last = 0;
  for (std::size_t d = 0; d < view.shape.size(); ++d) {
    if (view.strides[d] < 0) {
      throw py::value_error("ferry cannot send a tensor with a negative stride (" + std::to_string(view.strides[d]) +
                            "); send a contiguous copy");
    }
    count *= view.shape[d];
    if (view.shape[d] > 0) last += (view.shape[d] - 1) * view.strides[d];
  }
  if (count == 0) return Tensor::empty(view.shape, view.dtype, Device::SharedCpu);
  const std::size_t element = dtype_size(view.dtype);
  const auto span = static_cast<std::size_t>(last + 1) * element;
  if (std::shared_ptr<Storage> storage = ExportRegistry::instance().find(view.element0, span)) {
    const auto byte_offset = static_cast<std::size_t>(view.element0 - storage->data());
    if (byte_offset % element == 0) {  // viewing ferry memory: no copy
      return Tensor::from_storage(std::move(storage), view.dtype, view.shape, view.strides,
                                  static_cast<std::int64_t>(byte_offset / element));
    }
  }
  Tensor copy = Tensor::empty(view.shape, view.dtype, Device::SharedCpu);  // the one copy
  copy_strided(static_cast<std::byte*>(copy.data_ptr()), copy.strides(), view.element0, view.strides, view.shape,
               element);
  return copy;
}

std::optional<DType> dtype_from_typestr(const std::string& typestr) {
  if (typestr.size() != 3 || typestr[0] == '>') return std::nullopt;  // big-endian: not this machine's order
  const std::string kind = typestr.substr(1);
  if (kind == "b1") return DType::Bool;
  if (kind == "u1") return DType::UInt8;
  if (kind == "i1") return DType::Int8;
  if (kind == "i2") return DType::Int16;
  if (kind == "i4") return DType::Int32;
  if (kind == "i8") return DType::Int64;
  if (kind == "f2") return DType::Float16;
  if (kind == "f4") return DType::Float32;
  if (kind == "f8") return DType::Float64;
  return std::nullopt;
}

// A NumPy array (or anything with a version 3 __array_interface__ holding a data pointer).
Tensor tensor_from_array_interface(py::handle object, const py::dict& interface) {
  const auto typestr = interface["typestr"].cast<std::string>();
  const std::optional<DType> dtype = dtype_from_typestr(typestr);
  if (!dtype) throw py::type_error("ferry cannot send an array of NumPy type '" + typestr + "'");
  if (!py::isinstance<py::tuple>(interface["data"])) {
    throw py::type_error("ferry cannot send " + py::repr(py::type::of(object)).cast<std::string>() +
                         ": its __array_interface__ gives no data pointer");
  }
  if (interface.contains("mask") && !interface["mask"].is_none())
    throw py::type_error("ferry cannot send a masked array");
  ForeignView view;
  view.dtype = *dtype;
  // NOLINTNEXTLINE(performance-no-int-to-ptr): the array interface gives the address as an integer
  view.element0 = reinterpret_cast<const std::byte*>(interface["data"].cast<py::tuple>()[0].cast<std::uintptr_t>());
  if (interface.contains("offset")) view.element0 += interface["offset"].cast<std::int64_t>();
  for (const py::handle extent : interface["shape"].cast<py::tuple>())
    view.shape.push_back(extent.cast<std::int64_t>());
  const auto element = static_cast<std::int64_t>(dtype_size(*dtype));
  if (interface.contains("strides") && !interface["strides"].is_none()) {
    for (const py::handle stride : interface["strides"].cast<py::tuple>()) {
      const auto bytes = stride.cast<std::int64_t>();
      if (bytes % element != 0)
        throw py::value_error("ferry cannot send an array whose strides are not whole elements");
      view.strides.push_back(bytes / element);
    }
  } else {
    view.strides = contiguous_strides(view.shape);
  }
  return tensor_for(view);
}

// The device a tensor lives on, as its library names it ("cuda:0"), or from its DLPack
// device type and index.
std::string device_name(const py::object& tensor, int type, int index) {
  if (py::hasattr(tensor, "device")) return py::str(tensor.attr("device")).cast<std::string>();
  std::string kind;
  switch (type) {
    case kDLCUDA: kind = "cuda"; break;
    case kDLCUDAManaged: kind = "cuda (managed memory)"; break;
    case kDLROCM: kind = "rocm"; break;
    case kDLVulkan: kind = "vulkan"; break;
    case kDLMetal: kind = "metal"; break;
    default: kind = "DLPack device type " + std::to_string(type); break;
  }
  return kind + ":" + std::to_string(index);
}

// A NumPy scalar (numpy.float32(1.5), numpy.int64(3), numpy.bool_(True)): sent as the
// Python number it holds, as `item()` gives it. nullptr for anything else.
py::object numpy_scalar_item(py::handle object) {
  PyObject* numpy = PyDict_GetItemString(PyImport_GetModuleDict(), "numpy");  // borrowed; set once imported
  if (numpy == nullptr) return py::object();  // NumPy was never imported: this is no NumPy scalar
  const py::object generic = py::reinterpret_borrow<py::object>(numpy).attr("generic");
  const int is_scalar = PyObject_IsInstance(object.ptr(), generic.ptr());
  if (is_scalar < 0) throw py::error_already_set();
  if (is_scalar == 0) return py::object();
  return object.attr("item")();
}

// A torch tensor (or anything with __dlpack__ on the CPU). DLPack 0.6 has no bool: a torch
// bool tensor is read as uint8 and sent as bool.
Tensor tensor_from_dlpack_object(py::handle object) {
  py::object source = py::reinterpret_borrow<py::object>(object);
  if (py::hasattr(source, "requires_grad") && py::hasattr(source, "detach")) source = source.attr("detach")();
  bool is_bool = false;
  if (py::hasattr(source, "dtype") && py::str(source.attr("dtype")).cast<std::string>() == "torch.bool") {
    is_bool = true;
    source = source.attr("view")(py::module_::import("torch").attr("uint8"));
  }
  if (py::hasattr(source, "__dlpack_device__")) {
    const auto device = source.attr("__dlpack_device__")().cast<py::tuple>();
    const auto type = device[0].cast<int>();
    if (type != kDLCPU && type != kDLCUDAHost) {
      throw py::type_error("ferry sends CPU tensors from Python; this tensor is on " +
                           device_name(source, type, device[1].cast<int>()) +
                           ": send a CPU copy (tensor.cpu(), or tensor.to('cpu', non_blocking=True) into pinned "
                           "memory), or keep it on the device and send what the receiver needs to know instead");
    }
  }
  const py::object capsule = source.attr("__dlpack__")();  // its destructor releases the tensor
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) throw py::error_already_set();
  const DLTensor& dl = managed->dl_tensor;
  std::optional<DType> dtype = dtype_from_dlpack(dl.dtype);
  if (!dtype) throw py::type_error("ferry has no element type for this tensor's dtype");
  if (is_bool) dtype = DType::Bool;
  if (dl.ndim < 0 || static_cast<std::size_t>(dl.ndim) > kMaxDims) {
    throw py::value_error("ferry cannot send a tensor of " + std::to_string(dl.ndim) + " dimensions");
  }
  ForeignView view;
  view.dtype = *dtype;
  view.element0 = static_cast<const std::byte*>(dl.data) + dl.byte_offset;
  for (int d = 0; d < dl.ndim; ++d) view.shape.push_back(dl.shape[d]);
  if (dl.strides != nullptr) {
    for (int d = 0; d < dl.ndim; ++d) view.strides.push_back(dl.strides[d]);
  } else {
    view.strides = contiguous_strides(view.shape);
  }
  return tensor_for(view);
}

std::string type_name_of(py::handle object) {
  return py::str(py::type::of(object).attr("__qualname__")).cast<std::string>();
}

// The UTF-8 text of a str (PyUnicode_AsUTF8AndSize keeps it with the str: an ASCII str's
// own bytes). Raises for a str with lone surrogates.
std::string utf8_of(py::handle text) {
  Py_ssize_t size = 0;
  const char* bytes = PyUnicode_AsUTF8AndSize(text.ptr(), &size);
  if (bytes == nullptr) throw py::error_already_set();
  return std::string(bytes, static_cast<std::size_t>(size));
}

Value convert(py::handle object, std::size_t depth) {
  if (depth > kMaxValueDepth) {
    throw py::value_error("ferry cannot send a value nested deeper than " + std::to_string(kMaxValueDepth) +
                          " levels (or one that contains itself)");
  }
  if (object.is_none()) return Value();
  if (PyBool_Check(object.ptr())) return Value(object.ptr() == Py_True);
  if (PyLong_Check(object.ptr())) {
    int overflow = 0;
    const long long integer = PyLong_AsLongLongAndOverflow(object.ptr(), &overflow);
    if (overflow != 0) {
      const std::string message =
          "ferry sends ints of 64 bits; " + py::repr(object).cast<std::string>() + " does not fit";
      PyErr_SetString(PyExc_OverflowError, message.c_str());
      throw py::error_already_set();
    }
    if (integer == -1 && PyErr_Occurred()) throw py::error_already_set();
    return Value(static_cast<std::int64_t>(integer));
  }
  if (PyFloat_Check(object.ptr())) return Value(PyFloat_AsDouble(object.ptr()));
  if (PyUnicode_Check(object.ptr())) return Value(utf8_of(object));  // fails for lone surrogates
  if (PyBytes_Check(object.ptr())) return Value(Bytes{std::string(py::reinterpret_borrow<py::bytes>(object))});
  if (PyByteArray_Check(object.ptr())) {
    return Value(Bytes{
        std::string(PyByteArray_AsString(object.ptr()), static_cast<std::size_t>(PyByteArray_Size(object.ptr())))});
  }
  if (is_tensor(object)) return Value(tensor_of(object));
  if (PyDict_Check(object.ptr())) {
    ValueMap map;
    map.reserve(static_cast<std::size_t>(PyDict_Size(object.ptr())));
    // PyDict_Next hands out borrowed references; converting an element runs no Python code
    // that could change the dict (only a tensor's __dlpack__, which must not).
    Py_ssize_t position = 0;
    PyObject* key_object = nullptr;
    PyObject* element_object = nullptr;
    while (PyDict_Next(object.ptr(), &position, &key_object, &element_object) != 0) {
      const py::handle key(key_object);
      const py::handle element(element_object);
      if (!PyUnicode_Check(key_object)) {
        throw py::type_error("ferry sends dicts with str keys only, not " + type_name_of(key) + " (" +
                             py::repr(key).cast<std::string>() + ")");
      }
      if (PyUnicode_CheckExact(key_object)) {
        map.append_unchecked(utf8_of(key), convert(element, depth + 1));  // distinct str keys: distinct text
        continue;
      }
      // A str subclass may define its own equality: two keys of one text would reach the
      // peer as a duplicate, which its decoder refuses.
      const std::size_t before = map.size();
      map.insert_or_assign(key.cast<std::string>(), convert(element, depth + 1));
      if (map.size() == before) {
        throw py::value_error("ferry cannot send a dict with two keys of the same text (" +
                              py::repr(key).cast<std::string>() + "): its str subclass keys compare unequal");
      }
    }
    return Value(std::move(map));
  }
  if (PyList_Check(object.ptr()) || PyTuple_Check(object.ptr())) {
    const py::sequence sequence = py::reinterpret_borrow<py::sequence>(object);
    ValueList list;
    list.reserve(sequence.size());
    for (const py::handle element : sequence) list.push_back(convert(element, depth + 1));
    return Value(std::move(list));
  }
  if (py::hasattr(object, "__array_interface__")) {
    if (const py::object item = numpy_scalar_item(object)) {
      if (PyBool_Check(item.ptr()) || PyLong_Check(item.ptr()) || PyFloat_Check(item.ptr()))
        return convert(item, depth);
    }
    return Value(tensor_from_array_interface(object, object.attr("__array_interface__").cast<py::dict>()));
  }
  if (py::hasattr(object, "__dlpack__")) return Value(tensor_from_dlpack_object(object));
  throw py::type_error("ferry cannot send an object of type " + type_name_of(object) +
                       "; send None, bool, int, float, str, bytes, list, tuple, dict (str keys), "
                       "ferry.Tensor or a torch/NumPy tensor");
}

}  // namespace

Value to_value(py::handle object) { return convert(object, 1); }

}  // namespace ferry::python
