// The process-wide list of channel ends alive in this process. A worker started by fork()
// inherits a copy of every end its parent holds; it must drop the ones it was not given,
// or a peer would never see end-of-stream (nor the parent's death) on them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

namespace ferry {
struct Snapshot;
}

namespace ferry::detail {

/// An end of a channel (SenderCore, ReceiverCore) as the list of live ends sees it.
class LiveEnd {
 public:
  /// Drops this process's copy of the end's resources (descriptors, mappings) without any
  /// protocol: no Close frame, no locks taken. Only for a freshly forked child, which has
  /// one thread.
  virtual void abandon_in_child() noexcept = 0;
  /// Lets go of this process's copy of the end (its descriptors, as detach() does) when
  /// another process owns it (EndClaim::elsewhere()), so that the copy no longer keeps the
  /// connection open for a peer waiting on the owner. Skips an end another thread is using.
  /// (A listener has no owner to yield to: nothing.)
  virtual void release_if_owned_elsewhere() noexcept {}
  LiveEnd(const LiveEnd&) = delete;
  LiveEnd& operator=(const LiveEnd&) = delete;
  /// Appends what introspection reports of this end to `out` (ferry/introspection.hpp).
  /// Called from any thread while the end lives: reads only atomics and what never changes
  /// after construction, and takes none of the end's locks.
  virtual void describe(Snapshot& /*out*/) const {}
  /// Marks the end active at `now` (monotonic ns) if it moved a message since the last
  /// call (EndStats::sample_activity()); only the introspection server's tick calls it.
  virtual void sample_activity(std::int64_t /*now*/) noexcept {}

 protected:
  LiveEnd() = default;
  ~LiveEnd() = default;
  /// Adds this end to the list (call at the end of the derived constructor).
  void track();
  /// Removes this end from the list (call first in the derived destructor).
  void untrack() noexcept;

 private:
  friend struct LiveEndsAccess;
  bool copied_by_fork_ = false;  // a fork() happened while this end was tracked (under the list's mutex)
};

/// In a freshly forked child: abandons every live end except those in `keep`.
void abandon_live_ends_except(std::span<const LiveEnd* const> keep) noexcept;

/// Lets go of every copy in this process of an end that another process owns (see
/// LiveEnd::release_if_owned_elsewhere()). Called by waits that block for long (every
/// kReleaseCheck), so that a process blocked on one channel does not keep another open:
/// after fork(), a child that took an end and then died must be seen dead by its peer,
/// although the parent still holds a copy of the end it never used.
void release_ends_owned_elsewhere() noexcept;

/// How often a long wait lets go of copies owned elsewhere.
inline constexpr std::chrono::milliseconds kReleaseCheck{100};

/// How many ends alive in this process lived through a fork() (as the parent's or the
/// child's copy): only such an end can be owned elsewhere, since an end's claim word is
/// shared only with the processes fork() made (end_claim.hpp). While there are none, long
/// waits need not wake every kReleaseCheck (one relaxed load).
std::size_t ends_copied_by_fork() noexcept;

/// The longest a wait may sleep before it lets go of copies owned elsewhere:
/// kReleaseCheck while ends_copied_by_fork(), otherwise no limit (nanoseconds::max()).
std::chrono::nanoseconds release_check_slice() noexcept;

/// The number of live ends in this process (for tests).
std::size_t live_end_count();

/// Calls describe(out) on every live end (introspection), under the list's lock.
void describe_live_ends(Snapshot& out);

/// Calls sample_activity(now) on every live end, under the list's lock (the introspection
/// server's tick, every kActivityTick).
void sample_live_ends_activity(std::int64_t now) noexcept;

/// A new id for an end or listener, unique in this process.
std::uint64_t next_end_id() noexcept;

}  // namespace ferry::detail
