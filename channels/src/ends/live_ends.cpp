#include "ferry/detail/live_ends.hpp"
#include "ferry/detail/thread_annotations.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <unordered_set>

#include "ferry/error.hpp"
#include "introspection/server.hpp"

namespace ferry::detail {

namespace {
// How many of the live ends lived through a fork() (LiveEnd::copied_by_fork_).
std::atomic<std::size_t> g_ends_copied_by_fork{0};
}  // namespace

struct LiveEndsAccess {
  static void mark_copied_by_fork(const std::unordered_set<LiveEnd*>& ends) noexcept {
    for (LiveEnd* end : ends) {
      if (end->copied_by_fork_) continue;
      end->copied_by_fork_ = true;
      g_ends_copied_by_fork.fetch_add(1, std::memory_order_relaxed);
    }
  }
  static void forget(LiveEnd& end) noexcept {
    if (end.copied_by_fork_) g_ends_copied_by_fork.fetch_sub(1, std::memory_order_relaxed);
  }
};

namespace {

struct LiveEnds {
  detail::Mutex mutex;
  std::unordered_set<LiveEnd*> ends FERRY_GUARDED_BY(mutex);
};

LiveEnds& live_ends() {
  static LiveEnds* instance = [] {
    auto* created = new LiveEnds();  // never destroyed: ends may outlive static destruction
    // A fork() while another thread changes the list must not leave the child's copy of
    // the mutex locked: hold it across fork(). Every end alive now has a copy in the child.
    const int rc = ::pthread_atfork(
        []() FERRY_NO_THREAD_SAFETY_ANALYSIS {
          live_ends().mutex.lock();
          LiveEndsAccess::mark_copied_by_fork(live_ends().ends);
        },
        []() FERRY_NO_THREAD_SAFETY_ANALYSIS { live_ends().mutex.unlock(); },
        []() FERRY_NO_THREAD_SAFETY_ANALYSIS { live_ends().mutex.unlock(); });
    if (rc != 0) throw_system_error("pthread_atfork", rc);
    return created;
  }();
  return *instance;
}

// Made before main(): a fork() while another thread is still making it would leave the child
// waiting for ever on the static's initialization guard.
[[maybe_unused]] const LiveEnds& g_live_ends_made_at_start = live_ends();

// FERRY_INTROSPECT=1 turns introspection on as the channel layer starts: this file is in
// every program that makes a channel end or a listener.
[[maybe_unused]] const bool g_introspection_from_environment = start_introspection_from_environment();

}  // namespace

void LiveEnd::track() {
  LiveEnds& list = live_ends();
  const detail::MutexLock lock(list.mutex);
  list.ends.insert(this);
}

void LiveEnd::untrack() noexcept {
  LiveEnds& list = live_ends();
  const detail::MutexLock lock(list.mutex);
  if (list.ends.erase(this) != 0) LiveEndsAccess::forget(*this);
}

void abandon_live_ends_except(std::span<const LiveEnd* const> keep) noexcept {
  LiveEnds& list = live_ends();
  const detail::MutexLock lock(list.mutex);
  for (LiveEnd* end : list.ends) {
    if (std::find(keep.begin(), keep.end(), end) == keep.end()) end->abandon_in_child();
  }
}

void release_ends_owned_elsewhere() noexcept {
  LiveEnds& list = live_ends();
  const detail::MutexLock lock(list.mutex);
  for (LiveEnd* end : list.ends) end->release_if_owned_elsewhere();
}

std::size_t ends_copied_by_fork() noexcept { return g_ends_copied_by_fork.load(std::memory_order_relaxed); }

std::chrono::nanoseconds release_check_slice() noexcept {
  return ends_copied_by_fork() != 0 ? std::chrono::nanoseconds(kReleaseCheck) : std::chrono::nanoseconds::max();
}

void describe_live_ends(Snapshot& out) {
  LiveEnds& list = live_ends();
  const detail::MutexLock lock(list.mutex);
  for (const LiveEnd* end : list.ends) end->describe(out);
}

void sample_live_ends_activity(std::int64_t now) noexcept {
  LiveEnds& list = live_ends();
  const detail::MutexLock lock(list.mutex);
  for (LiveEnd* end : list.ends) end->sample_activity(now);
}

std::uint64_t next_end_id() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

std::size_t live_end_count() {
  LiveEnds& list = live_ends();
  const detail::MutexLock lock(list.mutex);
  return list.ends.size();
}

}  // namespace ferry::detail
