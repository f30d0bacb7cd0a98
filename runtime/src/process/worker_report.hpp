// The report pipe between a worker process and its parent (private to runtime/).
//
// A worker writes records to the pipe; the parent drains it while it supervises and reads
// the whole report once the worker has exited:
//   'S'                                        the worker function is about to run
//   'E' u32 n, type[n], u32 m, message[m]     the worker function threw
//   'X' u8 step, i32 errno                     the process could not start (async-signal-safe)
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace ferry::detail {

/// Steps of starting a worker that can fail before any C++ code of the worker runs.
enum class StartStep : std::uint8_t { ParentDeathSignal = 1, InheritDescriptor = 2, Exec = 3 };

/// What a worker reported.
struct WorkerReport {
  bool started = false;
  bool threw = false;
  std::string exception_type;
  std::string exception_message;
  bool start_failed = false;
  std::string start_failure;  ///< "exec of /proc/self/exe failed: No such file or directory"
};

/// Parses the bytes a worker wrote to its report pipe (a truncated tail is ignored).
WorkerReport parse_report(std::string_view bytes);

/// Records that the worker function starts. Never throws.
void report_started(int fd) noexcept;
/// Records a start failure; async-signal-safe (used between fork and exec).
void report_start_failure(int fd, StartStep step, int error) noexcept;

/// Runs `body` as a worker: records 'S', runs it, and records an exception that escapes
/// it (type demangled, what() as message). Returns the process exit status to use:
/// 0 on success, 1 when the body threw.
int run_reported(int report_fd, const std::function<void()>& body) noexcept;

/// The demangled type of the exception being handled ("int", "std::runtime_error").
std::string current_exception_type();

}  // namespace ferry::detail
