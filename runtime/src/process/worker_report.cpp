#include "process/worker_report.hpp"

#include <cxxabi.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <typeinfo>

#include "ferry/detail/errno_text.hpp"
#include "ferry/detail/sigpipe_blocked.hpp"

namespace ferry::detail {
namespace {

// A report is read after the worker exited; keep it within a default pipe's capacity so
// that writing it never waits for the parent.
constexpr std::size_t kMaxReportText = std::size_t{24} * 1024;

void write_all(int fd, const void* data, std::size_t size) noexcept {
  const auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    SigpipeBlocked blocked;  // a reader gone is EPIPE, never a signal
    const ssize_t written = ::write(fd, bytes, size);
    if (written < 0 && errno == EPIPE) blocked.consume();
    if (written < 0) {
      if (errno == EINTR) continue;
      return;  // the parent is gone: nobody to tell
    }
    bytes += written;
    size -= static_cast<std::size_t>(written);
  }
}

void append_text(std::string& record, std::string_view text) {
  const auto size = static_cast<std::uint32_t>(std::min(text.size(), kMaxReportText));
  record.append(reinterpret_cast<const char*>(&size), sizeof size);
  record.append(text.data(), size);
}

bool take_text(std::string_view& bytes, std::string& out) {
  std::uint32_t size = 0;
  if (bytes.size() < sizeof size) return false;
  std::memcpy(&size, bytes.data(), sizeof size);
  bytes.remove_prefix(sizeof size);
  if (bytes.size() < size) return false;
  out.assign(bytes.substr(0, size));
  bytes.remove_prefix(size);
  return true;
}

std::string describe_start_failure(StartStep step, int error) {
  std::string what;
  switch (step) {
    case StartStep::ParentDeathSignal: what = "prctl(PR_SET_PDEATHSIG) failed"; break;
    case StartStep::InheritDescriptor: what = "could not clear FD_CLOEXEC on a descriptor it inherits"; break;
    case StartStep::Exec: what = "exec of /proc/self/exe failed"; break;
    default: what = "step " + std::to_string(static_cast<int>(step)) + " failed"; break;
  }
  return what + ": " + detail::errno_text(error);
}

}  // namespace

WorkerReport parse_report(std::string_view bytes) {
  WorkerReport report;
  while (!bytes.empty()) {
    const char kind = bytes.front();
    bytes.remove_prefix(1);
    if (kind == 'S') {
      report.started = true;
    } else if (kind == 'E') {
      std::string type;
      std::string message;
      if (!take_text(bytes, type) || !take_text(bytes, message)) break;
      report.threw = true;
      report.exception_type = std::move(type);
      report.exception_message = std::move(message);
    } else if (kind == 'X') {
      std::uint8_t step = 0;
      std::int32_t error = 0;
      if (bytes.size() < sizeof step + sizeof error) break;
      std::memcpy(&step, bytes.data(), sizeof step);
      std::memcpy(&error, bytes.data() + sizeof step, sizeof error);
      bytes.remove_prefix(sizeof step + sizeof error);
      report.start_failed = true;
      report.start_failure = describe_start_failure(static_cast<StartStep>(step), error);
    } else {
      break;  // not a record: ignore the rest
    }
  }
  return report;
}

void report_started(int fd) noexcept { write_all(fd, "S", 1); }

void report_start_failure(int fd, StartStep step, int error) noexcept {
  char record[1 + sizeof(std::uint8_t) + sizeof(std::int32_t)];
  record[0] = 'X';
  const auto raw_step = static_cast<std::uint8_t>(step);
  const auto raw_error = static_cast<std::int32_t>(error);
  std::memcpy(record + 1, &raw_step, sizeof raw_step);
  std::memcpy(record + 1 + sizeof raw_step, &raw_error, sizeof raw_error);
  write_all(fd, record, sizeof record);
}

std::string current_exception_type() {
  const std::type_info* type = abi::__cxa_current_exception_type();
  if (type == nullptr) return "unknown exception";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(type->name(), nullptr, nullptr, &status),
                                                   std::free);
  return status == 0 && demangled ? std::string(demangled.get()) : std::string(type->name());
}

int run_reported(int report_fd, const std::function<void()>& body) noexcept {
  std::string type;
  std::string message;
  try {
    try {
      report_started(report_fd);
      body();
      return 0;
    } catch (const std::exception& error) {
      type = current_exception_type();
      message = error.what();
    } catch (...) {
      type = current_exception_type();
    }
    std::string record = "E";
    append_text(record, type);
    append_text(record, message);
    write_all(report_fd, record.data(), record.size());
  } catch (...) {
    // Out of memory while describing the failure: the exit status still says it failed.
  }
  return 1;
}

}  // namespace ferry::detail
