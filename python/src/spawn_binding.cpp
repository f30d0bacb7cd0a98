#include "spawn_binding.hpp"

#include <pybind11/stl.h>

#include <cereal/archives/binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include <atomic>
#include <chrono>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "blocking_call.hpp"
#include "ends_binding.hpp"
#include "error_text.hpp"
#include "ferry/detail/live_ends.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/detail/worker_registry.hpp"
#include "ferry/end_description.hpp"
#include "ferry/init.hpp"
#include "ferry/worker_group.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

/// The registered name under which a re-executed interpreter runs a Python worker.
constexpr const char* kPythonWorker = "ferry.python";

/// A Python worker's exception, carried to the parent as WorkerFailed's message:
/// the exception's type name, a newline, then the formatted traceback.
class PythonWorkerRaised : public Error {
 public:
  using Error::Error;
};

// Runs the outcome of a Python worker body: None when it returned; (type name, traceback
// text) when it raised, which becomes the C++ exception the report pipe carries.
void raise_outcome(const py::object& outcome) {
  if (outcome.is_none()) return;
  const auto parts = outcome.cast<py::tuple>();
  throw PythonWorkerRaised(parts[0].cast<std::string>() + "\n" + parts[1].cast<std::string>());
}

// The entry of the registered worker "ferry.python" in a re-executed interpreter: the
// payload is what ferry._spawn wrote; ferry._spawn._exec_worker reads it and runs the
// function. Called inside ferry::init(), which _run_exec_worker called with the GIL.
void python_entry(detail::FunctionIdentity /*identity*/, WorkerContext& context, detail::UniqueFd payload) {
  const py::object run = py::module_::import("ferry._spawn").attr("_exec_worker");
  raise_outcome(run(context.rank(), context.world_size(), payload.release()));
}

void python_invoke(detail::FunctionIdentity /*identity*/, WorkerContext& /*context*/, void* /*values*/) {
  throw SpawnError("the Python worker entry runs only in a re-executed interpreter");
}

void python_marker() {}

py::dict failure_details(const WorkerFailed& failure) {
  py::dict details;
  const auto& d = failure.details();
  details["rank"] = d.rank;
  details["world_size"] = d.world_size;
  details["pid"] = d.pid;
  details["terminated_siblings"] = d.terminated_siblings;
  details["exit_code"] = py::none();
  details["signal"] = py::none();
  details["exception_type"] = py::none();
  details["traceback"] = py::none();
  details["start_failure"] = py::none();
  switch (d.failure) {
    case WorkerFailure::Exception: {
      details["cause"] = "exception";
      details["exit_code"] = d.exit_code;
      if (d.exception_type.find("PythonWorkerRaised") != std::string::npos) {
        const std::size_t newline = d.message.find('\n');
        details["exception_type"] = d.message.substr(0, newline);
        details["traceback"] = newline == std::string::npos ? std::string() : d.message.substr(newline + 1);
      } else {
        details["exception_type"] = d.exception_type;
        details["traceback"] = d.message;
      }
      break;
    }
    case WorkerFailure::ExitCode:
      details["cause"] = "exit_code";
      details["exit_code"] = d.exit_code;
      break;
    case WorkerFailure::Signal:
      details["cause"] = "signal";
      details["signal"] = d.signal;
      break;
    case WorkerFailure::StartFailed:
      details["cause"] = "start_failed";
      details["start_failure"] = python_error_text(d.message);
      details["exit_code"] = d.exit_code;
      if (d.signal != 0) details["signal"] = d.signal;
      break;
  }
  return details;
}

// Python's fork hooks around a fork that C++ makes (os.fork does the same): the import
// lock and os.register_at_fork callbacks before, the interpreter's state after.
class PythonFork {
 public:
  PythonFork() { PyOS_BeforeFork(); }
  ~PythonFork() {
    if (!in_child_) PyOS_AfterFork_Parent();
  }
  PythonFork(const PythonFork&) = delete;
  PythonFork& operator=(const PythonFork&) = delete;
  void entered_child() noexcept { in_child_ = true; }

 private:
  bool in_child_ = false;
};

class PyWorkerGroup {
 public:
  PyWorkerGroup(int world_size, const std::string& start_method, double termination_grace, bool fork_with_threads)
      : group_(world_size, options(start_method, termination_grace, fork_with_threads)) {}

  // Starts worker `rank` by fork(); the child runs `body()` (with the GIL, as the thread
  // that forked) and exits: 0 when it returns None, 1 after reporting (type, traceback).
  void start_forked(int rank, const py::object& body) {
    PythonFork fork;
    group_.start_forked(rank, [&](WorkerContext&) {
      fork.entered_child();
      PyOS_AfterFork_Child();
      raise_outcome(body());
    });
  }

  // Starts worker `rank` by exec of the recorded interpreter command line, with the payload
  // memfd and the descriptors it inherits.
  void start_exec(int rank, int payload_fd, const std::vector<int>& inherited) {
    group_.start_exec(rank, kPythonWorker, payload_fd, inherited);
  }

  // Waits (call_blocking) until every worker finished (True), the time ran out (False), or
  // one failed (a dict of its details). terminate() from another thread ends the wait
  // (ferry.Error) before it terminates the workers.
  py::object join(const py::object& timeout) {
    const std::optional<std::chrono::nanoseconds> limit = timeout_from_python(timeout, "WorkerGroup.join()");
    try {
      return py::bool_(call_blocking(
          [&] {
            const detail::MutexLock lock(mutex_);
            if (!limit) {
              group_.join();
              return true;
            }
            return group_.join(Timeout(*limit));
          },
          &terminating_, ""));
    } catch (const WorkerFailed& failure) {
      return failure_details(failure);
    } catch (const Abandoned&) {
      throw Error(
          "WorkerGroup.join(): terminate() was called in another thread while join() waited; the workers "
          "were terminated");
    }
  }

  void terminate() {
    terminating_.store(true, std::memory_order_release);  // a join waiting in another thread gives up
    py::gil_scoped_release release;
    const detail::MutexLock lock(mutex_);
    group_.terminate();
  }
  int size() const noexcept { return group_.size(); }
  int running() const noexcept { return group_.running(); }
  pid_t pid(int rank) const { return group_.pid(rank); }
  py::object exit_status(int rank) const {
    const std::optional<ExitStatus> status = group_.exit_status(rank);
    if (!status) return py::none();
    return py::make_tuple(status->exited, status->code, status->signal);
  }

  // NOLINTNEXTLINE(bugprone-exception-escape): gil_scoped_release throws only before pybind11 is initialized
  ~PyWorkerGroup() {
    if (group_.running() > 0 && _Py_IsFinalizing() == 0 && PyGILState_Check() == 1) {
      py::gil_scoped_release release;  // terminating waits for the workers
      group_.terminate();
    }
  }
  PyWorkerGroup(const PyWorkerGroup&) = delete;
  PyWorkerGroup& operator=(const PyWorkerGroup&) = delete;

 private:
  static SpawnOptions options(const std::string& start_method, double termination_grace, bool fork_with_threads) {
    SpawnOptions options;
    if (start_method == "fork") {
      options.start_method = StartMethod::Fork;
    } else if (start_method == "spawn") {
      options.start_method = StartMethod::Spawn;
    } else {
      throw py::value_error("ferry.spawn's start_method is 'fork' or 'spawn', not '" + start_method + "'");
    }
    if (!(termination_grace >= 0)) throw py::value_error("termination_grace must be a number of seconds >= 0");
    options.termination_grace = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::duration<double>(std::min(termination_grace, 1e9)));
    options.fork_with_threads = fork_with_threads;
    return options;
  }

  detail::Mutex mutex_;  // join() against terminate() from another thread; taken without the GIL
  WorkerGroup group_;
  std::atomic<bool> terminating_{false};  // terminate() was called: a waiting join gives up
};

// The frame core of a Python end, as the list of live ends sees it.
const detail::LiveEnd* live_end_of(py::handle end) {
  if (py::isinstance<PySender>(end)) return detail::as_live_end(detail::EndAccess::core(end.cast<PySender&>().end()));
  return detail::as_live_end(detail::EndAccess::core(end.cast<PyReceiver&>().end()));
}

std::string encode_description(const EndDescription& description) {
  std::ostringstream out;
  {
    cereal::BinaryOutputArchive archive(out);
    archive(description);
  }
  return out.str();
}

}  // namespace

void bind_spawn(py::module_& module) {
  static const bool registered =
      detail::register_worker_entry(kPythonWorker, reinterpret_cast<detail::FunctionIdentity>(&python_marker), "python",
                                    &python_entry, &python_invoke);
  (void)registered;
  static py::exception<SpawnError> spawn_error(module, "SpawnError", module.attr("Error").ptr());
  spawn_error.doc() = "ferry.spawn cannot start the workers as asked (raised before any worker starts).";
  // Registered after errors.cpp's translator, so tried before it (pybind11 tries the last first).
  // NOLINTNEXTLINE(performance-unnecessary-value-param): pybind11's translator type takes it by value
  py::register_exception_translator([](std::exception_ptr raised) {
    try {
      if (raised) std::rethrow_exception(raised);
    } catch (const SpawnError& e) {
      PyErr_SetString(spawn_error.ptr(), python_error_text(e.what()).c_str());
    }
  });

  py::class_<PyWorkerGroup>(module, "_WorkerGroup")
      // Without the GIL: the check for other threads waits a moment for threads that are ending,
      // and a Python thread cannot end while this one holds the lock.
      .def(py::init<int, const std::string&, double, bool>(), py::arg("world_size"), py::arg("start_method"),
           py::arg("termination_grace"), py::arg("fork_with_threads"), py::call_guard<py::gil_scoped_release>())
      .def("start_forked", &PyWorkerGroup::start_forked, py::arg("rank"), py::arg("body"))
      .def("start_exec", &PyWorkerGroup::start_exec, py::arg("rank"), py::arg("payload_fd"), py::arg("inherited"))
      .def("join", &PyWorkerGroup::join, py::arg("timeout") = py::none())
      .def("terminate", &PyWorkerGroup::terminate)
      .def_property_readonly("size", &PyWorkerGroup::size)
      .def_property_readonly("running", &PyWorkerGroup::running)
      .def("pid", &PyWorkerGroup::pid, py::arg("rank"))
      .def("exit_status", &PyWorkerGroup::exit_status, py::arg("rank"));

  module.def(
      "_record_command_line",
      [](const std::vector<std::string>& argv) {
        if (ferry::initialized()) return false;
        std::vector<std::string> copy = argv;
        std::vector<char*> pointers;
        pointers.reserve(copy.size() + 1);
        for (std::string& argument : copy) pointers.push_back(argument.data());
        pointers.push_back(nullptr);
        ferry::init(static_cast<int>(copy.size()), pointers.data());
        return true;
      },
      py::arg("argv"));
  module.def(
      "_run_exec_worker",
      [](const std::vector<std::string>& argv) {
        std::vector<std::string> copy = argv;
        std::vector<char*> pointers;
        pointers.reserve(copy.size() + 1);
        for (std::string& argument : copy) pointers.push_back(argument.data());
        pointers.push_back(nullptr);
        ferry::init(static_cast<int>(copy.size()), pointers.data());  // runs the worker and exits
        throw SpawnError("this interpreter was not started by ferry.spawn as a worker");
      },
      py::arg("argv"));
  module.def(
      "_keep_only_ends",
      [](const py::list& ends) {
        std::vector<const detail::LiveEnd*> keep;
        for (const py::handle end : ends) keep.push_back(live_end_of(end));
        detail::abandon_live_ends_except(keep);
      },
      py::arg("ends"), "In a freshly forked worker: drops every end of the process except `ends`.");
  module.def(
      "_hand_over",
      [](py::handle end, bool to_this_process) {
        if (py::isinstance<PySender>(end)) {
          auto& sender = end.cast<PySender&>().end();
          to_this_process ? sender.adopt() : sender.detach();
        } else {
          auto& receiver = end.cast<PyReceiver&>().end();
          to_this_process ? receiver.adopt() : receiver.detach();
        }
      },
      py::arg("end"), py::arg("to_this_process"));
  module.def(
      "_end_state",
      [](py::handle end) {
        const auto state = [](auto& typed) {
          const bool open = typed.is_open();
          const Transport transport = open ? typed.transport() : Transport::Pipe;
          const bool frames = open && transport != Transport::InProcess && transport != Transport::Ucx;
          return py::make_tuple(open, open ? std::string(transport_name(transport)) : std::string(),
                                frames && detail::core_used(detail::EndAccess::core(typed)));
        };
        if (py::isinstance<PySender>(end)) return state(end.cast<PySender&>().end());
        return state(end.cast<PyReceiver&>().end());
      },
      py::arg("end"), "(open, transport name, carried messages already) of a Sender or Receiver.");
  module.def(
      "_describe_end",
      [](py::handle end) {
        const EndDescription description = py::isinstance<PySender>(end) ? describe_end(end.cast<PySender&>().end())
                                                                         : describe_end(end.cast<PyReceiver&>().end());
        return py::make_tuple(py::bytes(encode_description(description)), description.fds);
      },
      py::arg("end"), "(cereal EndDescription bytes, descriptors) of an end, for a worker started by exec.");
}

}  // namespace ferry::python
