#include "blocking_call.hpp"

#include <cmath>
#include <string>

namespace py = pybind11;

namespace ferry::python {
void check_blocking_call(void* context) {
  auto* state = static_cast<BlockingCallState*>(context);
  if (state->abandoned != nullptr && state->abandoned->load(std::memory_order_acquire)) throw WaitInterrupted();
  if (!state->main_thread) return;
  if (state->raised) throw WaitInterrupted();  // already raised: the wait must end
  const py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) {
    state->raised.emplace();  // takes the pending exception (KeyboardInterrupt)
    throw WaitInterrupted();
  }
}

bool in_main_thread() {
  // The main thread's id, read once with the GIL held (as every caller holds it).
  static const unsigned long main_id = [] {
    const py::object thread = py::module_::import("threading").attr("main_thread")();
    return thread.attr("ident").cast<unsigned long>();
  }();
  return PyThread_get_thread_ident() == main_id;
}

std::optional<std::chrono::nanoseconds> timeout_from_python(const py::handle& timeout, const char* api) {
  if (timeout.is_none()) return std::nullopt;
  double seconds = 0;
  try {
    seconds = timeout.cast<double>();
  } catch (const py::cast_error&) {
    throw py::type_error(std::string(api) + ": timeout must be None (no limit) or a number of seconds");
  }
  if (std::isnan(seconds) || seconds < 0) {
    throw py::value_error(std::string(api) + ": timeout must be None (no limit) or a number of seconds >= 0");
  }
  return saturating_nanoseconds(std::chrono::duration<double>(seconds));
}

}  // namespace ferry::python
