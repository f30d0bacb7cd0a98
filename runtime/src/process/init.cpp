#include "ferry/init.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ferry/detail/worker_registry.hpp"
#include "ferry/detail/worker_table.hpp"
#include "ferry/error.hpp"
#include "process/worker_launch.hpp"
#include "process/worker_report.hpp"

namespace ferry {
namespace {

std::atomic<bool> g_initialized{false};
std::vector<std::string> g_arguments;

void set_close_on_exec(int fd) {
  const int flags = ::fcntl(fd, F_GETFD);
  if (flags < 0 || ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC) != 0)
    throw_errno("fcntl(FD_CLOEXEC) on fd " + std::to_string(fd));
}

// Runs the worker this re-executed process was started for, then ends the process.
[[noreturn]] void run_exec_worker(const std::string& text) {
  const std::optional<detail::ExecWorkerSpec> spec = detail::decode_spec(text);
  if (!spec) {
    std::fprintf(stderr, "ferry: %s=\"%s\" is malformed; this variable is for ferry's own use\n",
                 detail::kWorkerVariable, text.c_str());
    std::exit(2);  // NOLINT(concurrency-mt-unsafe): an exec'd worker's start, before any thread
  }
  // PR_SET_PDEATHSIG survived exec; the parent may have died since it was set.
  if (detail::bind_to_parent(spec->parent, spec->parent_death_signal) != 0) std::_Exit(1);
  detail::set_worker_rank(spec->rank);
  const int status = detail::run_reported(spec->report_fd, [&] {
    set_close_on_exec(spec->report_fd);  // our own children must not hold the report pipe
    detail::UniqueFd payload(spec->payload_fd);
    set_close_on_exec(payload.get());
    const detail::RegisteredWorker& worker = detail::find_worker(spec->name);
    WorkerContext context(spec->rank, spec->world_size, StartMethod::Spawn, spec->parent);
    worker.run_exec(context, std::move(payload));
  });
  std::exit(status);  // NOLINT(concurrency-mt-unsafe): the worker's end, as a return from main()
}

}  // namespace

namespace detail {

const std::vector<std::string>* recorded_arguments() noexcept {
  return g_initialized.load(std::memory_order_acquire) ? &g_arguments : nullptr;
}

}  // namespace detail

void init(int argc, char** argv) {
  if (!g_initialized.load(std::memory_order_acquire)) {
    g_arguments.assign(argv, argv + (argc > 0 ? argc : 0));
    g_initialized.store(true, std::memory_order_release);
  }
  const char* worker = std::getenv(detail::kWorkerVariable);
  if (worker == nullptr) return;
  std::string text = worker;
  // Programs this worker starts itself are not ferry workers (unless spawned as such).
  ::unsetenv(detail::kWorkerVariable);  // NOLINT(concurrency-mt-unsafe): init() runs first in main()
  run_exec_worker(text);
}

bool initialized() noexcept { return g_initialized.load(std::memory_order_acquire); }

}  // namespace ferry
