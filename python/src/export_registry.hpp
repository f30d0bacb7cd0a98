// The storages whose memory this process handed to Python consumers (torch.from_dlpack,
// NumPy's __array_interface__): a torch or NumPy tensor whose elements lie inside one of
// them views ferry memory, and is sent as a view of that storage, with no copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include "ferry/detail/thread_annotations.hpp"
#include "ferry/storage.hpp"

namespace ferry::python {

/// Thread-safe; holds weak references, so a storage dies when its last view does.
class ExportRegistry {
 public:
  /// The registry of this process.
  static ExportRegistry& instance();

  /// Records that `storage`'s bytes were handed out (no-op for a storage without bytes).
  void add(const std::shared_ptr<Storage>& storage);
  /// The living storage whose bytes contain [begin, begin + bytes), or nullptr.
  std::shared_ptr<Storage> find(const std::byte* begin, std::size_t bytes);

 private:
  struct Entry {
    std::uintptr_t end = 0;
    std::weak_ptr<Storage> storage;
  };
  void prune_expired() FERRY_REQUIRES(mutex_);

  detail::Mutex mutex_;
  std::map<std::uintptr_t, Entry> entries_ FERRY_GUARDED_BY(mutex_);  // by first byte
  std::size_t prune_at_ FERRY_GUARDED_BY(mutex_) = 64;
};

}  // namespace ferry::python
