#include "endpoints_binding.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "blocking_call.hpp"
#include "ends_binding.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/duplex.hpp"
#include "ferry/endpoint.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

EndpointOptions endpoint_options(const std::string& transport, const py::object& connect_timeout) {
  EndpointOptions options;
  if (transport == "unix" || transport == "unix_socket") {
    options.transport = Transport::UnixSocket;
  } else if (transport == "shm_ring") {
    options.transport = Transport::ShmRing;
  } else if (transport == "pipe") {
    options.transport = Transport::Pipe;
  } else {
    throw py::value_error("ferry endpoints carry messages over 'unix_socket' (or 'unix'), 'shm_ring' or 'pipe', not '" +
                          transport + "'");
  }
  // None: no limit, as everywhere in the package (C++'s default is 10 s).
  const auto limit = timeout_from_python(connect_timeout, "connect_sender()/connect_receiver()");
  options.connect_timeout =
      limit ? std::chrono::duration_cast<std::chrono::milliseconds>(*limit) : std::chrono::milliseconds::max();
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
    const detail::MutexLock lock(mutex_);
    listener_.close();
  }
  PyListener(const PyListener&) = delete;
  PyListener& operator=(const PyListener&) = delete;

  std::unique_ptr<PySender> accept_sender(const py::object& timeout) {
    return accept<PySender>(timeout, "Listener.accept_sender()", [this](std::chrono::nanoseconds limit) {
      return listener_.accept_sender_for<PyValue>(limit);
    });
  }
  std::unique_ptr<PyReceiver> accept_receiver(const py::object& timeout) {
    return accept<PyReceiver>(timeout, "Listener.accept_receiver()", [this](std::chrono::nanoseconds limit) {
      return listener_.accept_receiver_for<PyValue>(limit);
    });
  }
  // This side's halves of an accepted duplex client.
  std::unique_ptr<DuplexHalves> accept_duplex(const py::object& timeout) {
    return accept<DuplexHalves>(timeout, "Listener.accept_duplex()", [this](std::chrono::nanoseconds limit) {
      return listener_.accept_duplex_for<PyValue, PyValue>(limit);
    });
  }
  // Declares a kind of client served before accepting one (so clients of several kinds
  // may connect in any order).
  void serve(const std::string& kind) {
    const detail::MutexLock lock(mutex_);
    if (kind == "sender") {
      listener_.serve_sender<PyValue>();
    } else if (kind == "receiver") {
      listener_.serve_receiver<PyValue>();
    } else {
      listener_.serve_duplex<PyValue, PyValue>();
    }
  }
  void close() {
    closing_.store(true, std::memory_order_release);  // an accept waiting in another thread gives up
    py::gil_scoped_release release;
    const detail::MutexLock lock(mutex_);  // the waiting accept leaves within 250 ms
    listener_.close();
  }
  std::string address() const { return listener_.address(); }
  bool is_open() const noexcept { return listener_.is_open(); }

 private:
  // Waits (call_blocking) until a client comes or `timeout` (seconds, None: no limit)
  // passes (TimeoutError).
  template <class PyEnd, class Accept>
  std::unique_ptr<PyEnd> accept(const py::object& timeout, const char* api, Accept&& accept_for) {
    const auto limit = timeout_from_python(timeout, api);
    auto end = call_blocking(
        [&] {
          const detail::MutexLock lock(mutex_);
          if (!listener_.is_open()) throw ChannelClosed(std::string(api) + ": this Listener is closed");
          return accept_for(timeout_or_forever(limit));
        },
        &closing_, (std::string(api) + ": this Listener was closed by another thread while it waited").c_str());
    if (end) return std::make_unique<PyEnd>(std::move(*end));
    PyErr_SetString(PyExc_TimeoutError, (std::string(api) + ": no client connected to " + listener_.address() +
                                         " within " + std::to_string(py::cast<double>(timeout)) + " s")
                                            .c_str());
    throw py::error_already_set();
  }

  Listener listener_;
  detail::Mutex mutex_;
  std::atomic<bool> closing_{false};  // close() was called: a waiting accept gives up
};

}  // namespace

void bind_endpoints(py::module_& module) {
  py::class_<PyListener>(module, "Listener",
                         "A listening endpoint: each accept_* takes the next client of that kind as an end of "
                         "ferry.Value messages.")
      .def("accept_sender", &PyListener::accept_sender, py::arg("timeout") = py::none(),
           "Waits for a client that connected with connect_receiver(); returns this side's Sender. "
           "TimeoutError after `timeout` seconds (None: no limit). Ctrl-C raises KeyboardInterrupt; close() "
           "from another thread makes it raise ChannelClosed.")
      .def("accept_receiver", &PyListener::accept_receiver, py::arg("timeout") = py::none(),
           "Waits for a client that connected with connect_sender(); returns this side's Receiver. "
           "`timeout` as in accept_sender().")
      .def(
          "accept_duplex",
          [](PyListener& self, const py::object& timeout) { return python_duplex(self.accept_duplex(timeout)); },
          py::arg("timeout") = py::none(),
          "Waits for a client that connected with connect_duplex(); returns this side's ferry.Duplex. "
          "`timeout` as in accept_sender().")
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
        return std::make_unique<PyReceiver>(
            call_blocking([&] { return ferry::connect_receiver<PyValue>(address, options); }, nullptr, ""));
      },
      py::arg("address"), py::arg("timeout") = py::none(), py::arg("transport") = "unix",
      "Connects to the listener at `address` (a C++ accept_sender<ferry::Value>() or a Python "
      "accept_sender()); waits up to `timeout` seconds (None: no limit) for it to appear and accept "
      "(Error after that); Ctrl-C raises KeyboardInterrupt.");
  module.def(
      "connect_sender",
      [](const std::string& address, const py::object& timeout, const std::string& transport) {
        const EndpointOptions options = endpoint_options(transport, timeout);
        return std::make_unique<PySender>(
            call_blocking([&] { return ferry::connect_sender<PyValue>(address, options); }, nullptr, ""));
      },
      py::arg("address"), py::arg("timeout") = py::none(), py::arg("transport") = "unix",
      "Connects as a Sender (the listener's accept_receiver); see connect_receiver.");
  module.def(
      "connect_duplex",
      [](const std::string& address, const py::object& timeout, const std::string& transport) {
        const EndpointOptions options = endpoint_options(transport, timeout);
        auto halves = std::make_unique<DuplexHalves>(
            call_blocking([&] { return ferry::connect_duplex<PyValue, PyValue>(address, options); }, nullptr, ""));
        return python_duplex(std::move(halves));
      },
      py::arg("address"), py::arg("timeout") = py::none(), py::arg("transport") = "unix",
      "Connects as a ferry.Duplex (the listener's accept_duplex); see connect_receiver.");
}

}  // namespace ferry::python
