// ferry.Sender and ferry.Receiver: the ends of a channel of ferry::Value seen from Python.
// Waiting (a full transport, an empty one) releases the GIL; a thread waiting in recv()
// still sees Ctrl-C (signals are checked every 100 ms).
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <mutex>

#include "ferry/channel.hpp"
#include "ferry/value.hpp"
#include "py_value.hpp"

namespace ferry::python {

/// How long a wait (recv, send to a full transport, accept) runs without the GIL before it
/// checks for signals (Ctrl-C).
inline constexpr std::chrono::milliseconds kSignalCheck{100};

/// The sending end: send() from any thread.
class PySender {
 public:
  explicit PySender(Sender<PyValue> end) : end_(std::move(end)) {}
  ~PySender();
  PySender(const PySender&) = delete;
  PySender& operator=(const PySender&) = delete;

  void send(pybind11::handle object);
  void close();
  bool is_open() const noexcept { return end_.is_open(); }
  Sender<PyValue>& end() noexcept { return end_; }

 private:
  Sender<PyValue> end_;
};

/// The receiving end. One receive at a time: a second thread's recv() waits for the first.
class PyReceiver {
 public:
  explicit PyReceiver(Receiver<PyValue> end) : end_(std::move(end)) {}
  ~PyReceiver();
  PyReceiver(const PyReceiver&) = delete;
  PyReceiver& operator=(const PyReceiver&) = delete;

  /// The next message; ChannelClosed once the sender closed the stream.
  pybind11::object recv();
  /// The next message within `timeout_seconds`; TimeoutError when none came.
  pybind11::object recv_for(double timeout_seconds);
  /// For iteration: the next message; StopIteration once the sender closed the stream.
  pybind11::object next();
  void close();
  bool is_open() const noexcept { return end_.is_open(); }
  Receiver<PyValue>& end() noexcept { return end_; }

 private:
  // Waits (without the GIL, checking for signals every kSignalCheck) until a message
  // comes, the stream ends (`ended` set) or `deadline` passes; nullopt when none came.
  std::optional<PyValue> receive_until(std::optional<std::chrono::steady_clock::time_point> deadline, bool& ended);

  Receiver<PyValue> end_;
  std::mutex mutex_;  // Receiver<T> is for one thread at a time
};

/// Adds ferry.Sender, ferry.Receiver and the functions that make ends to `module`.
void bind_ends(pybind11::module_& module);

}  // namespace ferry::python
