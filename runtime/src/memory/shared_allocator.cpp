#include "ferry/shared_allocator.hpp"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include <atomic>
#include <cstring>
#include <list>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ferry/detail/object_pool.hpp"
#include "ferry/detail/process_identity.hpp"
#include "ferry/detail/size_classes.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/error.hpp"
#include "ferry/handle_cache.hpp"
#include "memory/prefetch_for_write.hpp"
#include "memory/returned_blocks_hook.hpp"

namespace ferry {
namespace {

constinit std::atomic<ReturnedBlockCollector> g_returned_block_collector{nullptr};

constexpr std::uint32_t kLargeClass = UINT32_MAX;
constexpr std::size_t kMinimumSegmentBytes = std::size_t{64} << 10;
// A segment's block count is 32-bit: 64 GiB of 64-byte blocks is 2^30 of them.
constexpr std::size_t kMaximumSegmentBytes = std::size_t{64} << 30;

void validate(const SharedAllocatorSettings& settings) {
  if (settings.segment_bytes < kMinimumSegmentBytes || settings.segment_bytes > kMaximumSegmentBytes ||
      settings.segment_bytes % 4096 != 0) {
    throw Error("SharedAllocatorSettings::segment_bytes must be a multiple of 4096 between 64 KiB and 64 GiB, not " +
                std::to_string(settings.segment_bytes) +
                " (tensors larger than an eighth of it get segments of their own)");
  }
}

// One segment of a pool: a slab of equal blocks of one small class, or a whole segment
// serving one large block.
struct Segment {
  std::shared_ptr<detail::SharedSegment> memory;
  std::size_t bytes = 0;
  std::size_t block_bytes = 0;
  std::uint32_t class_index = kLargeClass;
  std::uint32_t block_count = 1;
  std::uint32_t used = 0;
  std::uint32_t fresh_next = 0;     // blocks from here on were never handed out (still zero)
  std::vector<std::uint32_t> free;  // handed out before and freed: reused last-in first-out
  std::list<Segment>::iterator self;
  std::list<Segment*>::iterator available_at;  // in the class's list while a block is free
  bool available = false;
  std::list<Segment*>::iterator idle_at;  // in the idle list while no block is in use
  bool idle = false;

  bool has_free_block() const noexcept { return !free.empty() || fresh_next < block_count; }
};

}  // namespace

// Lives while a SharedAllocator handle or a block of it does: handles share it through
// a shared_ptr whose deleter calls handles_gone(), blocks are counted (live_blocks_) under
// the pool's lock, which a block takes anyway, so a block costs no reference counting.
class SharedAllocator::Core {
 public:
  explicit Core(const SharedAllocatorSettings& settings);
  ~Core();
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;
  /// A new pool, owned by the handles that share the returned pointer.
  static std::shared_ptr<Core> create(const SharedAllocatorSettings& settings);

  std::shared_ptr<SharedBlock> allocate(std::size_t nbytes, bool zeroed);
  // May delete the pool: the last block of a pool without handles.
  void release(Segment* segment, std::uint32_t index, std::uint64_t generation) noexcept;
  // Gives back the blocks of `blocks` that belong to this pool, under one lock, and moves
  // the others to the front; returns how many others there are. May delete the pool.
  std::size_t release_many(std::span<ReleaseBatch::Pending> blocks) noexcept;
  void handles_gone() noexcept;
  void release_locked(Segment* segment, std::uint32_t index, std::uint64_t generation,
                      std::vector<std::shared_ptr<detail::SharedSegment>>& released) noexcept FERRY_REQUIRES(mutex);
  // release_locked() once sync_fork_locked() ran under this lock. (This and the other
  // steps of a cached allocation or a release are inlined: a call's saving and restoring
  // of registers costs as much as their work.)
  [[gnu::always_inline]] void release_synced_locked(
      Segment* segment, std::uint32_t index, std::uint64_t generation,
      std::vector<std::shared_ptr<detail::SharedSegment>>& released) noexcept FERRY_REQUIRES(mutex);
  SharedMemoryStats stats();
  SharedAllocatorSettings settings();
  void configure(const SharedAllocatorSettings& settings);
  void trim();

  // Locked around fork() so that the child never inherits a locked pool.
  detail::Mutex mutex;

 private:
  struct Taken {
    Segment* segment = nullptr;
    std::uint32_t index = 0;
    bool fresh = false;
    std::uint64_t generation = 0;  // the pool's fork generation when taken (under the lock)
  };
  [[gnu::always_inline]] Taken take_cached_locked(std::size_t nbytes) FERRY_REQUIRES(mutex);
  [[gnu::always_inline]] Taken carve_locked(Segment& segment) FERRY_REQUIRES(mutex);
  std::shared_ptr<SharedBlock> hand_out(const Taken& taken, std::size_t nbytes, bool zeroed);
  [[gnu::always_inline]] void make_available_locked(Segment& segment) FERRY_REQUIRES(mutex);
  void move_to_front_locked(Segment& segment) FERRY_REQUIRES(mutex);
  void enforce_limit_locked(std::vector<std::shared_ptr<detail::SharedSegment>>& released) FERRY_REQUIRES(mutex);
  void release_idle_locked(std::vector<std::shared_ptr<detail::SharedSegment>>& released) FERRY_REQUIRES(mutex);
  void release_segment_locked(Segment& segment, std::vector<std::shared_ptr<detail::SharedSegment>>& released)
      FERRY_REQUIRES(mutex);
  // Every call under the lock starts with this: a plain comparison, except in a forked
  // child's first call, which forgets the parent's segments.
  void sync_fork_locked() FERRY_REQUIRES(mutex) {
    if (detail::fork_generation() != generation_) [[unlikely]]
      forget_parent_locked();
  }
  void forget_parent_locked() FERRY_REQUIRES(mutex);
  // A small segment's key is its size class, a large one's its size (at least 64 KiB, so
  // never a class index).
  static std::size_t segment_key(const Segment& segment) noexcept {
    return segment.class_index == kLargeClass ? segment.bytes : segment.class_index;
  }
  void count_miss_locked(std::size_t key) FERRY_REQUIRES(mutex) {
    ++misses_;
    const auto it = released_keys_.find(key);
    if (it == released_keys_.end()) return;
    ++misses_after_release_;
    if (--it->second == 0) released_keys_.erase(it);
  }
  static constexpr std::size_t kMaxReleasedKeys = 1024;

  SharedAllocatorSettings settings_ FERRY_GUARDED_BY(mutex);
  std::size_t small_limit_ FERRY_GUARDED_BY(mutex);  // small_block_limit(settings_.segment_bytes)
  std::uint64_t generation_ FERRY_GUARDED_BY(mutex);
  std::list<Segment> segments_ FERRY_GUARDED_BY(mutex);
  std::list<Segment> abandoned_ FERRY_GUARDED_BY(mutex);  // inherited from the parent across fork(): never carved
  std::vector<std::list<Segment*>> available_ FERRY_GUARDED_BY(mutex);  // small class -> slabs with a free block
  std::unordered_map<std::size_t, std::vector<Segment*>> large_free_ FERRY_GUARDED_BY(mutex);  // by segment size
  std::list<Segment*> idle_ FERRY_GUARDED_BY(mutex);  // no block in use; least recently idle first
  std::size_t total_bytes_ FERRY_GUARDED_BY(mutex) = 0;
  std::size_t bytes_in_use_ FERRY_GUARDED_BY(mutex) = 0;
  std::size_t blocks_in_use_ FERRY_GUARDED_BY(mutex) = 0;
  std::uint64_t hits_ FERRY_GUARDED_BY(mutex) = 0;
  std::uint64_t misses_ FERRY_GUARDED_BY(mutex) = 0;
  std::uint64_t misses_after_release_ FERRY_GUARDED_BY(mutex) = 0;
  std::uint64_t segments_released_ FERRY_GUARDED_BY(mutex) = 0;
  // Segments given back to the kernel, by size key (segment_key()), not yet missed again:
  // a miss of such a key counts as misses_after_release_.
  std::unordered_map<std::size_t, std::uint64_t> released_keys_ FERRY_GUARDED_BY(mutex);
  std::size_t live_blocks_ FERRY_GUARDED_BY(mutex) = 0;  // OwnedBlocks alive, of every fork generation
  bool handles_gone_ FERRY_GUARDED_BY(mutex) = false;
};

namespace {

// Every pool of the process, so that fork() can lock them all.
struct Pools {
  detail::Mutex mutex;
  std::unordered_set<SharedAllocator::Core*> cores;
};

Pools& pools() {
  static auto* instance = new Pools();  // leaked: pools may die during static destruction
  return *instance;
}

void lock_pools_for_fork() FERRY_NO_THREAD_SAFETY_ANALYSIS {  // held across fork()
  pools().mutex.lock();
  for (auto* core : pools().cores) core->mutex.lock();
}

void unlock_pools_after_fork() FERRY_NO_THREAD_SAFETY_ANALYSIS {
  for (auto* core : pools().cores) core->mutex.unlock();
  pools().mutex.unlock();
}

void register_fork_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (const int rc = ::pthread_atfork(&lock_pools_for_fork, &unlock_pools_after_fork, &unlock_pools_after_fork);
        rc != 0) {
      throw_system_error("pthread_atfork", rc);
    }
  });
}

// Made before main(): a fork() while another thread is still making it would leave the child
// waiting for ever on the static's initialization guard.
[[maybe_unused]] const bool g_fork_handlers_made_at_start = (pools(), register_fork_handlers(), true);

// A block handed out by a pool; goes back to the pool's free list when it dies.
class OwnedBlock final : public SharedBlock {
 public:
  OwnedBlock(SharedAllocator::Core* core, Segment* segment, std::uint32_t index, std::uint64_t generation,
             std::size_t nbytes)
      : SharedBlock(segment->memory, std::size_t{index} * segment->block_bytes, nbytes),
        core_(core),
        segment_(segment),
        index_(index),
        generation_(generation) {}
  ~OwnedBlock() override {
    if (!SharedAllocator::ReleaseBatch::gather({core_, segment_, generation_, index_})) {
      core_->release(segment_, index_, generation_);
    }
  }
  OwnedBlock(const OwnedBlock&) = delete;
  OwnedBlock& operator=(const OwnedBlock&) = delete;

 private:
  SharedAllocator::Core* core_;  // alive while this block is (see Core)
  Segment* segment_;
  std::uint32_t index_;
  std::uint64_t generation_;
};

}  // namespace

SharedAllocator::Core::Core(const SharedAllocatorSettings& settings)
    : settings_(settings),
      small_limit_(detail::small_block_limit(settings.segment_bytes)),
      generation_(detail::fork_generation()) {
  validate(settings);
  register_fork_handlers();
  const detail::MutexLock lock(pools().mutex);
  pools().cores.insert(this);
}

SharedAllocator::Core::~Core() {
  const detail::MutexLock lock(pools().mutex);
  pools().cores.erase(this);
}

std::shared_ptr<SharedAllocator::Core> SharedAllocator::Core::create(const SharedAllocatorSettings& settings) {
  return std::shared_ptr<Core>(new Core(settings), [](Core* core) { core->handles_gone(); });
}

void SharedAllocator::Core::handles_gone() noexcept {
  bool unused = false;
  {
    const detail::MutexLock lock(mutex);
    handles_gone_ = true;
    unused = live_blocks_ == 0;
  }
  if (unused) delete this;  // otherwise the last block deletes it
}

void SharedAllocator::Core::forget_parent_locked() {
  const std::uint64_t generation = detail::fork_generation();
  // A forked child: the segments are shared with the parent, which keeps carving them.
  // Forget them (blocks inherited from the parent still map them until they die).
  for (Segment& segment : segments_) segment.memory.reset();
  abandoned_.splice(abandoned_.end(), segments_);
  available_.clear();
  large_free_.clear();
  idle_.clear();
  total_bytes_ = bytes_in_use_ = blocks_in_use_ = 0;
  hits_ = misses_ = misses_after_release_ = segments_released_ = 0;
  released_keys_.clear();
  generation_ = generation;
}

namespace {

// How many allocations of a segment ahead a recycled block's first line is asked for.
constexpr std::size_t kPrefetchAhead = 2;

void prefetch_first_line(const Segment& segment, std::uint32_t index) noexcept {
  detail::prefetch_for_write(segment.memory->data() + std::size_t{index} * segment.block_bytes);
}

}  // namespace

inline SharedAllocator::Core::Taken SharedAllocator::Core::carve_locked(Segment& segment) {
  Taken taken{&segment, 0, false, generation_};
  if (!segment.free.empty()) {
    taken.index = segment.free.back();
    segment.free.pop_back();
    // A recycled block's lines were last read by a receiver, so they sit in its CPU's cache
    // and the writer's first store must take one back: asked for now (this block's, and
    // the one handed out kPrefetchAhead allocations later), the line arrives while the
    // caller builds its storage and tensor, instead of holding up its store and the stores
    // queued behind it.
    prefetch_first_line(segment, taken.index);
    if (const std::size_t left = segment.free.size(); left >= kPrefetchAhead) {
      prefetch_first_line(segment, segment.free[left - kPrefetchAhead]);
    }
  } else {
    taken.index = segment.fresh_next++;
    taken.fresh = true;
  }
  if (segment.used++ == 0 && segment.idle) {
    idle_.erase(segment.idle_at);
    segment.idle = false;
  }
  if (segment.available && !segment.has_free_block()) {
    available_[segment.class_index].erase(segment.available_at);
    segment.available = false;
  }
  bytes_in_use_ += segment.block_bytes;
  ++blocks_in_use_;
  ++live_blocks_;  // the block hand_out() makes from this
  return taken;
}

inline SharedAllocator::Core::Taken SharedAllocator::Core::take_cached_locked(std::size_t nbytes) {
  sync_fork_locked();
  if (nbytes <= small_limit_) [[likely]] {
    const std::uint32_t index = detail::small_size_class(nbytes).index;
    if (index >= available_.size() || available_[index].empty()) return {};
    return carve_locked(*available_[index].front());
  }
  const auto it = large_free_.find(detail::large_segment_bytes(nbytes));
  if (it == large_free_.end() || it->second.empty()) return {};
  Segment* segment = it->second.back();
  it->second.pop_back();
  return carve_locked(*segment);
}

std::shared_ptr<SharedBlock> SharedAllocator::Core::hand_out(const Taken& taken, std::size_t nbytes, bool zeroed) {
  std::shared_ptr<OwnedBlock> block;
  try {
    block = std::allocate_shared<OwnedBlock>(detail::PoolAllocator<OwnedBlock>(), this, taken.segment, taken.index,
                                             taken.generation, nbytes);
  } catch (...) {
    release(taken.segment, taken.index, taken.generation);  // no block: the carved one goes back
    throw;
  }
  if (zeroed && !taken.fresh) std::memset(block->data(), 0, nbytes);
  return block;
}

std::shared_ptr<SharedBlock> SharedAllocator::Core::allocate(std::size_t nbytes, bool zeroed) {
  if (nbytes == 0) throw Error("SharedAllocator::allocate: a block needs at least one byte");
  {
    detail::MutexLock lock(mutex);
    if (const Taken taken = take_cached_locked(nbytes); taken.segment != nullptr) {
      ++hits_;
      lock.unlock();
      return hand_out(taken, nbytes, zeroed);
    }
  }
  // Nothing cached: first take back what receivers returned (cheap: no system call), then
  // what receivers that died still held; only then create a segment.
  for (const bool check_receivers : {false, true}) {
    collect_returned_blocks_through_hook(check_receivers);
    detail::MutexLock lock(mutex);
    if (const Taken taken = take_cached_locked(nbytes); taken.segment != nullptr) {
      ++hits_;
      lock.unlock();
      return hand_out(taken, nbytes, zeroed);
    }
  }

  std::size_t segment_bytes = 0;
  detail::SizeClass size_class{};
  bool small = false;
  {
    const detail::MutexLock lock(mutex);
    small = nbytes <= small_limit_;
    if (small) {
      size_class = detail::small_size_class(nbytes);
      segment_bytes = settings_.segment_bytes;
    } else {
      segment_bytes = detail::large_segment_bytes(nbytes);
    }
  }
  // Creating the segment (memfd, reserving its pages, mmap) is the slow part: unlocked.
  std::shared_ptr<detail::SharedSegment> memory = detail::SharedSegment::create(segment_bytes, this);
  HandleCache::global().insert(memory->identity(), memory);

  detail::MutexLock lock(mutex);
  sync_fork_locked();
  Segment& segment = segments_.emplace_back();
  segment.self = std::prev(segments_.end());
  segment.memory = std::move(memory);
  segment.bytes = segment_bytes;
  if (small) {
    segment.class_index = size_class.index;
    segment.block_bytes = size_class.bytes;
    segment.block_count = static_cast<std::uint32_t>(segment_bytes / size_class.bytes);
  } else {
    segment.block_bytes = segment_bytes;
  }
  total_bytes_ += segment_bytes;
  count_miss_locked(small ? size_class.index : segment_bytes);
  const Taken taken = carve_locked(segment);
  if (segment.has_free_block()) make_available_locked(segment);
  lock.unlock();
  return hand_out(taken, nbytes, zeroed);
}

inline void SharedAllocator::Core::make_available_locked(Segment& segment) {
  if (segment.class_index == kLargeClass) return;
  // Most recently freed first, so that a block freed and allocated again comes back. The
  // common case, a block of the segment that is at the front already, changes nothing.
  if (segment.available && segment.available_at == available_[segment.class_index].begin()) [[likely]]
    return;
  move_to_front_locked(segment);
}

void SharedAllocator::Core::move_to_front_locked(Segment& segment) {
  if (segment.class_index >= available_.size()) available_.resize(std::size_t{segment.class_index} + 1);
  auto& list = available_[segment.class_index];
  if (segment.available) {
    list.splice(list.begin(), list, segment.available_at);
  } else {
    segment.available_at = list.insert(list.begin(), &segment);
    segment.available = true;
  }
}

void SharedAllocator::Core::release(Segment* segment, std::uint32_t index, std::uint64_t generation) noexcept {
  std::vector<std::shared_ptr<detail::SharedSegment>> released;
  bool unused = false;
  {
    const detail::MutexLock lock(mutex);
    unused = --live_blocks_ == 0 && handles_gone_;
    release_locked(segment, index, generation, released);
  }
  // `released` unmaps before the pool goes, outside the lock.
  released.clear();
  if (unused) delete this;
}

std::size_t SharedAllocator::Core::release_many(std::span<ReleaseBatch::Pending> blocks) noexcept {
  std::vector<std::shared_ptr<detail::SharedSegment>> released;
  std::size_t others = 0;
  bool unused = false;
  {
    const detail::MutexLock lock(mutex);
    sync_fork_locked();
    for (const ReleaseBatch::Pending& block : blocks) {
      if (block.core != this) {
        blocks[others++] = block;
        continue;
      }
      --live_blocks_;
      release_synced_locked(static_cast<Segment*>(block.segment), block.index, block.generation, released);
    }
    unused = live_blocks_ == 0 && handles_gone_;
  }
  released.clear();
  if (unused) delete this;
  return others;
}

void SharedAllocator::Core::release_locked(Segment* segment, std::uint32_t index, std::uint64_t generation,
                                           std::vector<std::shared_ptr<detail::SharedSegment>>& released) noexcept {
  sync_fork_locked();
  release_synced_locked(segment, index, generation, released);
}

inline void SharedAllocator::Core::release_synced_locked(
    Segment* segment, std::uint32_t index, std::uint64_t generation,
    std::vector<std::shared_ptr<detail::SharedSegment>>& released) noexcept {
  if (generation != generation_) return;  // a block of the parent's pool, in a forked child
  --segment->used;
  bytes_in_use_ -= segment->block_bytes;
  --blocks_in_use_;
  segment->free.push_back(index);
  if (segment->class_index == kLargeClass) {
    large_free_[segment->bytes].push_back(segment);
  } else {
    make_available_locked(*segment);
  }
  if (segment->used == 0) {
    segment->idle_at = idle_.insert(idle_.end(), segment);
    segment->idle = true;
  }
  enforce_limit_locked(released);
}

inline void SharedAllocator::Core::enforce_limit_locked(std::vector<std::shared_ptr<detail::SharedSegment>>& released) {
  if (total_bytes_ - bytes_in_use_ > settings_.max_cached_bytes && !idle_.empty()) [[unlikely]] {
    release_idle_locked(released);
  }
}

void SharedAllocator::Core::release_idle_locked(std::vector<std::shared_ptr<detail::SharedSegment>>& released) {
  while (total_bytes_ - bytes_in_use_ > settings_.max_cached_bytes && !idle_.empty()) {
    release_segment_locked(*idle_.front(), released);
  }
}

void SharedAllocator::Core::release_segment_locked(Segment& segment,
                                                   std::vector<std::shared_ptr<detail::SharedSegment>>& released) {
  if (segment.idle) idle_.erase(segment.idle_at);
  if (segment.available) available_[segment.class_index].erase(segment.available_at);
  if (segment.class_index == kLargeClass) {
    auto& list = large_free_[segment.bytes];
    std::erase(list, &segment);
  }
  released.push_back(std::move(segment.memory));
  total_bytes_ -= segment.bytes;
  ++segments_released_;
  if (released_keys_.size() >= kMaxReleasedKeys) released_keys_.clear();  // many sizes: forget, stay bounded
  ++released_keys_[segment_key(segment)];
  segments_.erase(segment.self);
}

SharedMemoryStats SharedAllocator::Core::stats() {
  const detail::MutexLock lock(mutex);
  sync_fork_locked();
  SharedMemoryStats stats;
  stats.segments = segments_.size();
  stats.segment_bytes = total_bytes_;
  stats.bytes_in_use = bytes_in_use_;
  stats.bytes_cached = total_bytes_ - bytes_in_use_;
  stats.blocks_in_use = blocks_in_use_;
  stats.hits = hits_;
  stats.misses = misses_;
  stats.misses_after_release = misses_after_release_;
  stats.misses_cold = misses_ - misses_after_release_;
  stats.segments_released = segments_released_;
  return stats;
}

SharedAllocatorSettings SharedAllocator::Core::settings() {
  const detail::MutexLock lock(mutex);
  return settings_;
}

void SharedAllocator::Core::configure(const SharedAllocatorSettings& settings) {
  validate(settings);
  std::vector<std::shared_ptr<detail::SharedSegment>> released;
  const detail::MutexLock lock(mutex);
  sync_fork_locked();
  settings_ = settings;
  small_limit_ = detail::small_block_limit(settings.segment_bytes);
  enforce_limit_locked(released);
}

void SharedAllocator::Core::trim() {
  collect_returned_blocks_through_hook(true);
  std::vector<std::shared_ptr<detail::SharedSegment>> released;
  const detail::MutexLock lock(mutex);
  sync_fork_locked();
  while (!idle_.empty()) release_segment_locked(*idle_.front(), released);
}

// ---- release batches -------------------------------------------------------------

SharedAllocator::ReleaseBatch::ReleaseBatch() noexcept : outermost_(current_ == nullptr) {
  if (outermost_) current_ = this;
}

SharedAllocator::ReleaseBatch::~ReleaseBatch() {
  if (!outermost_) return;
  current_ = nullptr;
  flush();
}

void SharedAllocator::ReleaseBatch::flush() noexcept {
  // One pass per pool (usually one): each gives back its own blocks and keeps the others.
  while (count_ > 0) {
    Core* core = pending_[0].core;
    count_ = core->release_many(std::span<Pending>(pending_.data(), count_));
  }
}

// ---- the handle ------------------------------------------------------------------

SharedAllocator::SharedAllocator(const SharedAllocatorSettings& settings) : core_(Core::create(settings)) {}

const SharedAllocator& SharedAllocator::global() {
  // Leaked on purpose: blocks may die during static destruction and must find their pool.
  static const auto* pool = new SharedAllocator(Core::create(SharedAllocatorSettings{}));
  return *pool;
}

std::shared_ptr<SharedBlock> SharedAllocator::allocate(std::size_t nbytes, bool zeroed) const {
  return core_->allocate(nbytes, zeroed);
}

SharedMemoryStats SharedAllocator::stats() const { return core_->stats(); }
SharedAllocatorSettings SharedAllocator::settings() const { return core_->settings(); }
void SharedAllocator::configure(const SharedAllocatorSettings& settings) const { core_->configure(settings); }
void SharedAllocator::trim() const { core_->trim(); }

bool SharedAllocator::owns(const SharedBlock& block) const noexcept {
  return block.segment() && block.segment()->owner() == core_.get();
}

SharedMemoryStats shared_memory_stats() { return SharedAllocator::global().stats(); }
void configure_shared_memory(const SharedAllocatorSettings& settings) { SharedAllocator::global().configure(settings); }
void release_cached_shared_memory() { SharedAllocator::global().trim(); }

void install_returned_block_collector(ReturnedBlockCollector collector) noexcept {
  g_returned_block_collector.store(collector, std::memory_order_release);
}

void collect_returned_blocks_through_hook(bool check_receivers) {
  if (const ReturnedBlockCollector collector = g_returned_block_collector.load(std::memory_order_acquire)) {
    collector(check_receivers);
  }
}

namespace {

// The bytes this process may use: physical memory, or the cgroup (v2) limit when lower.
std::size_t usable_memory_bytes() noexcept {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_bytes = ::sysconf(_SC_PAGESIZE);
  std::size_t bytes =
      pages > 0 && page_bytes > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_bytes) : 0;
  std::ifstream cgroup_limit("/sys/fs/cgroup/memory.max");
  unsigned long long limit = 0;
  if (cgroup_limit >> limit && limit > 0)
    bytes = bytes == 0 ? limit : std::min<std::size_t>(bytes, limit);  // "max" reads as no number
  return bytes;
}

}  // namespace

std::size_t default_max_cached_bytes() noexcept {
  static const std::size_t bytes = std::max(std::size_t{256} << 20, usable_memory_bytes() / 4);
  return bytes;
}

}  // namespace ferry
