// The process-wide list of channel ends alive in this process. A worker started by fork()
// inherits a copy of every end its parent holds; it must drop the ones it was not given,
// or a peer would never see end-of-stream (nor the parent's death) on them.
#pragma once

#include <span>

namespace ferry::detail {

/// An end of a channel (SenderCore, ReceiverCore) as the list of live ends sees it.
class LiveEnd {
 public:
  /// Drops this process's copy of the end's resources (descriptors, mappings) without any
  /// protocol: no Close frame, no locks taken. Only for a freshly forked child, which has
  /// one thread.
  virtual void abandon_in_child() noexcept = 0;

 protected:
  LiveEnd() = default;
  LiveEnd(const LiveEnd&) = delete;
  LiveEnd& operator=(const LiveEnd&) = delete;
  ~LiveEnd() = default;
  /// Adds this end to the list (call at the end of the derived constructor).
  void track();
  /// Removes this end from the list (call first in the derived destructor).
  void untrack() noexcept;
};

/// In a freshly forked child: abandons every live end except those in `keep`.
void abandon_live_ends_except(std::span<const LiveEnd* const> keep) noexcept;

/// The number of live ends in this process (for tests).
std::size_t live_end_count();

}  // namespace ferry::detail
