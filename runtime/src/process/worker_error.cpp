#include "ferry/worker_error.hpp"

#include "ferry/detail/child_process.hpp"

namespace ferry {
namespace {

std::string describe(const WorkerFailed::Details& d) {
  std::string text = "worker " + std::to_string(d.rank) + " of " + std::to_string(d.world_size) + " (pid " +
                     std::to_string(d.pid) + ") ";
  switch (d.failure) {
    case WorkerFailure::Exception:
      text += "failed: " + d.exception_type;
      if (!d.message.empty()) text += ": " + d.message;
      break;
    case WorkerFailure::ExitCode: text += ExitStatus{true, d.exit_code, 0}.describe(); break;
    case WorkerFailure::Signal: text += ExitStatus{false, 0, d.signal}.describe(); break;
    case WorkerFailure::StartFailed: text += "could not start: " + d.message; break;
  }
  if (d.terminated_siblings > 0) {
    text += "; the " + std::to_string(d.terminated_siblings) + " other running worker" +
            (d.terminated_siblings == 1 ? " was" : "s were") + " terminated";
  }
  return text;
}

}  // namespace

WorkerFailed::WorkerFailed(Details details) : Error(describe(details)), details_(std::move(details)) {}

}  // namespace ferry
