#include "channel_binding.hpp"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include "blocking_call.hpp"
#include "ends_binding.hpp"
#include "ferry/detail/deadline.hpp"
#include "ferry/duplex.hpp"
#include "value_conversion.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

// Seconds (an int or a float >= 0) as a duration of D; ValueError naming `what` otherwise.
template <class D>
D seconds_option(const py::handle value, const char* what) {
  const auto seconds = value.cast<double>();
  if (!(seconds >= 0)) throw py::value_error(std::string(what) + " must be a number of seconds >= 0");
  return std::chrono::duration_cast<D>(std::chrono::duration<double>(std::min(seconds, 1e9)));
}

std::size_t count_option(const py::handle value, const char* what) {
  const auto count = value.cast<long long>();
  if (count <= 0) throw py::value_error(std::string(what) + " must be a positive number");
  return static_cast<std::size_t>(count);
}

FrameLimits limits_option(const py::handle value) {
  if (!py::isinstance<py::dict>(value)) {
    throw py::type_error(
        "limits must be a dict such as {'max_body_bytes': 1 << 20} (keys: max_body_bytes, "
        "max_handles, max_segments, max_fds, max_releases, max_type_name_bytes)");
  }
  FrameLimits limits;
  for (const auto& [key, limit] : value.cast<py::dict>()) {
    const auto name = key.cast<std::string>();
    const auto number = limit.cast<unsigned long long>();
    const auto as_u32 = [&] {
      if (number > 0xffffffffULL) throw py::value_error("limits['" + name + "'] must fit in 32 bits");
      return static_cast<std::uint32_t>(number);
    };
    if (name == "max_body_bytes") {
      limits.max_body_bytes = number;
    } else if (name == "max_handles") {
      limits.max_handles = as_u32();
    } else if (name == "max_segments") {
      limits.max_segments = as_u32();
    } else if (name == "max_fds") {
      limits.max_fds = as_u32();
    } else if (name == "max_releases") {
      limits.max_releases = as_u32();
    } else if (name == "max_type_name_bytes") {
      limits.max_type_name_bytes = as_u32();
    } else {
      throw py::type_error("limits has no '" + name +
                           "'; use max_body_bytes, max_handles, max_segments, max_fds, "
                           "max_releases or max_type_name_bytes");
    }
  }
  return limits;
}

std::pair<py::object, py::object> ends_pair(Sender<PyValue> sender, Receiver<PyValue> receiver) {
  return {py::cast(std::make_unique<PySender>(std::move(sender))),
          py::cast(std::make_unique<PyReceiver>(std::move(receiver)))};
}

// DuplexEnd::call_for's work on a Python pair of halves: the request is sent within the
// time, then the reply waited for in what is left; both waits as Sender.send_for() and
// Receiver.recv_for() wait (call_blocking: Ctrl-C, and close() from another thread).
py::object call_for(PySender& sender, PyReceiver& receiver, py::handle request, const py::object& timeout) {
  const std::optional<std::chrono::nanoseconds> limit = timeout_from_python(timeout, "Duplex.call_for()");
  const detail::Deadline deadline = detail::Deadline::after(Timeout(timeout_or_forever(limit)));
  const auto left = [&] { return deadline.is_never() ? std::chrono::nanoseconds::max() : deadline.remaining(); };
  const PyValue value(to_value(request));
  const bool sent = call_blocking(
      [&] { return sender.end().send_for(value, Timeout(left())) && sender.end().flush(Timeout(left())); },
      &sender.closing(),
      "Duplex.call_for(): this Duplex was closed by another thread while call_for() waited for room; the request "
      "was not sent");
  if (!sent) {
    PyErr_SetString(PyExc_TimeoutError, ("Duplex.call_for(): the request found no room within " +
                                         std::to_string(py::cast<double>(timeout)) + " s")
                                            .c_str());
    throw py::error_already_set();
  }
  if (!limit) return receiver.recv();
  try {
    return receiver.recv_for(py::float_(std::chrono::duration<double>(left()).count()));
  } catch (py::error_already_set& error) {
    if (!error.matches(PyExc_TimeoutError)) throw;
    PyErr_SetString(PyExc_TimeoutError,
                    ("Duplex.call_for(): no reply within " + std::to_string(py::cast<double>(timeout)) + " s").c_str());
    throw py::error_already_set();
  }
}

// Replaces property `name` of class `type_name` in `module` by one with `doc` (its getter kept).
void document_property(py::module_& module, const char* type_name, const char* name, const char* doc) {
  const py::object type = module.attr(type_name);
  const py::object getter = type.attr("__dict__")[name].attr("fget");
  type.attr(name) = py::module_::import("builtins").attr("property")(getter, py::none(), py::none(), doc);
}

}  // namespace

Transport transport_named(const std::string& name) {
  if (name == "unix") return Transport::UnixSocket;
  const std::optional<Transport> transport = transport_from_name(name);
  if (!transport || *transport == Transport::Ucx) {
    throw py::value_error("ferry has no transport '" + name +
                          "' for a channel; use 'shm_ring', 'unix_socket', 'pipe' or 'in_process' (ucx:// addresses "
                          "are reached with ferry.connect_sender/connect_receiver)");
  }
  return *transport;
}

ChannelOptions channel_options(const py::dict& options) {
  ChannelOptions result;
  for (const auto& [key, value] : options) {
    const auto name = key.cast<std::string>();
    if (name == "ring_capacity") {
      result.ring_capacity = count_option(value, "ring_capacity");
    } else if (name == "ring_spin") {
      result.ring_spin = seconds_option<std::chrono::nanoseconds>(value, "ring_spin");
    } else if (name == "peer_check_interval") {
      result.peer_check_interval = seconds_option<std::chrono::milliseconds>(value, "peer_check_interval");
    } else if (name == "queue_capacity") {
      result.queue_capacity = count_option(value, "queue_capacity");
    } else if (name == "close_linger") {
      result.close_linger = seconds_option<std::chrono::milliseconds>(value, "close_linger");
    } else if (name == "limits") {
      result.limits = limits_option(value);
    } else if (name == "name") {
      if (!py::isinstance<py::str>(value)) throw py::type_error("the channel's name option must be a str");
      result.name = value.cast<std::string>();
    } else {
      throw py::type_error("ferry channels have no option '" + name +
                           "'; the options are ring_capacity, ring_spin, peer_check_interval, queue_capacity, "
                           "close_linger (durations in seconds), limits (a dict) and name (a label for "
                           "ferry.snapshot())");
    }
  }
  return result;
}

void bind_channels(py::module_& module) {
  module.def(
      "_make_channel",
      [](const std::string& transport, const py::dict& options) {
        const Transport kind = transport_named(transport);
        const ChannelOptions settings = channel_options(options);
        auto [sender, receiver] = [&] {
          py::gil_scoped_release release;
          return channel<PyValue>(kind, settings);
        }();
        return ends_pair(std::move(sender), std::move(receiver));
      },
      py::arg("transport"), py::arg("options"));
  module.def(
      "_make_duplex",
      [](const std::string& transport, const py::dict& options) {
        const Transport kind = transport_named(transport);
        const ChannelOptions settings = channel_options(options);
        auto [a, b] = [&] {
          py::gil_scoped_release release;
          return duplex<PyValue, PyValue>(kind, settings);
        }();
        return py::make_tuple(ends_pair(std::move(a.sender), std::move(a.receiver)),
                              ends_pair(std::move(b.sender), std::move(b.receiver)));
      },
      py::arg("transport"), py::arg("options"));
  module.def("_call_for", &call_for, py::arg("sender"), py::arg("receiver"), py::arg("request"), py::arg("timeout"));

  // Ends and listeners are bound elsewhere; what they show of their channel is added here.
  const py::object property = py::module_::import("builtins").attr("property");
  const char* transport_doc =
      "The channel's transport, named as C++'s transport_name() ('shm_ring', 'unix_socket', "
      "'pipe', 'in_process').";
  module.attr("Sender").attr("transport") =
      property(py::cpp_function([](PySender& end) { return std::string(transport_name(end.end().transport())); }),
               py::none(), py::none(), transport_doc);
  module.attr("Receiver").attr("transport") =
      property(py::cpp_function([](PyReceiver& end) { return std::string(transport_name(end.end().transport())); }),
               py::none(), py::none(), transport_doc);
  document_property(module, "Sender", "is_open", "False once the stream was closed (or the end handed over).");
  document_property(module, "Receiver", "is_open", "False once this end was closed (or handed over).");
  document_property(module, "Listener", "is_open", "False once close() was called.");
  document_property(module, "Listener", "address", "The address clients connect to.");
}

}  // namespace ferry::python
