#include "export_registry.hpp"

#include <iterator>

namespace ferry::python {

ExportRegistry& ExportRegistry::instance() {
  static ExportRegistry* registry = new ExportRegistry;  // never destroyed: deleters may run at exit
  return *registry;
}

void ExportRegistry::add(const std::shared_ptr<Storage>& storage) {
  if (!storage || storage->nbytes() == 0 || storage->data() == nullptr) return;
  const auto begin = reinterpret_cast<std::uintptr_t>(storage->data());
  const detail::MutexLock lock(mutex_);
  Entry& entry = entries_[begin];
  if (entry.storage.lock() != storage) entry = Entry{begin + storage->nbytes(), storage};
  if (entries_.size() >= prune_at_) prune_expired();
}

std::shared_ptr<Storage> ExportRegistry::find(const std::byte* begin, std::size_t bytes) {
  const auto first = reinterpret_cast<std::uintptr_t>(begin);
  const detail::MutexLock lock(mutex_);
  auto it = entries_.upper_bound(first);
  if (it == entries_.begin()) return nullptr;
  it = std::prev(it);
  if (first + bytes > it->second.end) return nullptr;
  std::shared_ptr<Storage> storage = it->second.storage.lock();
  if (!storage) {
    entries_.erase(it);
    return nullptr;
  }
  // A heap storage moved into shared memory (share_memory()) no longer lies there.
  if (reinterpret_cast<std::uintptr_t>(storage->data()) != it->first) return nullptr;
  return storage;
}

void ExportRegistry::prune_expired() {
  for (auto it = entries_.begin(); it != entries_.end();) {
    it = it->second.storage.expired() ? entries_.erase(it) : std::next(it);
  }
  prune_at_ = 2 * entries_.size() + 64;  // amortised: a sweep per doubling
}

}  // namespace ferry::python
