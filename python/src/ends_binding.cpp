#include "ends_binding.hpp"

#include <cereal/archives/binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>

#include "blocking_call.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/end_description.hpp"
#include "value_conversion.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

// True while the interpreter can still switch threads (not while it shuts down).
bool can_release_gil() { return _Py_IsFinalizing() == 0 && PyGILState_Check() == 1; }

Transport transport_from_name(const std::string& name) {
  if (name == "pipe") return Transport::Pipe;
  if (name == "unix") return Transport::UnixSocket;
  if (name == "shm_ring") return Transport::ShmRing;
  if (name == "in_process") return Transport::InProcess;
  throw py::value_error("ferry has no transport '" + name + "'; use pipe, unix, shm_ring or in_process");
}

// Sets the Python error for the C++ exception being handled, as pybind11's dispatcher does
// (through the registered translators); returns nullptr, for a CPython slot to return.
PyObject* translate_current_exception() noexcept {
  try {
    if (py::detail::apply_exception_translators(py::detail::get_local_internals().registered_exception_translators) ||
        py::detail::apply_exception_translators(py::detail::get_internals().registered_exception_translators)) {
      return nullptr;
    }
    PyErr_SetString(PyExc_SystemError, "ferry.Receiver.__next__: an error escaped every exception translator");
  } catch (...) {
    PyErr_SetString(PyExc_SystemError, "ferry.Receiver.__next__: translating a C++ error failed");
  }
  return nullptr;
}

// Receiver's tp_iternext, the trainer's `for batch in receiver` and next(receiver): straight
// from CPython's iteration to PyReceiver::next_or_end, without pybind11's generic dispatcher
// (its argument loading and call machinery are code a cold trainer reads from memory on
// every batch). Errors are translated as the dispatcher translates them.
PyObject* receiver_iternext(PyObject* self) noexcept {
  try {
    const py::detail::value_and_holder holder = reinterpret_cast<py::detail::instance*>(self)->get_value_and_holder();
    auto* receiver = holder ? holder.value_ptr<PyReceiver>() : nullptr;
    if (receiver == nullptr || !holder.holder_constructed()) {
      PyErr_SetString(PyExc_TypeError, "this ferry.Receiver was not made by ferry; use ferry.connect_receiver()");
      return nullptr;
    }
    return receiver->next_or_end();
  } catch (...) {  // a py::error_already_set too: pybind11's own translator restores it
    return translate_current_exception();
  }
}

}  // namespace

// A description written by cereal's binary archive (how a C++ parent hands ends to a
// Python child it starts; see tests/python/).
EndDescription parse_description(const std::string& bytes) {
  EndDescription description;
  try {
    std::istringstream in(bytes);
    cereal::BinaryInputArchive archive(in);
    archive(description);
  } catch (const cereal::Exception& error) {
    throw py::value_error(std::string("not a ferry end description: ") + error.what());
  }
  return description;
}

// ---- PySender -------------------------------------------------------------------------------

// NOLINTNEXTLINE(bugprone-exception-escape): gil_scoped_release throws only before pybind11 is initialized
PySender::~PySender() {
  if (can_release_gil()) {  // closing may wait for room to write the end of the stream
    py::gil_scoped_release release;
    end_ = Sender<PyValue>();
  }
}

void PySender::send(py::handle object) {
  PyValue value(to_value(object));  // with the GIL: reads Python objects
  call_blocking([&] { end_.send(std::move(value)); }, &closing_,
                "Sender.send(): this Sender was closed by another thread while send() waited for room; the "
                "message was not sent");
}

bool PySender::send_for(py::handle object, const py::object& timeout) {
  const auto limit = timeout_from_python(timeout, "Sender.send_for()");
  PyValue value(to_value(object));
  return call_blocking([&] { return end_.send_for(std::move(value), timeout_or_forever(limit)); }, &closing_,
                       "Sender.send_for(): this Sender was closed by another thread while send_for() waited for "
                       "room; the message was not sent");
}

void PySender::close() {
  closing_.store(true, std::memory_order_release);  // a send waiting in another thread gives up
  call_blocking([&] { end_.close(); }, nullptr, "");
}

// ---- PyReceiver -----------------------------------------------------------------------------

// NOLINTNEXTLINE(bugprone-exception-escape): gil_scoped_release throws only before pybind11 is initialized
PyReceiver::~PyReceiver() {
  if (can_release_gil()) {
    py::gil_scoped_release release;
    const detail::MutexLock lock(mutex_);
    end_ = Receiver<PyValue>();
  }
}

std::optional<PyValue> PyReceiver::receive_within(std::chrono::nanoseconds timeout, bool& ended) {
  ended = false;
  RecvResult<PyValue> result;
  try {
    result = call_blocking(
        [&] {
          const detail::MutexLock lock(mutex_);
          return end_.recv_for(timeout);
        },
        &closing_, "");  // Abandoned: the end of this end's stream, below
  } catch (const Abandoned&) {
    ended = true;  // closed by another thread: the end of this end's stream
    return std::nullopt;
  }
  if (result.has_value()) return std::move(result).take();
  ended = result.closed();
  return std::nullopt;
}

py::object PyReceiver::recv() {
  bool ended = false;
  std::optional<PyValue> value = receive_within(std::chrono::nanoseconds::max(), ended);
  if (!value) throw ChannelClosed("the stream ended: the sender closed it (or this Receiver was closed)");
  return value->take();
}

py::object PyReceiver::recv_for(const py::object& timeout) {
  const auto limit = timeout_from_python(timeout, "Receiver.recv_for()");
  bool ended = false;
  std::optional<PyValue> value = receive_within(timeout_or_forever(limit), ended);
  if (value) return value->take();
  if (ended) throw ChannelClosed("the stream ended: the sender closed it (or this Receiver was closed)");
  PyErr_SetString(
      PyExc_TimeoutError,
      ("Receiver.recv_for(): no message within " + std::to_string(py::cast<double>(timeout)) + " s").c_str());
  throw py::error_already_set();
}

py::object PyReceiver::next() {
  bool ended = false;
  std::optional<PyValue> value = receive_within(std::chrono::nanoseconds::max(), ended);
  if (!value) throw py::stop_iteration();
  return value->take();
}

PyObject* PyReceiver::next_or_end() {
  bool ended = false;
  std::optional<PyValue> value = receive_within(std::chrono::nanoseconds::max(), ended);
  if (!value) return nullptr;
  return value->take().release().ptr();
}

void PyReceiver::close() {
  closing_.store(true, std::memory_order_release);  // a recv waiting in another thread gives up
  py::gil_scoped_release release;
  end_.close();  // thread-safe against a recv in another thread (it leaves within 250 ms)
}

// ---- the module -----------------------------------------------------------------------------

void bind_ends(py::module_& module) {
  py::class_<PySender>(module, "Sender", "The sending end of a channel of ferry.Value messages.")
      .def("send", &PySender::send, py::arg("message"),
           "Sends a message (None, bool, int, float, str, bytes, list, tuple, dict, tensors); blocks, "
           "without the GIL, while the transport is full.")
      .def("send_for", &PySender::send_for, py::arg("message"), py::arg("timeout"),
           "Like send(), giving up when the transport stays full for `timeout` seconds (None: no limit); "
           "returns whether the message was accepted (False: nothing of it was sent). A message whose frame "
           "had begun to go out is accepted, and its rest goes out with the next send or close().")
      .def("close", &PySender::close,
           "Ends the stream: the receiver's iteration stops after what was sent. A send() blocked in another "
           "thread raises ChannelClosed; close() itself waits for room for the end of the stream at most 10 s "
           "(the receiver then sees PeerDied instead). Ctrl-C interrupts it.")
      .def_property_readonly("is_open", &PySender::is_open)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PySender& self, const py::args&) {
        self.close();
        return false;
      });

  py::class_<PyReceiver> receiver(module, "Receiver",
                                  "The receiving end of a channel of ferry.Value messages; iterable.");
  receiver
      .def("recv", &PyReceiver::recv,
           "The next message; waits without the GIL. Raises ChannelClosed at the end of the stream, "
           "PeerDied when the sender vanished, ProtocolError/TypeMismatch for a bad message.")
      .def("recv_for", &PyReceiver::recv_for, py::arg("timeout"),
           "Like recv(), waiting at most `timeout` seconds (None: no limit); raises TimeoutError when "
           "nothing came.")
      .def("close", &PyReceiver::close,
           "Closes this end; a recv() blocked in another thread raises ChannelClosed (iteration stops).")
      .def_property_readonly("is_open", &PyReceiver::is_open)
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &PyReceiver::next)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyReceiver& self, const py::args&) {
        self.close();
        return false;
      });
  // Iteration goes straight to receiver_iternext (Receiver.__next__ stays, for explicit calls).
  auto* receiver_type = reinterpret_cast<PyTypeObject*>(receiver.ptr());
  receiver_type->tp_iternext = &receiver_iternext;
  PyType_Modified(receiver_type);

  module.def(
      "_channel",
      [](const std::string& transport) {
        auto [sender, receiver] = channel<PyValue>(transport_from_name(transport));
        return py::make_tuple(std::make_unique<PySender>(std::move(sender)),
                              std::make_unique<PyReceiver>(std::move(receiver)));
      },
      py::arg("transport") = "unix", "A connected (Sender, Receiver) pair in this process.");
  module.def(
      "_end_from_description",
      [](const py::bytes& bytes) -> py::object {
        const EndDescription description = parse_description(std::string(bytes));
        if (description.role == EndRole::Sender) {
          return py::cast(std::make_unique<PySender>(sender_from_description<PyValue>(description)));
        }
        return py::cast(std::make_unique<PyReceiver>(receiver_from_description<PyValue>(description)));
      },
      py::arg("description"),
      "Rebuilds an end that a C++ parent described (cereal binary EndDescription) and whose descriptors "
      "this process inherited.");
}

}  // namespace ferry::python
