#include "ferry/handle_cache.hpp"

#include <algorithm>

#include "ferry/shared_segment.hpp"

namespace ferry {
namespace {
constexpr std::size_t kMinimumLimit = 128;
}  // namespace

HandleCache& HandleCache::global() {
  // Leaked on purpose: storages may die during static destruction and must still find it.
  static auto* cache = new HandleCache();
  return *cache;
}

std::shared_ptr<SharedSegment> HandleCache::find(const FileIdentity& identity) {
  std::lock_guard lock(mutex_);
  const auto it = entries_.find(identity);
  return it == entries_.end() ? nullptr : it->second.lock();
}

std::shared_ptr<SharedSegment> HandleCache::insert(const FileIdentity& identity,
                                                   const std::shared_ptr<SharedSegment>& segment) {
  std::lock_guard lock(mutex_);
  auto [it, inserted] = entries_.try_emplace(identity, segment);
  if (!inserted) {
    if (auto existing = it->second.lock()) return existing;
    it->second = segment;
  }
  if (entries_.size() > limit_) purge_locked();
  return segment;
}

std::size_t HandleCache::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

std::size_t HandleCache::limit() const {
  std::lock_guard lock(mutex_);
  return limit_;
}

void HandleCache::purge() {
  std::lock_guard lock(mutex_);
  purge_locked();
}

void HandleCache::purge_locked() {
  std::erase_if(entries_, [](const auto& entry) { return entry.second.expired(); });
  limit_ = std::max(kMinimumLimit, entries_.size() * 2);
}

}  // namespace ferry
