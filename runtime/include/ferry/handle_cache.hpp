// The process-wide cache of shared segments, keyed by the identity of their memfd.
#pragma once

#include <cstddef>
#include <memory>
#include <unordered_map>

#include "ferry/detail/shared_memory.hpp"
#include "ferry/detail/thread_annotations.hpp"

namespace ferry::detail {
class SharedSegment;
}  // namespace ferry::detail

namespace ferry {

/// Maps the identity of a shared segment to the SharedSegment that maps it in this
/// process, so that a segment received on several channels (or sent back to the process
/// that created it) is mapped once and all its blocks share memory. Holds weak references:
/// the cache never keeps a segment alive. Dead entries are purged when the entry count
/// passes a limit, which then becomes twice the live count (at least 128), as torch's
/// SharedCache does. Thread-safe.
class HandleCache {
 public:
  /// The cache of this process.
  static HandleCache& global();

  /// The live segment mapped for `identity`, or nullptr.
  std::shared_ptr<detail::SharedSegment> find(const detail::FileIdentity& identity);

  /// Records `segment` for `identity` unless a live segment is already recorded; returns
  /// the segment the cache holds afterwards (the existing one wins, so concurrent
  /// receivers of one segment end up sharing one mapping).
  std::shared_ptr<detail::SharedSegment> insert(const detail::FileIdentity& identity,
                                                const std::shared_ptr<detail::SharedSegment>& segment);

  /// Entries held, live or dead (for tests and statistics).
  std::size_t size() const;
  /// The entry count above which the next insert purges dead entries.
  std::size_t limit() const;
  /// Removes dead entries now.
  void purge();

 private:
  void purge_locked() FERRY_REQUIRES(mutex_);

  mutable detail::Mutex mutex_;
  std::unordered_map<detail::FileIdentity, std::weak_ptr<detail::SharedSegment>, detail::FileIdentityHash> entries_
      FERRY_GUARDED_BY(mutex_);
  std::size_t limit_ FERRY_GUARDED_BY(mutex_) = 128;
};

}  // namespace ferry
