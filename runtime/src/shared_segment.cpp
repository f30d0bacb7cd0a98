#include "ferry/shared_segment.hpp"

#include "ferry/storage.hpp"

namespace ferry {
namespace {

std::atomic<std::uint64_t> g_next_segment_id{1};
std::atomic<std::uint64_t> g_sent_segment_deaths{0};

}  // namespace

SharedSegment::SharedSegment(SharedMemory memory, const void* owner)
    : memory_(std::move(memory)), owner_(owner), id_(g_next_segment_id.fetch_add(1, std::memory_order_relaxed)) {}

std::shared_ptr<SharedSegment> SharedSegment::create(std::size_t size, const void* owner) {
  return std::shared_ptr<SharedSegment>(new SharedSegment(SharedMemory::create(size), owner));
}

std::shared_ptr<SharedSegment> SharedSegment::adopt(SharedMemory memory) {
  return std::shared_ptr<SharedSegment>(new SharedSegment(std::move(memory), nullptr));
}

SharedSegment::~SharedSegment() {
  if (sent_.load(std::memory_order_relaxed)) g_sent_segment_deaths.fetch_add(1, std::memory_order_release);
}

void SharedSegment::remember_storages(std::span<const std::shared_ptr<Storage>* const> storages) {
  std::lock_guard lock(mutex_);
  for (const std::shared_ptr<Storage>* sent : storages) {
    const std::shared_ptr<Storage>& storage = *sent;
    Remembered& entry = remembered_[storage->shared_block()->offset()];
    entry.nbytes = storage->nbytes();
    entry.storage = storage;
  }
  any_remembered_.store(true, std::memory_order_release);
}

std::shared_ptr<Storage> SharedSegment::find_storage(std::uint64_t offset, std::uint64_t nbytes) {
  // A process that never sent a block of this segment has nothing to find: skip the lock.
  if (!any_remembered_.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard lock(mutex_);
  const auto it = remembered_.find(offset);
  if (it == remembered_.end() || it->second.nbytes != nbytes) return nullptr;
  return it->second.storage.lock();
}

std::uint64_t sent_segment_deaths() noexcept { return g_sent_segment_deaths.load(std::memory_order_acquire); }

}  // namespace ferry
