#include "ferry/allocation.hpp"
#include "ferry/detail/thread_annotations.hpp"

#include <algorithm>
#include <bit>
#include <utility>

#include "ferry/detail/process_identity.hpp"
#include "ferry/storage.hpp"

namespace ferry {
namespace {

std::atomic<std::uint64_t> g_next_segment_id{1};
std::atomic<std::uint64_t> g_sent_segment_deaths{0};

}  // namespace

detail::SharedSegment::SharedSegment(detail::SharedMemory memory, const void* owner)
    : memory_(std::move(memory)),
      owner_(owner),
      generation_(detail::fork_generation()),
      id_(g_next_segment_id.fetch_add(1, std::memory_order_relaxed)) {}

bool detail::SharedSegment::created_in_this_process() const noexcept {
  return owner_ != nullptr && generation_ == detail::fork_generation();
}

std::shared_ptr<detail::SharedSegment> detail::SharedSegment::create(std::size_t size, const void* owner) {
  return std::shared_ptr<detail::SharedSegment>(new detail::SharedSegment(detail::SharedMemory::create(size), owner));
}

std::shared_ptr<detail::SharedSegment> detail::SharedSegment::adopt(detail::SharedMemory memory) {
  return std::shared_ptr<detail::SharedSegment>(new detail::SharedSegment(std::move(memory), nullptr));
}

detail::SharedSegment::~SharedSegment() {
  if (sent_.load(std::memory_order_relaxed)) g_sent_segment_deaths.fetch_add(1, std::memory_order_release);
}

inline detail::SharedSegment::Remembered& detail::SharedSegment::remembered_at(std::uint64_t offset) noexcept {
  const std::size_t mask = remembered_.size() - 1;
  // Offsets are multiples of the block alignment (64): hash what varies.
  for (std::size_t at = static_cast<std::size_t>((offset >> 6) * 0x9e3779b97f4a7c15ull >> 32) & mask;;
       at = (at + 1) & mask) {
    Remembered& entry = remembered_[at];
    if (entry.offset == offset || entry.offset == kNoOffset) return entry;
  }
}

void detail::SharedSegment::remember_storages(std::span<const std::shared_ptr<Storage>* const> storages) {
  const detail::MutexLock lock(mutex_);
  if (2 * (remembered_count_ + storages.size()) > remembered_.size()) {
    // Grow to a load of at most one half, for every storage of this call being new.
    std::vector<Remembered> old = std::exchange(
        remembered_,
        std::vector<Remembered>(std::bit_ceil(std::max<std::size_t>(4, 4 * (remembered_count_ + storages.size())))));
    for (Remembered& entry : old) {
      if (entry.offset != kNoOffset) remembered_at(entry.offset) = std::move(entry);
    }
  }
  for (const std::shared_ptr<Storage>* sent : storages) {
    const std::shared_ptr<Storage>& storage = *sent;
    const std::uint64_t offset = storage->shared_block()->offset();
    Remembered& entry = remembered_at(offset);
    if (entry.offset == kNoOffset) {
      entry.offset = offset;
      ++remembered_count_;
    }
    entry.nbytes = storage->nbytes();
    entry.storage = storage;
  }
  any_remembered_.store(true, std::memory_order_release);
}

std::shared_ptr<Storage> detail::SharedSegment::find_storage(std::uint64_t offset, std::uint64_t nbytes) {
  // A process that never sent a block of this segment has nothing to find: skip the lock.
  if (!any_remembered_.load(std::memory_order_acquire)) return nullptr;
  const detail::MutexLock lock(mutex_);
  if (remembered_.empty()) return nullptr;
  const Remembered& entry = remembered_at(offset);
  if (entry.offset != offset || entry.nbytes != nbytes) return nullptr;
  return entry.storage.lock();
}

std::uint64_t detail::sent_segment_deaths() noexcept { return g_sent_segment_deaths.load(std::memory_order_acquire); }

}  // namespace ferry
