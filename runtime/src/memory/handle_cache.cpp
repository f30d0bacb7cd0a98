#include "ferry/handle_cache.hpp"

#include <pthread.h>

#include <algorithm>

#include "ferry/allocation.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/error.hpp"

namespace ferry {
namespace {
constexpr std::size_t kMinimumLimit = 128;
}  // namespace

HandleCache& HandleCache::global() {
  // Leaked on purpose: storages may die during static destruction and must still find it.
  static auto* cache = [] {
    auto* created = new HandleCache();
    // A fork while another thread holds the lock would leave it locked in the child, whose
    // first new or received segment would then wait for ever.
    if (const int rc = ::pthread_atfork([]() FERRY_NO_THREAD_SAFETY_ANALYSIS { global().mutex_.lock(); },
                                        []() FERRY_NO_THREAD_SAFETY_ANALYSIS { global().mutex_.unlock(); },
                                        []() FERRY_NO_THREAD_SAFETY_ANALYSIS { global().mutex_.unlock(); });
        rc != 0) {
      throw_system_error("pthread_atfork", rc);
    }
    return created;
  }();
  return *cache;
}

namespace {
// Made before main(): a fork() while another thread is still making it would leave the child
// waiting for ever on the static's initialization guard.
[[maybe_unused]] const HandleCache& g_cache_made_at_start = HandleCache::global();
}  // namespace

std::shared_ptr<detail::SharedSegment> HandleCache::find(const detail::FileIdentity& identity) {
  const detail::MutexLock lock(mutex_);
  const auto it = entries_.find(identity);
  return it == entries_.end() ? nullptr : it->second.lock();
}

std::shared_ptr<detail::SharedSegment> HandleCache::insert(const detail::FileIdentity& identity,
                                                           const std::shared_ptr<detail::SharedSegment>& segment) {
  const detail::MutexLock lock(mutex_);
  auto [it, inserted] = entries_.try_emplace(identity, segment);
  if (!inserted) {
    if (auto existing = it->second.lock()) return existing;
    it->second = segment;
  }
  if (entries_.size() > limit_) purge_locked();
  return segment;
}

std::size_t HandleCache::size() const {
  const detail::MutexLock lock(mutex_);
  return entries_.size();
}

std::size_t HandleCache::limit() const {
  const detail::MutexLock lock(mutex_);
  return limit_;
}

void HandleCache::purge() {
  const detail::MutexLock lock(mutex_);
  purge_locked();
}

void HandleCache::purge_locked() {
  std::erase_if(entries_, [](const auto& entry) { return entry.second.expired(); });
  limit_ = std::max(kMinimumLimit, entries_.size() * 2);
}

}  // namespace ferry
