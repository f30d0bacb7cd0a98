// What a worker process knows about itself, and the settings of a group of workers.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <string_view>

namespace ferry {

/// How worker processes are started.
enum class StartMethod {
  /// fork(): fast; the worker starts with a copy of the parent's memory. Only for
  /// programs that have no other threads (and no CUDA context) when they spawn.
  Fork,
  /// fork() + exec() of this program's own binary, which runs a worker registered by name
  /// (FERRY_WORKER) with its arguments deserialized: a fresh process, required for CUDA.
  /// The program must call ferry::init(argc, argv) first thing in main().
  Spawn,
};

/// "fork" or "spawn".
std::string_view start_method_name(StartMethod method);

/// Settings of a group of workers.
struct SpawnOptions {
  /// How the workers are started.
  StartMethod start_method = StartMethod::Fork;
  /// When a worker fails (or the group is destroyed before join), the other workers get
  /// SIGTERM; those still running after this grace period get SIGKILL (never, for a grace
  /// period of milliseconds::max()).
  std::chrono::milliseconds termination_grace{5000};
  /// The signal a worker receives when its parent dies (PR_SET_PDEATHSIG). SIGKILL makes
  /// sure no worker outlives its parent; SIGTERM lets workers clean up first.
  int parent_death_signal = SIGKILL;
  /// StartMethod::Fork refuses (SpawnError) to start a worker while this process runs other
  /// threads: the worker is a copy of the whole process taken while one of them may hold a
  /// lock (inside malloc, iostreams, a logger, a mutex of yours), and the worker hangs the
  /// first time it takes that lock. Set this when no other thread can hold a lock a worker
  /// needs; otherwise use StartMethod::Spawn, or start the threads after spawning. A thread
  /// that has returned (joined or not) gets 100 ms to leave the process before it counts.
  bool fork_with_threads = false;
};

/// A worker's view of itself, passed as the first argument of every worker function.
class WorkerContext {
 public:
  WorkerContext(int rank, int world_size, StartMethod start_method, pid_t parent_pid) noexcept
      : rank_(rank), world_size_(world_size), start_method_(start_method), parent_pid_(parent_pid) {}

  /// This worker's index in its group: 0 .. world_size() - 1.
  int rank() const noexcept { return rank_; }
  /// The number of workers the group was started with.
  int world_size() const noexcept { return world_size_; }
  /// How this worker was started.
  StartMethod start_method() const noexcept { return start_method_; }
  /// The process that started the group (the worker dies with it).
  pid_t parent_pid() const noexcept { return parent_pid_; }

 private:
  int rank_;
  int world_size_;
  StartMethod start_method_;
  pid_t parent_pid_;
};

}  // namespace ferry
