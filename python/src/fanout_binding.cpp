#include "fanout_binding.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "blocking_call.hpp"
#include "ends_binding.hpp"
#include "ferry/broadcast.hpp"
#include "ferry/distributor.hpp"
#include "ferry/select.hpp"
#include "value_conversion.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

using Clock = std::chrono::steady_clock;

std::optional<Clock::time_point> deadline_from(const py::object& timeout) {
  if (timeout.is_none()) return std::nullopt;
  const auto seconds = timeout.cast<double>();
  if (!(seconds >= 0)) throw py::value_error("timeout must be a number of seconds >= 0, or None to wait for ever");
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::min(seconds, 1e9)));
}

Clock::duration slice_until(const std::optional<Clock::time_point>& deadline) {
  if (!deadline) return kSignalCheck;
  return std::clamp<Clock::duration>(*deadline - Clock::now(), Clock::duration::zero(), kSignalCheck);
}

void check_signals() {
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

// ---- Selector -----------------------------------------------------------------------------

class PySelector {
 public:
  std::size_t add(const py::object& receiver) {
    auto& end = receiver.cast<PyReceiver&>().end();
    const std::lock_guard lock(mutex_);
    const std::size_t index = selector_.add(end);
    if (members_.size() <= index) members_.resize(index + 1);
    members_[index] = receiver;  // keeps the Receiver alive while it is in the set
    return index;
  }
  void remove(std::size_t index) {
    const std::lock_guard lock(mutex_);
    selector_.remove(index);
    if (index < members_.size()) members_[index] = py::object();
  }
  bool contains(std::size_t index) {
    const std::lock_guard lock(mutex_);
    return selector_.contains(index);
  }
  std::size_t size() {
    const std::lock_guard lock(mutex_);
    return selector_.size();
  }
  py::object receiver(std::size_t index) {
    const std::lock_guard lock(mutex_);
    if (index >= members_.size() || !members_[index]) throw py::key_error("no receiver " + std::to_string(index) + " in this Selector");
    return members_[index];
  }

  // The index of a ready receiver, waiting at most `timeout` seconds (None: for ever);
  // None when none became ready.
  py::object wait(const py::object& timeout) {
    const std::optional<Clock::time_point> deadline = deadline_from(timeout);
    for (;;) {
      std::optional<std::size_t> ready;
      {
        py::gil_scoped_release release;
        const std::lock_guard lock(mutex_);
        if (selector_.empty()) {
          throw ChannelClosed("the Selector is empty: add() receivers to it (each one is removed with remove() once "
                              "its stream ended)");
        }
        ready = selector_.wait_for(slice_until(deadline));
      }
      if (ready) return py::int_(*ready);
      check_signals();
      if (deadline && Clock::now() >= *deadline) return py::none();
    }
  }
  py::object try_wait() {
    const std::lock_guard lock(mutex_);
    const std::optional<std::size_t> ready = selector_.try_wait();
    return ready ? py::object(py::int_(*ready)) : py::none();
  }

 private:
  std::mutex mutex_;  // one wait at a time (Selector is for one thread)
  Selector selector_;
  std::vector<py::object> members_;
};

// ---- Distributor and Broadcast ----------------------------------------------------------

FanoutOptions fanout_options(std::size_t max_in_flight, double liveness_check_interval) {
  if (max_in_flight < 1) throw py::value_error("max_in_flight must be at least 1");
  if (!(liveness_check_interval >= 0)) throw py::value_error("liveness_check_interval must be a number of seconds >= 0");
  FanoutOptions options;
  options.max_in_flight = max_in_flight;
  options.liveness_check_interval = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(std::min(liveness_check_interval, 1e6)));
  return options;
}

py::list stats_list(const std::vector<ConsumerStats>& stats) {
  py::list out;
  for (const ConsumerStats& one : stats) {
    py::dict entry;
    entry["id"] = one.id;
    entry["transport"] = std::string(transport_name(one.transport));
    entry["sent"] = one.sent;
    entry["delivered"] = one.delivered;
    entry["in_flight"] = one.in_flight;
    entry["skipped"] = one.skipped;
    out.append(entry);
  }
  return out;
}

// A Distributor or a Broadcast of PyValue; closed, its sends raise ChannelClosed.
template <class F>
class PyFanout {
 public:
  PyFanout(std::size_t max_in_flight, double liveness_check_interval)
      : fanout_(std::make_unique<F>(fanout_options(max_in_flight, liveness_check_interval))) {}
  ~PyFanout() {
    if (_Py_IsFinalizing() == 0 && PyGILState_Check() == 1) {
      py::gil_scoped_release release;  // closing may wait for room to end the streams
      fanout_.reset();
    }
  }
  PyFanout(const PyFanout&) = delete;
  PyFanout& operator=(const PyFanout&) = delete;

  ConsumerId add(PySender& sender, const py::object& max_in_flight) {
    const std::shared_lock lock(mutex_);
    F& fanout = open();
    if (max_in_flight.is_none()) return fanout.add(std::move(sender.end()));
    const auto bound = max_in_flight.cast<long long>();
    if (bound < 1) throw py::value_error("max_in_flight must be at least 1");
    return fanout.add(std::move(sender.end()), static_cast<std::size_t>(bound));
  }

  // Ends every consumer's stream after what it was sent (C++'s close(), safe from any
  // thread); later sends raise ChannelClosed.
  void close() {
    py::gil_scoped_release release;
    const std::shared_lock lock(mutex_);
    closed_.store(true, std::memory_order_release);
    if (fanout_) fanout_->close();
  }

  py::list stats() {
    const std::shared_lock lock(mutex_);
    if (!fanout_) return py::list();
    return stats_list(fanout_->stats());
  }
  std::size_t size() {
    const std::shared_lock lock(mutex_);
    return fanout_ ? fanout_->size() : 0;
  }
  bool is_open() {
    const std::shared_lock lock(mutex_);
    return fanout_ != nullptr && !closed_.load(std::memory_order_acquire);
  }

 protected:
  F& open() {
    if (!fanout_) throw ChannelClosed("cannot send: this fan-out was closed");
    return *fanout_;
  }

  std::shared_mutex mutex_;
  std::unique_ptr<F> fanout_;
  std::atomic<bool> closed_{false};  // close() was called
};

class PyDistributor : public PyFanout<Distributor<PyValue>> {
 public:
  using PyFanout::PyFanout;

  // Sends in slices of send_for (an rvalue no consumer took stays in `value`), checking
  // for Ctrl-C between them; False when `timeout` passed with every consumer full.
  bool send(py::handle message, const py::object& timeout) {
    PyValue value(to_value(message));
    const std::optional<Clock::time_point> deadline = deadline_from(timeout);
    for (;;) {
      bool sent = false;
      {
        py::gil_scoped_release release;
        const std::shared_lock lock(mutex_);
        sent = open().send_for(std::move(value), Timeout(slice_until(deadline)));
      }
      if (sent) return true;
      check_signals();
      if (deadline && Clock::now() >= *deadline) return false;
    }
  }

  py::list take_undelivered() {
    std::vector<PyValue> undelivered;
    {
      py::gil_scoped_release release;
      const std::shared_lock lock(mutex_);
      if (fanout_) undelivered = fanout_->take_undelivered();
    }
    py::list out;
    for (PyValue& value : undelivered) out.append(value.take());
    return out;
  }
};

class PyBroadcast : public PyFanout<Broadcast<PyValue>> {
 public:
  using PyFanout::PyFanout;

  std::size_t send(py::handle message) {
    const PyValue value(to_value(message));
    py::gil_scoped_release release;
    const std::shared_lock lock(mutex_);
    return open().send(value);
  }
  std::size_t send_for(py::handle message, double timeout_seconds) {
    if (!(timeout_seconds >= 0)) throw py::value_error("send_for: the timeout must be a number of seconds >= 0");
    const PyValue value(to_value(message));
    const auto timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double>(std::min(timeout_seconds, 1e9)));
    py::gil_scoped_release release;
    const std::shared_lock lock(mutex_);
    return open().send_for(value, timeout);
  }
};

template <class C>
void bind_common(C& cls) {
  cls.def("add", &C::type::add, py::arg("sender"), py::arg("max_in_flight") = py::none(),
          "Adds a consumer: takes the Sender over (the Sender object is empty afterwards) and returns the "
          "consumer's id. `max_in_flight` overrides the fan-out's bound for this consumer.")
      .def("close", &C::type::close,
           "Ends every consumer's stream: each receives what was sent to it, then end of stream. Later sends "
           "raise ChannelClosed.")
      .def("stats", &C::type::stats,
           "Per consumer still present: a dict of id, transport, sent, delivered, in_flight and skipped "
           "(Broadcast: messages it missed because send_for gave up on it).")
      .def("__len__", &C::type::size, "The consumers not removed so far.")
      .def_property_readonly("is_open", &C::type::is_open, "False once close() was called.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](typename C::type& self, const py::args&) {
        self.close();
        return false;
      });
}

}  // namespace

void bind_fanout(py::module_& module) {

  py::class_<PySelector>(module, "Selector",
                         "A set of Receivers waited on at once from one thread: wait() returns the index of one "
                         "whose recv() will not wait for the peer to begin a message. Ready receivers are served "
                         "in turn. A receiver whose stream ended stays ready: remove() it once its recv() raised "
                         "ChannelClosed. ferry.select(receivers) does all of this as an iterator.")
      .def(py::init<>())
      .def("add", &PySelector::add, py::arg("receiver"),
           "Adds a Receiver; returns its index (indices count up from 0 and are never reused).")
      .def("remove", &PySelector::remove, py::arg("index"), "Removes receiver `index` (no effect if already removed).")
      .def("__contains__", &PySelector::contains, py::arg("index"))
      .def("__len__", &PySelector::size, "The number of receivers in the set.")
      .def("receiver", &PySelector::receiver, py::arg("index"), "The Receiver added as `index`.")
      .def("wait", &PySelector::wait, py::arg("timeout") = py::none(),
           "The index of a ready receiver; waits without the GIL at most `timeout` seconds (None: for ever) and "
           "returns None when none became ready. Raises ChannelClosed when the set is empty.")
      .def(
          "wait_for", [](PySelector& self, double timeout) { return self.wait(py::float_(timeout)); },
          py::arg("timeout"), "wait() with a timeout in seconds: an index, or None.")
      .def("try_wait", &PySelector::try_wait, "The index of a ready receiver without waiting, or None.");

  py::class_<PyDistributor> distributor(
      module, "Distributor",
      "Sends each message to one consumer: the one with the fewest messages in flight (sent, not yet returned by its "
      "recv()). A consumer with max_in_flight messages in flight is passed over; send() waits while all are full. "
      "A consumer that closed or died is removed, and the messages it never received are handed back by "
      "take_undelivered(). Thread-safe.");
  distributor
      .def(py::init<std::size_t, double>(), py::arg("max_in_flight") = FanoutOptions{}.max_in_flight,
           py::arg("liveness_check_interval") =
               std::chrono::duration<double>(FanoutOptions{}.liveness_check_interval).count(),
           "FanoutOptions as keyword arguments (liveness_check_interval in seconds).")
      .def(
          "send", [](PyDistributor& self, py::handle message) { (void)self.send(message, py::none()); },
          py::arg("message"),
          "Sends `message` to one consumer, waiting without the GIL while every consumer is full. Raises "
          "ChannelClosed when there is no consumer.")
      .def(
          "send_for",
          [](PyDistributor& self, py::handle message, double timeout) {
            return self.send(message, py::float_(timeout));
          },
          py::arg("message"), py::arg("timeout"),
          "Like send(), waiting at most `timeout` seconds; returns whether a consumer took the message.")
      .def("take_undelivered", &PyDistributor::take_undelivered,
           "Removes the consumers known to be gone and returns the messages they never received, oldest first.");
  bind_common(distributor);

  py::class_<PyBroadcast> broadcast(
      module, "Broadcast",
      "Sends each message to every consumer; a tensor travels as a handle to the same storage to each. A consumer "
      "with max_in_flight messages in flight is waited for (send) or, after send_for's timeout, misses the message. "
      "Thread-safe.");
  broadcast
      .def(py::init<std::size_t, double>(), py::arg("max_in_flight") = FanoutOptions{}.max_in_flight,
           py::arg("liveness_check_interval") =
               std::chrono::duration<double>(FanoutOptions{}.liveness_check_interval).count(),
           "FanoutOptions as keyword arguments (liveness_check_interval in seconds).")
      .def("send", &PyBroadcast::send, py::arg("message"),
           "Sends `message` to every consumer, waiting for each full one; returns how many it reached.")
      .def("send_for", &PyBroadcast::send_for, py::arg("message"), py::arg("timeout"),
           "Like send(); a consumer still full after `timeout` seconds misses the message. Returns how many it "
           "reached.");
  bind_common(broadcast);
}

}  // namespace ferry::python
