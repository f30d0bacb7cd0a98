#include "ferry/detail/object_pool.hpp"

#include <new>

namespace ferry::detail {

constinit thread_local PoolCaches t_pool_caches{};

namespace {

void release_all(PoolCaches& caches) noexcept {
  for (std::size_t c = 0; c < kPoolClasses; ++c) {
    for (std::uint32_t i = 0; i < caches.count[c]; ++i) ::operator delete(caches.blocks[c][i]);
    caches.count[c] = 0;
    delete[] caches.blocks[c];
    caches.blocks[c] = nullptr;
  }
}

struct Reaper {
  ~Reaper() {
    t_pool_caches.closed = true;  // blocks freed later in this thread's exit go to the heap
    release_all(t_pool_caches);
  }
};
thread_local Reaper t_reaper;

}  // namespace

void* pooled_allocate_slow(std::size_t bytes) {
  if (kPoolBypass || bytes == 0 || bytes > kPooledBytesLimit) return ::operator new(bytes);
  // The class's cache is empty: a new block of the class's full size (any request of the
  // class may reuse it).
  const std::size_t c = (bytes - 1) / kPoolGranule;
  return ::operator new((c + 1) * kPoolGranule);
}

void pooled_free_slow(void* memory, std::size_t bytes) noexcept {
  if (memory == nullptr) return;
  if (kPoolBypass || bytes == 0 || bytes > kPooledBytesLimit) {
    ::operator delete(memory);
    return;
  }
  const std::size_t c = (bytes - 1) / kPoolGranule;
  PoolCaches& caches = t_pool_caches;
  if (caches.closed || caches.count[c] >= kPoolMaxCachedPerClass) {
    ::operator delete(memory);
    return;
  }
  if (caches.blocks[c] == nullptr) {
    if (!caches.reaper_registered) {
      caches.reaper_registered = true;
      [[maybe_unused]] Reaper& reaper = t_reaper;  // first use: its destructor runs at thread exit
    }
    caches.blocks[c] = new (std::nothrow) void*[kPoolMaxCachedPerClass];
    if (caches.blocks[c] == nullptr) {
      ::operator delete(memory);
      return;
    }
  }
  caches.blocks[c][caches.count[c]++] = memory;
}

}  // namespace ferry::detail
