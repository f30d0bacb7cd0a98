#include "py_value.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <string>

#include "ferry/detail/value_reader.hpp"
#include "tensor_binding.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

// An owned reference, dropped by its destructor (the builder runs under the GIL).
class Ref {
 public:
  explicit Ref(PyObject* object = nullptr) noexcept : object_(object) {}
  Ref(Ref&& other) noexcept : object_(std::exchange(other.object_, nullptr)) {}
  Ref& operator=(Ref&& other) noexcept {
    std::swap(object_, other.object_);
    return *this;
  }
  ~Ref() { Py_XDECREF(object_); }
  PyObject* get() const noexcept { return object_; }
  PyObject* release() noexcept { return std::exchange(object_, nullptr); }

 private:
  PyObject* object_;
};

// The Python error that made a C API call fail, as an Error (a Python exception must not
// cross the decoder).
[[noreturn]] void throw_python_failure() {
  std::string why = "unknown Python error";
  if (PyErr_ExceptionMatches(PyExc_MemoryError) != 0) {
    PyErr_Clear();
    why = "Python is out of memory (MemoryError); free memory or receive smaller messages";
  } else if (PyErr_Occurred() != nullptr) {
    const py::error_already_set error;  // fetches and clears it
    why = error.what();
  }
  throw Error("could not build a received message in Python: " + why);
}

// A new reference from the C API, or its failure as an Error.
Ref checked(PyObject* made) {
  if (made == nullptr) throw_python_failure();
  return Ref(made);
}

// True when every byte of `text` is ASCII: a word at a time, the tail as one overlapping word.
bool is_ascii(std::string_view text) noexcept {
  constexpr std::uint64_t kHighBits = 0x8080808080808080ull;
  const char* const at = text.data();
  const std::size_t size = text.size();
  std::uint64_t seen = 0;
  if (size >= sizeof seen) {
    std::uint64_t word = 0;
    for (std::size_t i = 0; i + sizeof word <= size; i += sizeof word) {
      std::memcpy(&word, at + i, sizeof word);
      seen |= word;
    }
    std::memcpy(&word, at + size - sizeof word, sizeof word);
    return ((seen | word) & kHighBits) == 0;
  }
  for (std::size_t i = 0; i < size; ++i) seen |= static_cast<unsigned char>(at[i]);
  return (seen & 0x80) == 0;
}

// A new str of received text, the one UTF-8 check of it (PythonBuilder::kChecksUtf8):
// ASCII text (almost every name and key) is copied into a new str as it is; other text goes
// through Python's strict UTF-8 decoder, which refuses what is_valid_utf8 refuses
// (overlong forms, surrogates, code points above U+10FFFF, truncated sequences). Invalid
// text is a ProtocolError naming `what`.
PyObject* new_str(std::string_view text, const char* what) {
  const auto size = static_cast<Py_ssize_t>(text.size());
  if (is_ascii(text)) {
    PyObject* made = PyUnicode_New(size, 127);
    if (made == nullptr) throw_python_failure();
    std::memcpy(PyUnicode_1BYTE_DATA(made), text.data(), text.size());
    return made;
  }
  PyObject* made = PyUnicode_DecodeUTF8(text.data(), size, "strict");
  if (made == nullptr) {
    if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError) != 0) {
      PyErr_Clear();
      detail::throw_invalid_value_utf8(what);
    }
    throw_python_failure();
  }
  return made;
}

// The str objects of the dict keys received lately, by their text: a stream of messages
// repeats the same few keys, and a key found here is not made again, nor hashed again when
// it goes into the dict (a str keeps its hash). A key found here has the text of one that
// new_str accepted, so it is valid UTF-8. Direct-mapped; used under the GIL only; its
// references live as long as the process (a few hundred short strs at most).
class KeyCache {
 public:
  static KeyCache& instance() {
    static KeyCache* cache = new KeyCache();  // never destroyed: the interpreter may be gone by then
    return *cache;
  }

  // A new reference to a str of `text`; ProtocolError for invalid UTF-8.
  PyObject* key(std::string_view text) {
    if (text.size() > kLongestKey) return new_str(text, "map key");
    Slot& slot = slots_[slot_of(text)];
    if (slot.key != nullptr && slot.size == text.size() && std::memcmp(slot.text, text.data(), text.size()) == 0) {
      Py_INCREF(slot.key);
      return slot.key;
    }
    PyObject* made = new_str(text, "map key");
    Py_INCREF(made);
    Py_XDECREF(std::exchange(slot.key, made));
    slot.size = text.size();
    std::memcpy(slot.text, text.data(), text.size());
    return made;
  }

 private:
  static constexpr std::size_t kLongestKey = 47;
  static constexpr std::size_t kSlots = 512;
  struct Slot {
    PyObject* key = nullptr;
    std::size_t size = 0;
    char text[kLongestKey];
  };

  static std::size_t slot_of(std::string_view text) noexcept {
    std::uint32_t hash = 2166136261u;  // FNV-1a
    for (const char c : text) hash = (hash ^ static_cast<unsigned char>(c)) * 16777619u;
    return (hash ^ (hash >> 16)) % kSlots;
  }

  std::array<Slot, kSlots> slots_{};
};

// detail::read_value's builder of Python objects, one per value, nothing temporary. It
// checks the UTF-8 of strings and keys itself, as it makes their str objects.
class PythonBuilder {
 public:
  static constexpr bool kChecksUtf8 = true;
  using Object = Ref;
  struct List {
    Ref list;
    Py_ssize_t next = 0;
  };
  struct Map {
    Ref dict;
  };

  Ref none() {
    Py_INCREF(Py_None);
    return Ref(Py_None);
  }
  Ref boolean(bool flag) {
    PyObject* object = flag ? Py_True : Py_False;
    Py_INCREF(object);
    return Ref(object);
  }
  Ref integer(std::int64_t number) { return checked(PyLong_FromLongLong(number)); }
  Ref real(double number) { return checked(PyFloat_FromDouble(number)); }
  Ref string(std::string_view text) { return Ref(new_str(text, "string")); }
  Ref bytes(std::string_view data) {
    return checked(PyBytes_FromStringAndSize(data.data(), static_cast<Py_ssize_t>(data.size())));
  }
  Ref tensor(Tensor&& tensor) {
    try {
      return Ref(wrap_tensor(std::move(tensor)).release().ptr());
    } catch (const py::error_already_set& error) {
      throw Error(std::string("could not build a received message in Python: ") + error.what());
    }
  }
  List list(std::size_t count) { return List{checked(PyList_New(static_cast<Py_ssize_t>(count)))}; }
  void append(List& list, Ref&& element) { PyList_SET_ITEM(list.list.get(), list.next++, element.release()); }
  Ref finish(List&& list) { return std::move(list.list); }
  // Sized for its entries at once (the reader checked the count against the bytes left).
  Map map(std::size_t count) {
    return Map{checked(_PyDict_NewPresized(static_cast<Py_ssize_t>(std::min<std::size_t>(count, kPresizedEntries))))};
  }
  bool insert(Map& map, std::string_view key, Ref&& element) {
    const Ref name(KeyCache::instance().key(key));
    const Py_ssize_t before = PyDict_Size(map.dict.get());
    if (PyDict_SetItem(map.dict.get(), name.get(), element.get()) != 0) throw_python_failure();
    return PyDict_Size(map.dict.get()) > before;  // not larger: the key was there already
  }
  Ref finish(Map&& map) { return std::move(map.dict); }

 private:
  static constexpr std::size_t kPresizedEntries = 1024;  // a larger dict grows as it fills
};

// The Python object of `value`, made by the same builder as a frame's (an in-process channel
// hands over Values).
Ref build(Value& value, PythonBuilder& builder) {
  switch (value.kind()) {
    case ValueKind::None: return builder.none();
    case ValueKind::Bool: return builder.boolean(value.as_bool());
    case ValueKind::Int: return builder.integer(value.as_int());
    case ValueKind::Float: return builder.real(value.as_float());
    case ValueKind::String: return builder.string(value.as_string());
    case ValueKind::Bytes: return builder.bytes(value.as_bytes().data);
    case ValueKind::Tensor: return builder.tensor(std::move(value.as_tensor()));
    case ValueKind::List: {
      ValueList& elements = value.as_list();
      PythonBuilder::List list = builder.list(elements.size());
      for (Value& element : elements) builder.append(list, build(element, builder));
      return builder.finish(std::move(list));
    }
    case ValueKind::Map: {
      PythonBuilder::Map map = builder.map(value.as_map().size());
      for (auto& [key, element] : value.as_map()) (void)builder.insert(map, key, build(element, builder));
      return builder.finish(std::move(map));
    }
  }
  throw Error("ferry received a Value of an unknown kind");
}

}  // namespace

PyValue::PyValue(const PyValue& other) : value_(other.value_) {
  if (other.object_ != nullptr) {
    const py::gil_scoped_acquire gil;
    Py_INCREF(other.object_);
    object_ = other.object_;
  }
}

PyValue& PyValue::operator=(const PyValue& other) {
  if (this != &other) *this = PyValue(other);
  return *this;
}

PyValue& PyValue::operator=(PyValue&& other) noexcept {
  if (this != &other) {
    release();
    value_ = std::move(other.value_);
    object_ = std::exchange(other.object_, nullptr);
  }
  return *this;
}

PyValue::~PyValue() { release(); }

void PyValue::release() noexcept {
  if (object_ == nullptr) return;
  if (_Py_IsFinalizing() != 0) {  // the interpreter is going: leave the object to it
    object_ = nullptr;
    return;
  }
  const PyGILState_STATE state = PyGILState_Ensure();  // a received message dropped without the GIL
  Py_DECREF(std::exchange(object_, nullptr));
  PyGILState_Release(state);
}

void PyValue::reset(PyObject* object) noexcept {
  Py_XDECREF(object_);
  object_ = object;
}

py::object PyValue::take() {
  if (object_ != nullptr) return py::reinterpret_steal<py::object>(std::exchange(object_, nullptr));
  PythonBuilder builder;
  return py::reinterpret_steal<py::object>(build(value_, builder).release());
}

void CEREAL_SAVE_FUNCTION_NAME(detail::FrameOutputArchive& archive, const PyValue& value) { archive(value.value()); }

void CEREAL_LOAD_FUNCTION_NAME(detail::FrameInputArchive& archive, PyValue& value) {
  const py::gil_scoped_acquire gil;
  detail::ValueBudget budget;
  PythonBuilder builder;
  value.reset(detail::read_value(archive, builder, 1, budget).release());
}

}  // namespace ferry::python
