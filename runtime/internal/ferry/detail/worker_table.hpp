// What introspection (ferry/introspection.hpp) learns from the process layer: the workers
// this process started and how they ended, whether this process is itself a worker, and
// the helper threads ferry runs in the background.
//
// Contract: every function is thread-safe. The table lists a worker from its start until
// its WorkerGroup is destroyed; a forked process sees none of its parent's workers.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "ferry/detail/child_process.hpp"

namespace ferry::detail {

/// A key for one WorkerGroup's entries, unique in this process.
std::uint64_t new_worker_group_key() noexcept;
/// Worker `rank` of group `group` started as process `pid`.
void record_worker_started(std::uint64_t group, int rank, pid_t pid);
/// Child `pid` of this process was reaped with `status` (ChildProcess calls it).
void record_child_ended(pid_t pid, const ExitStatus& status) noexcept;
/// The group is gone: its workers leave the table.
void forget_worker_group(std::uint64_t group) noexcept;

struct StartedWorker {
  int rank = 0;
  pid_t pid = -1;
  std::optional<ExitStatus> status;  ///< once reaped
};
/// The workers this process started whose group still lives, in start order.
std::vector<StartedWorker> recorded_workers();

/// Marks this process as worker `rank` (a worker's start calls it).
void set_worker_rank(int rank) noexcept;
/// This process's rank when it is a worker.
std::optional<int> worker_rank() noexcept;

/// Background threads ferry runs in this process (the introspection server), which a
/// fork-started worker does not inherit and which hold no lock a worker needs: the check
/// for other threads before fork() does not count them.
void add_background_thread(int delta) noexcept;
int background_threads() noexcept;

/// Whether introspection runs in this process: workers started by exec then get
/// FERRY_INTROSPECT=1 in their environment (set by the layer above).
void set_introspection_for_workers(bool on) noexcept;
bool introspection_for_workers() noexcept;

/// Called in a worker just started by fork(), before its function runs (the introspection
/// server restarts there); one hook, set by the layer above.
using ForkedWorkerHook = void (*)() noexcept;
void set_forked_worker_hook(ForkedWorkerHook hook) noexcept;
void run_forked_worker_hook() noexcept;

}  // namespace ferry::detail
