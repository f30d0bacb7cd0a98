// The process-wide cache of shared storages, keyed by the identity of their memfd.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "ferry/shared_memory.hpp"

namespace ferry {

class Storage;

/// Maps the identity of a shared segment to the Storage that maps it in this process, so
/// that a segment received many times (or sent back to its creator) is mapped once and all
/// its views share memory. Holds weak references: the cache never keeps a storage alive.
/// Dead entries are purged when the entry count passes a limit, which then becomes twice
/// the live count (at least 128), as torch's SharedCache does. Thread-safe.
class HandleCache {
 public:
  /// The cache of this process.
  static HandleCache& global();

  /// The live storage mapped for `identity`, or nullptr.
  std::shared_ptr<Storage> find(const FileIdentity& identity);

  /// Records `storage` for `identity` unless a live storage is already recorded; returns
  /// the storage the cache holds afterwards (the existing one wins, so concurrent
  /// receivers of one segment end up sharing one storage).
  std::shared_ptr<Storage> insert(const FileIdentity& identity, const std::shared_ptr<Storage>& storage);

  /// Entries held, live or dead (for tests and statistics).
  std::size_t size() const;
  /// The entry count above which the next insert purges dead entries.
  std::size_t limit() const;
  /// Removes dead entries now.
  void purge();

 private:
  void purge_locked();

  mutable std::mutex mutex_;
  std::unordered_map<FileIdentity, std::weak_ptr<Storage>, FileIdentityHash> entries_;
  std::size_t limit_ = 128;
};

}  // namespace ferry
