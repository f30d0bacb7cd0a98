// Per-thread caches of small memory blocks for the objects a message creates and destroys
// by the hundred (storages, shared blocks, their shared_ptr control blocks).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry::detail {

/// Largest request served from the caches; larger ones go to operator new.
inline constexpr std::size_t kPooledBytesLimit = 256;

// Sanitizer builds bypass the caches, so that a use after free is still caught.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kPoolBypass = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kPoolBypass = true;
#else
inline constexpr bool kPoolBypass = false;
#endif
#else
inline constexpr bool kPoolBypass = false;
#endif

inline constexpr std::size_t kPoolGranule = 16;
inline constexpr std::size_t kPoolClasses = kPooledBytesLimit / kPoolGranule;
/// Blocks a thread keeps per size class: enough for a few messages of a hundred tensors
/// in flight, at most 1024 * 256 bytes per class.
inline constexpr std::uint32_t kPoolMaxCachedPerClass = 1024;

/// A thread's caches. Trivially destructible, so that it is usable until the thread's very
/// end; object_pool.cpp empties it when the thread exits and marks it closed. A cache is an
/// array of pointers rather than a list threaded through the free blocks: taking a block
/// reads no memory of a block that has gone cold since it was freed.
struct PoolCaches {
  void** blocks[kPoolClasses];  // kPoolMaxCachedPerClass entries each, allocated at the first free
  std::uint32_t count[kPoolClasses];
  bool reaper_registered;
  bool closed;
};
extern constinit thread_local PoolCaches t_pool_caches;

// The slow paths: an empty or missing cache, a full one, a large request, a sanitizer build.
void* pooled_allocate_slow(std::size_t bytes);
void pooled_free_slow(void* memory, std::size_t bytes) noexcept;

/// `bytes` of memory aligned to 16 bytes. Requests up to kPooledBytesLimit come from the
/// calling thread's cache for their 16-byte size class (a pop from a list, which malloc
/// cannot promise for a burst of a hundred allocations of one size), else from operator
/// new. Throws std::bad_alloc. The common case is inline: a request's size is usually a
/// constant, so is its class.
inline void* pooled_allocate(std::size_t bytes) {
  if (!kPoolBypass && bytes != 0 && bytes <= kPooledBytesLimit) {
    const std::size_t c = (bytes - 1) / kPoolGranule;
    PoolCaches& caches = t_pool_caches;
    if (caches.count[c] > 0) return caches.blocks[c][--caches.count[c]];
  }
  return pooled_allocate_slow(bytes);
}

/// Gives back memory from pooled_allocate(bytes), from any thread: it joins that thread's
/// cache, which keeps a bounded number of blocks per size class and frees the rest (and
/// everything when the thread exits).
inline void pooled_free(void* memory, std::size_t bytes) noexcept {
  if (!kPoolBypass && memory != nullptr && bytes != 0 && bytes <= kPooledBytesLimit) {
    const std::size_t c = (bytes - 1) / kPoolGranule;
    PoolCaches& caches = t_pool_caches;
    if (caches.blocks[c] != nullptr && !caches.closed && caches.count[c] < kPoolMaxCachedPerClass) {
      caches.blocks[c][caches.count[c]++] = memory;
      return;
    }
  }
  pooled_free_slow(memory, bytes);
}

/// A standard allocator over pooled_allocate/pooled_free, for std::allocate_shared and
/// shared_ptr control blocks. Stateless: every instance can free what another allocated.
template <class T>
struct PoolAllocator {
  static_assert(alignof(T) <= 16, "PoolAllocator serves memory aligned to 16 bytes");
  using value_type = T;

  PoolAllocator() noexcept = default;
  template <class U>
  PoolAllocator(const PoolAllocator<U>&) noexcept {}  // NOLINT: rebinding, as std::allocator

  T* allocate(std::size_t count) { return static_cast<T*>(pooled_allocate(count * sizeof(T))); }
  void deallocate(T* memory, std::size_t count) noexcept { pooled_free(memory, count * sizeof(T)); }

  template <class U>
  friend bool operator==(const PoolAllocator&, const PoolAllocator<U>&) noexcept {
    return true;
  }
};

}  // namespace ferry::detail
