// Which process this is (in a form that survives pid reuse), whether another process is
// still running, and whether this process is a fork of the one that created some state.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>

namespace ferry::detail {

/// A process, named by its pid and its start time (clock ticks after boot, as in
/// /proc/<pid>/stat), so that a pid reused by a later process is not mistaken for it.
struct ProcessIdentity {
  std::int32_t pid = 0;
  std::uint64_t start_time = 0;
  friend bool operator==(const ProcessIdentity&, const ProcessIdentity&) = default;
};

/// This process. Read from /proc once per process (and again in a forked child).
/// Throws SystemError when /proc cannot be read.
ProcessIdentity current_process();

/// The identity of the running process `pid`, or nullopt when there is none. Throws
/// SystemError when /proc/<pid>/stat exists but cannot be read.
std::optional<ProcessIdentity> identify_process(std::int32_t pid);

/// True while `process` runs: false once it has exited, even while it is a zombie that
/// its parent has not reaped yet, and false when its pid now names another process.
/// Conservative: a process that exists but cannot be inspected (another user's, or /proc
/// mounted with hidepid) counts as running. Uses kill(pid, 0) and /proc/<pid>/stat;
/// never throws.
bool process_alive(const ProcessIdentity& process) noexcept;

// Counted by a fork handler that process_identity.cpp registers before main().
extern std::atomic<std::uint64_t> g_fork_generation;

/// A number that every fork() increments in the child. State that belongs to the process
/// that created it (free lists, holds on another process's memory) records the value at
/// creation and is left alone in a forked child, where the value differs. A plain load:
/// every block allocated or freed asks.
inline std::uint64_t fork_generation() noexcept { return detail::g_fork_generation.load(std::memory_order_relaxed); }

}  // namespace ferry::detail
