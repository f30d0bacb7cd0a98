// Blocking calls made from Python. Contract: call_blocking(wait) runs `wait` (a ferry call
// that may block) with the GIL released and a wait-interruption check installed
// (ferry/wait_interruption.hpp) with the period kPythonCheckPeriod, so that
//  - in the main thread, Ctrl-C (any signal whose Python handler raises) ends the wait at
//    once, as Python's own blocking calls do: the kernel delivers it to the main thread,
//    whose sleep ends with EINTR, and the check runs then; the handler's exception
//    (KeyboardInterrupt) is raised from the call. A signal that lands just before the sleep
//    began (or in another thread) is seen at the next periodic check;
//  - when `abandoned` is given and becomes true (the end's close() from another thread),
//    the wait ends within that period with `Abandoned` thrown.
// The period is longer than ferry's default so that a thread blocked for a while (a trainer
// waiting for its next batch) is not woken for nothing every 50 ms; waits that a signal
// does not end (in-process channels, retry pauses) still check every 50 ms.
// A timeout from Python is None (no limit) or a number of seconds >= 0, everywhere.
// The check takes the GIL (main thread only) while the waiting call holds ferry's locks of
// the object it waits on: a binding must never lock such an object (call one of its methods
// that locks, e.g. SenderCore's) with the GIL held, or the two threads wait for each other.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <optional>

#include "ferry/error.hpp"
#include "ferry/timeout.hpp"
#include "ferry/wait_interruption.hpp"

namespace ferry::python {

/// Thrown by call_blocking() when `abandoned` ended the wait.
class Abandoned : public ChannelClosed {
 public:
  using ChannelClosed::ChannelClosed;
};

struct BlockingCallState {
  const std::atomic<bool>* abandoned = nullptr;
  bool main_thread = false;
  std::optional<pybind11::error_already_set> raised;  // what a Python signal handler raised
};

/// The check installed while a call blocks (takes the GIL only in the main thread).
void check_blocking_call(void* state);

/// Whether the calling thread is Python's main thread (the one that runs signal handlers).
bool in_main_thread();

/// How long a blocking call made from Python sleeps between two periodic checks.
inline constexpr std::chrono::milliseconds kPythonCheckPeriod{250};

/// Runs `wait()` without the GIL, interruptible as the contract above says. `abandoned_message`
/// is the message of Abandoned.
template <class Wait>
auto call_blocking(const Wait& wait, const std::atomic<bool>* abandoned, const char* abandoned_message)
    -> decltype(wait()) {
  BlockingCallState state;
  state.abandoned = abandoned;
  state.main_thread = in_main_thread();
  if (state.main_thread && PyErr_CheckSignals() != 0) throw pybind11::error_already_set();
  try {
    pybind11::gil_scoped_release release;
    const ScopedWaitInterruption interruption(&check_blocking_call, &state, kPythonCheckPeriod);
    return wait();
  } catch (const WaitInterrupted&) {
    if (state.raised) throw *state.raised;  // the GIL is held again here
    throw Abandoned(abandoned_message);
  }
}

/// A timeout given to a Python API: None is no limit (std::nullopt); otherwise a number of
/// seconds >= 0 (ValueError naming `api` otherwise).
std::optional<std::chrono::nanoseconds> timeout_from_python(const pybind11::handle& timeout, const char* api);

/// `timeout` as a ferry::Timeout: no limit is nanoseconds::max() (waits for ever).
inline std::chrono::nanoseconds timeout_or_forever(const std::optional<std::chrono::nanoseconds>& timeout) {
  return timeout ? *timeout : std::chrono::nanoseconds::max();
}

}  // namespace ferry::python
