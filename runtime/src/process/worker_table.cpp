#include "ferry/detail/worker_table.hpp"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

#include "ferry/detail/thread_annotations.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {
namespace {

struct WorkerTableEntry {
  std::uint64_t group = 0;
  pid_t owner = -1;  // the process that started the worker
  StartedWorker worker;
};

struct WorkerTable {
  detail::Mutex mutex;
  std::vector<WorkerTableEntry> entries FERRY_GUARDED_BY(mutex);
};

WorkerTable& worker_table() {
  static WorkerTable* instance = [] {
    auto* created = new WorkerTable();  // never destroyed: groups may outlive static destruction
    // A fork() while another thread (introspection's) reads the table must not leave the
    // child's copy of the mutex locked.
    // (The analysis cannot follow a lock taken in one handler and released in another.)
    const int rc = ::pthread_atfork([]() FERRY_NO_THREAD_SAFETY_ANALYSIS { worker_table().mutex.lock(); },
                                    []() FERRY_NO_THREAD_SAFETY_ANALYSIS { worker_table().mutex.unlock(); },
                                    []() FERRY_NO_THREAD_SAFETY_ANALYSIS { worker_table().mutex.unlock(); });
    if (rc != 0) throw_system_error("pthread_atfork", rc);
    return created;
  }();
  return *instance;
}

// Made before main(), as live_ends.cpp's list: never first made by two threads around a fork.
[[maybe_unused]] const WorkerTable& g_worker_table_made_at_start = worker_table();

std::atomic<int> g_worker_rank{-1};
std::atomic<int> g_background_threads{0};
std::atomic<ForkedWorkerHook> g_forked_worker_hook{nullptr};
std::atomic<bool> g_introspection_for_workers{false};

}  // namespace

std::uint64_t new_worker_group_key() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

void record_worker_started(std::uint64_t group, int rank, pid_t pid) {
  WorkerTable& table = worker_table();
  const detail::MutexLock lock(table.mutex);
  table.entries.push_back(WorkerTableEntry{group, ::getpid(), StartedWorker{rank, pid, std::nullopt}});
}

void record_child_ended(pid_t pid, const ExitStatus& status) noexcept {
  WorkerTable& table = worker_table();
  const pid_t self = ::getpid();
  const detail::MutexLock lock(table.mutex);
  for (WorkerTableEntry& entry : table.entries) {
    if (entry.owner == self && entry.worker.pid == pid && !entry.worker.status) entry.worker.status = status;
  }
}

void forget_worker_group(std::uint64_t group) noexcept {
  WorkerTable& table = worker_table();
  const detail::MutexLock lock(table.mutex);
  std::erase_if(table.entries, [&](const WorkerTableEntry& entry) { return entry.group == group; });
}

std::vector<StartedWorker> recorded_workers() {
  WorkerTable& table = worker_table();
  const pid_t self = ::getpid();
  std::vector<StartedWorker> workers;
  const detail::MutexLock lock(table.mutex);
  for (const WorkerTableEntry& entry : table.entries) {
    if (entry.owner == self) workers.push_back(entry.worker);
  }
  return workers;
}

void set_worker_rank(int rank) noexcept { g_worker_rank.store(rank, std::memory_order_relaxed); }

std::optional<int> worker_rank() noexcept {
  const int rank = g_worker_rank.load(std::memory_order_relaxed);
  if (rank < 0) return std::nullopt;
  return rank;
}

void add_background_thread(int delta) noexcept { g_background_threads.fetch_add(delta, std::memory_order_relaxed); }
int background_threads() noexcept { return g_background_threads.load(std::memory_order_relaxed); }

void set_introspection_for_workers(bool on) noexcept { g_introspection_for_workers.store(on); }
bool introspection_for_workers() noexcept { return g_introspection_for_workers.load(); }

void set_forked_worker_hook(ForkedWorkerHook hook) noexcept { g_forked_worker_hook.store(hook); }

void run_forked_worker_hook() noexcept {
  if (const ForkedWorkerHook hook = g_forked_worker_hook.load()) hook();
}

}  // namespace ferry::detail
