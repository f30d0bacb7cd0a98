#include "ends_binding.hpp"

#include <cereal/archives/binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>

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

}  // namespace

// ---- PySender -------------------------------------------------------------------------------

PySender::~PySender() {
  if (can_release_gil()) {  // closing may wait for room to write the end of the stream
    py::gil_scoped_release release;
    end_ = Sender<PyValue>();
  }
}

void PySender::send(py::handle object) {
  PyValue value(to_value(object));  // with the GIL: reads Python objects
  py::gil_scoped_release release;
  end_.send(std::move(value));
}

void PySender::close() {
  py::gil_scoped_release release;
  end_.close();
}

// ---- PyReceiver -----------------------------------------------------------------------------

PyReceiver::~PyReceiver() {
  if (can_release_gil()) {
    py::gil_scoped_release release;
    const std::lock_guard lock(mutex_);
    end_ = Receiver<PyValue>();
  }
}

std::optional<PyValue> PyReceiver::receive_until(std::optional<std::chrono::steady_clock::time_point> deadline,
                                                 bool& ended) {
  ended = false;
  for (;;) {
    std::chrono::nanoseconds slice = kSignalCheck;
    if (deadline) slice = std::clamp<std::chrono::nanoseconds>(*deadline - std::chrono::steady_clock::now(),
                                                              std::chrono::nanoseconds(0), slice);
    RecvResult<PyValue> result = [&] {
      py::gil_scoped_release release;  // another Python thread runs while this one waits
      const std::lock_guard lock(mutex_);
      return end_.recv_for(slice);
    }();
    if (result.has_value()) return std::move(result).take();
    if (result.closed()) {
      ended = true;
      return std::nullopt;
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // Ctrl-C in the main thread
    if (deadline && std::chrono::steady_clock::now() >= *deadline) return std::nullopt;
  }
}

py::object PyReceiver::recv() {
  bool ended = false;
  std::optional<PyValue> value = receive_until(std::nullopt, ended);
  if (!value) throw ChannelClosed("the stream ended: the sender closed it (or this Receiver was closed)");
  return value->take();
}

py::object PyReceiver::recv_for(double timeout_seconds) {
  if (!(timeout_seconds >= 0)) throw py::value_error("recv_for: the timeout must be a number of seconds >= 0");
  const auto timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(std::min(timeout_seconds, 1e9)));
  bool ended = false;
  std::optional<PyValue> value = receive_until(std::chrono::steady_clock::now() + timeout, ended);
  if (value) return value->take();
  if (ended) throw ChannelClosed("the stream ended: the sender closed it (or this Receiver was closed)");
  PyErr_SetString(PyExc_TimeoutError, ("recv_for: no message within " + std::to_string(timeout_seconds) + " s").c_str());
  throw py::error_already_set();
}

py::object PyReceiver::next() {
  bool ended = false;
  std::optional<PyValue> value = receive_until(std::nullopt, ended);
  if (!value) throw py::stop_iteration();
  return value->take();
}

void PyReceiver::close() {
  py::gil_scoped_release release;
  const std::lock_guard lock(mutex_);  // waits at most one kSignalCheck slice of a waiting recv()
  end_.close();
}

// ---- the module -----------------------------------------------------------------------------

void bind_ends(py::module_& module) {
  py::class_<PySender>(module, "Sender", "The sending end of a channel of ferry.Value messages.")
      .def("send", &PySender::send, py::arg("message"),
           "Sends a message (None, bool, int, float, str, bytes, list, tuple, dict, tensors); blocks, "
           "without the GIL, while the transport is full.")
      .def("close", &PySender::close, "Ends the stream: the receiver's iteration stops after what was sent.")
      .def_property_readonly("is_open", &PySender::is_open)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PySender& self, const py::args&) {
        self.close();
        return false;
      });

  py::class_<PyReceiver>(module, "Receiver", "The receiving end of a channel of ferry.Value messages; iterable.")
      .def("recv", &PyReceiver::recv,
           "The next message; waits without the GIL. Raises ChannelClosed at the end of the stream, "
           "PeerDied when the sender vanished, ProtocolError/TypeMismatch for a bad message.")
      .def("recv_for", &PyReceiver::recv_for, py::arg("timeout"),
           "Like recv(), waiting at most `timeout` seconds; raises TimeoutError when nothing came.")
      .def("close", &PyReceiver::close, "Closes this end; the sender's next send() raises ChannelClosed.")
      .def_property_readonly("is_open", &PyReceiver::is_open)
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &PyReceiver::next)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyReceiver& self, const py::args&) {
        self.close();
        return false;
      });

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
