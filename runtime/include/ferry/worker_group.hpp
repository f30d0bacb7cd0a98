// Supervision of worker processes: start them (fork, or fork + exec of this program),
// wait for them, report how one failed, and terminate the rest when one does.
//
// ferry::spawn (ferry/spawn.hpp) builds on this and hands channel ends to the workers;
// WorkerGroup itself knows nothing about channels.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "ferry/detail/child_process.hpp"
#include "ferry/detail/unique_fd.hpp"
#include "ferry/exit_status.hpp"
#include "ferry/timeout.hpp"
#include "ferry/worker_context.hpp"
#include "ferry/worker_error.hpp"

namespace ferry {

/// A group of worker processes of one spawn. Use it from one thread. Move-only.
///
/// Destroying a group whose workers still run terminates them (SIGTERM, then SIGKILL after
/// the grace period) and reaps them: no worker outlives its group, and no zombie is left.
/// A copy inherited by a process the program forked leaves the workers alone there.
/// Workers also never outlive the parent process: each one gets the parent-death signal
/// (PR_SET_PDEATHSIG) when the *thread* that started it exits, so start workers from a
/// thread that lives as long as they should (normally the main thread).
class WorkerGroup {
 public:
  /// An empty group for `world_size` workers. Throws SpawnError when world_size <= 0 or
  /// when this process ignores SIGCHLD (the kernel would reap the workers before their
  /// exit status could be read).
  WorkerGroup(int world_size, const SpawnOptions& options);
  WorkerGroup(WorkerGroup&& other) noexcept = default;
  WorkerGroup& operator=(WorkerGroup&& other) noexcept;
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;
  ~WorkerGroup();

  /// Starts worker `rank` with fork(). The child sets its parent-death signal, runs
  /// `body` and exits: status 0 when `body` returns, 1 after reporting an exception that
  /// escaped it. The child never returns from this call.
  void start_forked(int rank, const std::function<void(WorkerContext&)>& body);
  /// Starts worker `rank` with fork() + exec() of /proc/self/exe, with the arguments
  /// ferry::init() recorded; init() in the new process runs the worker registered as
  /// `name`, giving it `payload_fd`. The descriptors in `inherited` (and `payload_fd`)
  /// stay open in the new program, at the same numbers; every other ferry descriptor is
  /// close-on-exec. Throws SpawnError when init() was not called in this process.
  void start_exec(int rank, std::string_view name, int payload_fd, std::span<const int> inherited);

  /// Keeps `objects` alive until worker `rank` has been reaped (or the group is gone):
  /// spawn() keeps the storages of a forked worker's tensor arguments this way, since the
  /// worker reads the parent's blocks.
  void keep_until_exit(int rank, std::vector<std::shared_ptr<const void>> objects);

  /// Waits for every worker to finish. Throws WorkerFailed as soon as one fails (threw,
  /// exited non-zero, was killed by a signal), after terminating the others.
  void join();
  /// Like join(), but waits at most `timeout`; returns whether every worker finished.
  bool join(Timeout timeout);
  /// Terminates the running workers (SIGTERM; SIGKILL after the grace period) and reaps
  /// them. Their exit is not treated as a failure.
  void terminate() noexcept;

  /// The number of workers the group was created for.
  int size() const noexcept { return static_cast<int>(workers_.size()); }
  /// How many started workers have not been reaped yet.
  int running() const noexcept;
  /// The process id of worker `rank` (-1 if not started).
  pid_t pid(int rank) const;
  /// How worker `rank` ended, once it has been reaped.
  std::optional<ExitStatus> exit_status(int rank) const;
  const SpawnOptions& options() const noexcept { return options_; }

 private:
  struct Worker {
    detail::ChildProcess process;
    detail::UniqueFd report;  // read end of the worker's report pipe (non-blocking)
    std::string report_bytes;
    bool started = false;  // start_forked/start_exec succeeded
    StartMethod method = StartMethod::Fork;
    std::vector<std::shared_ptr<const void>> kept;  // until reaped (keep_until_exit)
  };
  using Clock = std::chrono::steady_clock;

  Worker& prepare(int rank);
  bool wait_until(Clock::time_point deadline);
  // Reaps the workers that have exited; returns the first failure among them.
  std::optional<WorkerFailed::Details> collect();
  std::optional<WorkerFailed::Details> evaluate(int rank, Worker& worker, const ExitStatus& status) const;
  void drain_report(Worker& worker);
  // SIGTERM to every running worker, SIGKILL after the grace period; returns how many
  // were running.
  int stop_all() noexcept;

  SpawnOptions options_;
  pid_t parent_ = -1;
  std::vector<Worker> workers_;
  std::optional<WorkerFailed> failure_;
  std::uint64_t table_key_;  // its entries in introspection's worker table (worker_table.hpp)
};

}  // namespace ferry
