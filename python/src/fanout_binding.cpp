#include "fanout_binding.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "blocking_call.hpp"
#include "ends_binding.hpp"
#include "ferry/broadcast.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/distributor.hpp"
#include "ferry/select.hpp"
#include "value_conversion.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

// ---- Selector -----------------------------------------------------------------------------

// The lock of a Selector or fan-out is taken only without the GIL: a wait holds it while its
// Ctrl-C check takes the GIL (blocking_call.hpp).
class PySelector {
 public:
  std::size_t add(const py::object& receiver) {
    auto& end = receiver.cast<PyReceiver&>().end();
    std::size_t index = 0;
    {
      py::gil_scoped_release release;
      const detail::MutexLock lock(mutex_);
      throw_if_closed("add()");
      index = selector_.add(end);
    }
    if (members_.size() <= index) members_.resize(index + 1);
    members_[index] = receiver;  // keeps the Receiver alive while it is in the set
    return index;
  }
  void remove(std::size_t index) {
    {
      py::gil_scoped_release release;
      const detail::MutexLock lock(mutex_);
      selector_.remove(index);
    }
    if (index < members_.size()) members_[index] = py::object();
  }
  bool contains(std::size_t index) {
    py::gil_scoped_release release;
    const detail::MutexLock lock(mutex_);
    return selector_.contains(index);
  }
  std::size_t size() {
    py::gil_scoped_release release;
    const detail::MutexLock lock(mutex_);
    return selector_.size();
  }
  py::object receiver(std::size_t index) {
    if (index >= members_.size() || !members_[index])
      throw py::key_error("no receiver " + std::to_string(index) + " in this Selector");
    return members_[index];
  }

  // The index of a ready receiver, waiting at most `timeout` seconds (None: for ever);
  // None when none became ready. Interruptible (call_blocking): Ctrl-C, and close() from
  // another thread (ChannelClosed).
  py::object wait(const py::object& timeout, const char* api) {
    const std::optional<std::chrono::nanoseconds> limit =
        timeout_from_python(timeout, (std::string("Selector.") + api).c_str());
    const std::optional<std::size_t> ready = call_blocking(
        [&] {
          const detail::MutexLock lock(mutex_);
          throw_if_closed(api);
          if (selector_.empty()) {
            throw ChannelClosed(std::string("Selector.") + api +
                                ": the Selector is empty: add() receivers to it (each one is "
                                "removed with remove() once its stream ended)");
          }
          return selector_.wait_for(Timeout(timeout_or_forever(limit)));
        },
        &closed_, closed_message(api).c_str());
    return ready ? py::object(py::int_(*ready)) : py::none();
  }
  py::object try_wait() {
    std::optional<std::size_t> ready;
    {
      py::gil_scoped_release release;
      const detail::MutexLock lock(mutex_);
      throw_if_closed("try_wait()");
      ready = selector_.try_wait();
    }
    return ready ? py::object(py::int_(*ready)) : py::none();
  }
  // Empties the set for good: a wait() in another thread raises ChannelClosed within
  // kWaitInterruptionPeriod; later calls raise it too. The receivers stay open.
  void close() {
    closed_.store(true, std::memory_order_release);
    const std::size_t count = members_.size();  // add() refuses from now on
    {
      py::gil_scoped_release release;
      const detail::MutexLock lock(mutex_);  // a wait in progress leaves first
      for (std::size_t index = 0; index < count; ++index) selector_.remove(index);
    }
    members_.clear();
  }
  bool is_open() const { return !closed_.load(std::memory_order_acquire); }

 private:
  void throw_if_closed(const char* api) const {
    if (closed_.load(std::memory_order_acquire)) throw ChannelClosed(closed_message(api));
  }
  static std::string closed_message(const char* api) {
    return std::string("Selector.") + api + ": this Selector was closed (Selector.close()); make a new one";
  }

  detail::Mutex mutex_;  // one wait at a time (Selector is for one thread)
  Selector selector_;
  std::vector<py::object> members_;  // with the GIL
  std::atomic<bool> closed_{false};  // close() was called: a wait gives up
};

// ---- Distributor and Broadcast ----------------------------------------------------------

FanoutOptions fanout_options(std::size_t max_in_flight, double liveness_check_interval, std::string name) {
  if (max_in_flight < 1) throw py::value_error("max_in_flight must be at least 1");
  if (!(liveness_check_interval >= 0))
    throw py::value_error("liveness_check_interval must be a number of seconds >= 0");
  FanoutOptions options;
  options.max_in_flight = max_in_flight;
  options.name = std::move(name);
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

// A Distributor or a Broadcast of PyValue; closed, its sends raise ChannelClosed. Its
// sends wait through call_blocking: Ctrl-C raises KeyboardInterrupt, and close() from
// another thread ends them with ChannelClosed within kWaitInterruptionPeriod.
template <class F>
class PyFanout {
 public:
  PyFanout(std::size_t max_in_flight, double liveness_check_interval, std::string name)
      : fanout_(std::make_unique<F>(fanout_options(max_in_flight, liveness_check_interval, std::move(name)))) {}
  // NOLINTNEXTLINE(bugprone-exception-escape): gil_scoped_release throws only before pybind11 is initialized
  ~PyFanout() {
    if (_Py_IsFinalizing() == 0 && PyGILState_Check() == 1) {
      py::gil_scoped_release release;  // closing may wait for room to end the streams
      fanout_.reset();
    }
  }
  PyFanout(const PyFanout&) = delete;
  PyFanout& operator=(const PyFanout&) = delete;

  ConsumerId add(PySender& sender, const py::object& max_in_flight) {
    std::optional<std::size_t> bound;
    if (!max_in_flight.is_none()) {
      const auto count = max_in_flight.cast<long long>();
      if (count < 1) throw py::value_error("max_in_flight must be at least 1");
      bound = static_cast<std::size_t>(count);
    }
    Sender<PyValue> end = std::move(sender.end());
    py::gil_scoped_release release;
    const std::shared_lock lock(mutex_);
    F& fanout = open();
    return bound ? fanout.add(std::move(end), *bound) : fanout.add(std::move(end));
  }

  // Ends every consumer's stream after what it was sent (C++'s close(), safe from any
  // thread); a send waiting in another thread and later sends raise ChannelClosed.
  void close() {
    closed_.store(true, std::memory_order_release);  // a waiting send gives up
    py::gil_scoped_release release;
    const std::shared_lock lock(mutex_);
    if (fanout_) fanout_->close();
  }

  py::list stats() {
    std::vector<ConsumerStats> stats;
    {
      py::gil_scoped_release release;
      const std::shared_lock lock(mutex_);
      if (fanout_) stats = fanout_->stats();
    }
    return stats_list(stats);
  }
  std::size_t size() {
    py::gil_scoped_release release;
    const std::shared_lock lock(mutex_);
    return fanout_ ? fanout_->size() : 0;
  }
  bool is_open() const { return !closed_.load(std::memory_order_acquire); }

 protected:
  F& open() {
    if (!fanout_) throw ChannelClosed("cannot send: this fan-out was closed");
    return *fanout_;
  }
  // Runs `send(fanout)` through call_blocking; `abandoned`: the message of ChannelClosed
  // when close() in another thread ended the wait.
  template <class Send>
  auto blocking_send(const std::string& abandoned, const Send& send) {
    return call_blocking(
        [&] {
          const std::shared_lock lock(mutex_);
          return send(open());
        },
        &closed_, abandoned.c_str());
  }

  std::shared_mutex mutex_;  // taken without the GIL only
  std::unique_ptr<F> fanout_;
  std::atomic<bool> closed_{false};  // close() was called
};

class PyDistributor : public PyFanout<Distributor<PyValue>> {
 public:
  using PyFanout::PyFanout;

  // Sends to one consumer, waiting while every one is full at most `timeout` (None: no
  // limit); False when the time passed (an rvalue no consumer took stays in `value`).
  bool send(py::handle message, const py::object& timeout, const char* api) {
    const std::optional<std::chrono::nanoseconds> limit = timeout_from_python(timeout, api);
    PyValue value(to_value(message));
    const std::string abandoned = std::string(api) +
                                  ": close() was called in another thread while this send waited for a full "
                                  "consumer; the message was not sent";
    return blocking_send(abandoned, [&](Distributor<PyValue>& distributor) {
      if (!limit) {
        distributor.send(std::move(value));
        return true;
      }
      return distributor.send_for(std::move(value), Timeout(*limit));
    });
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

  // Sends to every consumer, a full one waited for at most `timeout` (None: no limit);
  // how many it reached.
  std::size_t send(py::handle message, const py::object& timeout, const char* api) {
    const std::optional<std::chrono::nanoseconds> limit = timeout_from_python(timeout, api);
    const PyValue value(to_value(message));
    const std::string abandoned = std::string(api) +
                                  ": close() was called in another thread while this send waited for a full "
                                  "consumer; the consumers still full did not get the message";
    return blocking_send(abandoned, [&](Broadcast<PyValue>& broadcast) {
      return limit ? broadcast.send_for(value, Timeout(*limit)) : broadcast.send(value);
    });
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
      .def(
          "wait", [](PySelector& self, const py::object& timeout) { return self.wait(timeout, "wait()"); },
          py::arg("timeout") = py::none(),
          "The index of a ready receiver; waits without the GIL at most `timeout` seconds (None: for ever) and "
          "returns None when none became ready. Raises ChannelClosed when the set is empty or close() was called "
          "(also from another thread while it waits), KeyboardInterrupt on Ctrl-C.")
      .def(
          "wait_for", [](PySelector& self, const py::object& timeout) { return self.wait(timeout, "wait_for()"); },
          py::arg("timeout"), "wait() with a timeout in seconds (None: for ever): an index, or None.")
      .def("try_wait", &PySelector::try_wait, "The index of a ready receiver without waiting, or None.")
      .def("close", &PySelector::close,
           "Empties the set for good (the receivers stay open): a wait() in another thread raises ChannelClosed, "
           "and so do later calls.")
      .def_property_readonly("is_open", &PySelector::is_open, "False once close() was called.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PySelector& self, const py::args&) {
        self.close();
        return false;
      });

  py::class_<PyDistributor> distributor(
      module, "Distributor",
      "Sends each message to one consumer: the one with the fewest messages in flight (sent, not yet returned by its "
      "recv()). A consumer with max_in_flight messages in flight is passed over; send() waits while all are full. "
      "A consumer that closed or died is removed, and the messages it never received are handed back by "
      "take_undelivered(). Thread-safe.");
  distributor
      .def(py::init<std::size_t, double, std::string>(), py::arg("max_in_flight") = FanoutOptions{}.max_in_flight,
           py::arg("liveness_check_interval") =
               std::chrono::duration<double>(FanoutOptions{}.liveness_check_interval).count(),
           py::kw_only(), py::arg("name") = "",
           "FanoutOptions as keyword arguments (liveness_check_interval in seconds; name: the label "
           "ferry.snapshot() and the ferry tool show).")
      .def(
          "send",
          [](PyDistributor& self, py::handle message) { (void)self.send(message, py::none(), "Distributor.send()"); },
          py::arg("message"),
          "Sends `message` to one consumer, waiting without the GIL while every consumer is full. Raises "
          "ChannelClosed when there is no consumer or close() was called (also from another thread while it "
          "waits: the message was not sent), KeyboardInterrupt on Ctrl-C.")
      .def(
          "send_for",
          [](PyDistributor& self, py::handle message, const py::object& timeout) {
            return self.send(message, timeout, "Distributor.send_for()");
          },
          py::arg("message"), py::arg("timeout"),
          "Like send(), waiting at most `timeout` seconds (None: no limit); returns whether a consumer took the "
          "message.")
      .def("take_undelivered", &PyDistributor::take_undelivered,
           "Removes the consumers known to be gone and returns the messages they never received, oldest first.");
  bind_common(distributor);

  py::class_<PyBroadcast> broadcast(
      module, "Broadcast",
      "Sends each message to every consumer; a tensor travels as a handle to the same storage to each. A consumer "
      "with max_in_flight messages in flight is waited for (send) or, after send_for's timeout, misses the message. "
      "Thread-safe.");
  broadcast
      .def(py::init<std::size_t, double, std::string>(), py::arg("max_in_flight") = FanoutOptions{}.max_in_flight,
           py::arg("liveness_check_interval") =
               std::chrono::duration<double>(FanoutOptions{}.liveness_check_interval).count(),
           py::kw_only(), py::arg("name") = "",
           "FanoutOptions as keyword arguments (liveness_check_interval in seconds; name: the label "
           "ferry.snapshot() and the ferry tool show).")
      .def(
          "send",
          [](PyBroadcast& self, py::handle message) { return self.send(message, py::none(), "Broadcast.send()"); },
          py::arg("message"),
          "Sends `message` to every consumer, waiting without the GIL for each full one; returns how many it "
          "reached. Raises ChannelClosed after close() (also close() from another thread while it waits: the "
          "consumers still full did not get the message), KeyboardInterrupt on Ctrl-C.")
      .def(
          "send_for",
          [](PyBroadcast& self, py::handle message, const py::object& timeout) {
            return self.send(message, timeout, "Broadcast.send_for()");
          },
          py::arg("message"), py::arg("timeout"),
          "Like send(); a consumer still full after `timeout` seconds (None: no limit) misses the message. "
          "Returns how many it reached.");
  bind_common(broadcast);
}

}  // namespace ferry::python
