#include "endpoints_binding.hpp"

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "ends_binding.hpp"
#include "ferry/duplex.hpp"
#include "ferry/endpoint.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

EndpointOptions endpoint_options(const std::string& transport, const py::object& connect_timeout) {
  EndpointOptions options;
  if (transport == "unix") {
    options.transport = Transport::UnixSocket;
  } else if (transport == "shm_ring") {
    options.transport = Transport::ShmRing;
  } else if (transport == "unix_socket") {
    options.transport = Transport::UnixSocket;
  } else if (transport == "pipe") {
    options.transport = Transport::Pipe;
  } else {
    throw py::value_error("ferry endpoints carry messages over 'unix_socket' (or 'unix'), 'shm_ring' or 'pipe', not '" +
                          transport + "'");
  }
  if (!connect_timeout.is_none()) {
    const auto seconds = connect_timeout.cast<double>();
    if (!(seconds >= 0)) throw py::value_error("timeout must be a number of seconds >= 0");
    options.connect_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::duration<double>(std::min(seconds, 1e9)));
  }
  return options;
}

// A duplex end of Value on its way to Python (made by accept_duplex and connect_duplex).
struct DuplexHalves {
  explicit DuplexHalves(DuplexEnd<PyValue, PyValue> end) : end(std::move(end)) {}
  DuplexEnd<PyValue, PyValue> end;
};

// The Python ferry.Duplex over `halves`.
py::object python_duplex(std::unique_ptr<DuplexHalves> halves) {
  const py::object duplex = py::module_::import("ferry._channels").attr("Duplex");
  return duplex(std::make_unique<PySender>(std::move(halves->end.sender)),
                std::make_unique<PyReceiver>(std::move(halves->end.receiver)));
}

// A listener accepting ends of Value, one accept at a time.
class PyListener {
 public:
  explicit PyListener(Listener listener) : listener_(std::move(listener)) {}
  ~PyListener() {
    const std::lock_guard lock(mutex_);
    listener_.close();
  }
  PyListener(const PyListener&) = delete;
  PyListener& operator=(const PyListener&) = delete;

  std::unique_ptr<PySender> accept_sender(const py::object& timeout) {
    return accept<Sender<PyValue>, PySender>(timeout, [this](std::chrono::nanoseconds slice) {
      return listener_.accept_sender_for<PyValue>(slice);
    });
  }
  std::unique_ptr<PyReceiver> accept_receiver(const py::object& timeout) {
    return accept<Receiver<PyValue>, PyReceiver>(timeout, [this](std::chrono::nanoseconds slice) {
      return listener_.accept_receiver_for<PyValue>(slice);
    });
  }
  // This side's halves of an accepted duplex client.
  std::unique_ptr<DuplexHalves> accept_duplex(const py::object& timeout) {
    return accept<DuplexEnd<PyValue, PyValue>, DuplexHalves>(timeout, [this](std::chrono::nanoseconds slice) {
      return listener_.accept_duplex_for<PyValue, PyValue>(slice);
    });
  }
  // Declares a kind of client served before accepting one (so clients of several kinds
  // may connect in any order).
  void serve(const std::string& kind) {
    const std::lock_guard lock(mutex_);
    if (kind == "sender") {
      listener_.serve_sender<PyValue>();
    } else if (kind == "receiver") {
      listener_.serve_receiver<PyValue>();
    } else {
      listener_.serve_duplex<PyValue, PyValue>();
    }
  }
  void close() {
    py::gil_scoped_release release;
    const std::lock_guard lock(mutex_);  // waits at most one slice of a waiting accept
    listener_.close();
  }
  std::string address() const { return listener_.address(); }
  bool is_open() const noexcept { return listener_.is_open(); }

 private:
  // Accepts in slices of kSignalCheck without the GIL until a client comes or `timeout`
  // (seconds, None: for ever) passes (TimeoutError).
  template <class End, class PyEnd, class Accept>
  std::unique_ptr<PyEnd> accept(const py::object& timeout, Accept&& accept_for) {
    std::optional<std::chrono::steady_clock::time_point> deadline;
    if (!timeout.is_none()) {
      const auto seconds = timeout.cast<double>();
      if (!(seconds >= 0)) throw py::value_error("timeout must be a number of seconds >= 0");
      deadline = std::chrono::steady_clock::now() +
                 std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(std::min(seconds, 1e9)));
    }
    for (;;) {
      std::chrono::nanoseconds slice = kSignalCheck;
      if (deadline) {
        slice = std::clamp<std::chrono::nanoseconds>(*deadline - std::chrono::steady_clock::now(),
                                                     std::chrono::nanoseconds(0), slice);
      }
      std::optional<End> end = [&] {
        py::gil_scoped_release release;  // other Python threads run while this one waits for a client
        const std::lock_guard lock(mutex_);
        return accept_for(slice);
      }();
      if (end) return std::make_unique<PyEnd>(std::move(*end));
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (deadline && std::chrono::steady_clock::now() >= *deadline) {
        PyErr_SetString(PyExc_TimeoutError, ("no client connected to " + listener_.address() + " in time").c_str());
        throw py::error_already_set();
      }
    }
  }

  Listener listener_;
  std::mutex mutex_;
};

}  // namespace

void bind_endpoints(py::module_& module) {
  py::class_<PyListener>(module, "Listener",
                         "A listening endpoint: each accept_* takes the next client of that kind as an end of "
                         "ferry.Value messages.")
      .def("accept_sender", &PyListener::accept_sender, py::arg("timeout") = py::none(),
           "Waits for a client that connected with connect_receiver(); returns this side's Sender. "
           "TimeoutError after `timeout` seconds (None: wait for ever).")
      .def("accept_receiver", &PyListener::accept_receiver, py::arg("timeout") = py::none(),
           "Waits for a client that connected with connect_sender(); returns this side's Receiver.")
      .def(
          "accept_duplex",
          [](PyListener& self, const py::object& timeout) { return python_duplex(self.accept_duplex(timeout)); },
          py::arg("timeout") = py::none(),
          "Waits for a client that connected with connect_duplex(); returns this side's ferry.Duplex.")
      .def(
          "serve_sender", [](PyListener& self) { self.serve("sender"); },
          "Declares that clients for accept_sender() (connect_receiver() clients) are served: they wait instead of "
          "being refused, so clients of several kinds may connect in any order. Call before the first accept.")
      .def(
          "serve_receiver", [](PyListener& self) { self.serve("receiver"); },
          "Declares that clients for accept_receiver() (connect_sender() clients) are served; see serve_sender().")
      .def(
          "serve_duplex", [](PyListener& self) { self.serve("duplex"); },
          "Declares that clients for accept_duplex() (connect_duplex() clients) are served; see serve_sender().")
      .def("close", &PyListener::close, "Stops listening (accepted ends live on).")
      .def_property_readonly("address", &PyListener::address)
      .def_property_readonly("is_open", &PyListener::is_open)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyListener& self, const py::args&) {
        self.close();
        return false;
      });

  module.def(
      "listen",
      [](const std::string& address, const std::string& transport) {
        const EndpointOptions options = endpoint_options(transport, py::none());
        py::gil_scoped_release release;
        return std::make_unique<PyListener>(ferry::listen(address, options));
      },
      py::arg("address"), py::arg("transport") = "unix",
      "Listens at `address` ('unix:@NAME' in the abstract namespace, or 'unix:/path/to.sock'); "
      "only this user's processes may connect. Raises AddressInUse when a live listener holds it.");
  module.def(
      "connect_receiver",
      [](const std::string& address, const py::object& timeout, const std::string& transport) {
        const EndpointOptions options = endpoint_options(transport, timeout);
        py::gil_scoped_release release;
        return std::make_unique<PyReceiver>(ferry::connect_receiver<PyValue>(address, options));
      },
      py::arg("address"), py::arg("timeout") = py::none(), py::arg("transport") = "unix",
      "Connects to the listener at `address` (a C++ accept_sender<ferry::Value>() or a Python "
      "accept_sender()); waits up to `timeout` seconds (default 10) for it to appear and accept.");
  module.def(
      "connect_sender",
      [](const std::string& address, const py::object& timeout, const std::string& transport) {
        const EndpointOptions options = endpoint_options(transport, timeout);
        py::gil_scoped_release release;
        return std::make_unique<PySender>(ferry::connect_sender<PyValue>(address, options));
      },
      py::arg("address"), py::arg("timeout") = py::none(), py::arg("transport") = "unix",
      "Connects as a Sender (the listener's accept_receiver); see connect_receiver.");
  module.def(
      "connect_duplex",
      [](const std::string& address, const py::object& timeout, const std::string& transport) {
        const EndpointOptions options = endpoint_options(transport, timeout);
        std::unique_ptr<DuplexHalves> halves;
        {
          py::gil_scoped_release release;
          halves = std::make_unique<DuplexHalves>(ferry::connect_duplex<PyValue, PyValue>(address, options));
        }
        return python_duplex(std::move(halves));
      },
      py::arg("address"), py::arg("timeout") = py::none(), py::arg("transport") = "unix",
      "Connects as a ferry.Duplex (the listener's accept_duplex); see connect_receiver.");
}

}  // namespace ferry::python
