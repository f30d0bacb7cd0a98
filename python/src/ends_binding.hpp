// ferry.Sender and ferry.Receiver: the ends of a channel of ferry::Value seen from Python.
// Every wait (a full transport, an empty one) releases the GIL, raises KeyboardInterrupt
// within 50 ms of Ctrl-C in the main thread, and ends when another thread closes the end
// (call_blocking, blocking_call.hpp).
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <optional>

#include "ferry/channel.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/end_description.hpp"
#include "ferry/value.hpp"
#include "py_value.hpp"

namespace ferry::python {

/// The sending end: send() from any thread.
class PySender {
 public:
  explicit PySender(Sender<PyValue> end) : end_(std::move(end)) {}
  // NOLINTNEXTLINE(bugprone-exception-escape): gil_scoped_release throws only before pybind11 is initialized
  ~PySender();
  PySender(const PySender&) = delete;
  PySender& operator=(const PySender&) = delete;

  void send(pybind11::handle object);
  /// Like send(), giving up when the transport stays full for `timeout` seconds (None: no
  /// limit); whether the message was accepted.
  bool send_for(pybind11::handle object, const pybind11::object& timeout);
  /// Ends the stream; a send() blocked in another thread ends with ChannelClosed.
  void close();
  bool is_open() const noexcept { return end_.is_open(); }
  Sender<PyValue>& end() noexcept { return end_; }
  /// True once close() was called: what a wait on end() made elsewhere gives up on.
  const std::atomic<bool>& closing() const noexcept { return closing_; }

 private:
  Sender<PyValue> end_;
  std::atomic<bool> closing_{false};  // close() was called: a waiting send gives up
};

/// The receiving end. One receive at a time: a second thread's recv() waits for the first.
class PyReceiver {
 public:
  explicit PyReceiver(Receiver<PyValue> end) : end_(std::move(end)) {}
  // NOLINTNEXTLINE(bugprone-exception-escape): gil_scoped_release throws only before pybind11 is initialized
  ~PyReceiver();
  PyReceiver(const PyReceiver&) = delete;
  PyReceiver& operator=(const PyReceiver&) = delete;

  /// The next message; ChannelClosed once the sender closed the stream.
  pybind11::object recv();
  /// The next message within `timeout` seconds (None: no limit); TimeoutError when none came.
  pybind11::object recv_for(const pybind11::object& timeout);
  /// For iteration: the next message; StopIteration once the sender closed the stream.
  pybind11::object next();
  /// next() for tp_iternext: a new reference, or nullptr with no Python error set once the
  /// stream ended (what tp_iternext returns for StopIteration, without making one).
  PyObject* next_or_end();
  void close();
  bool is_open() const noexcept { return end_.is_open(); }
  Receiver<PyValue>& end() noexcept { return end_; }

 private:
  // Waits (call_blocking) until a message comes, the stream ends or this end is closed
  // (`ended` set) or `timeout` passes; nullopt when none came.
  std::optional<PyValue> receive_within(std::chrono::nanoseconds timeout, bool& ended);

  Receiver<PyValue> end_;
  detail::Mutex mutex_;               // Receiver<T> is for one thread at a time: recv() against recv()
  std::atomic<bool> closing_{false};  // close() was called: a waiting recv gives up
};

/// Adds ferry.Sender, ferry.Receiver and the functions that make ends to `module`.
void bind_ends(pybind11::module_& module);

/// An EndDescription written by cereal's binary archive (ends handed to a Python process by
/// a C++ parent, by spawn or by pickling). ValueError when `bytes` is not one.
EndDescription parse_description(const std::string& bytes);

}  // namespace ferry::python
