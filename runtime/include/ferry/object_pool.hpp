// Per-thread caches of small memory blocks for the objects a message creates and destroys
// by the hundred (storages, shared blocks, their shared_ptr control blocks).
#pragma once

#include <cstddef>

namespace ferry::detail {

/// Largest request served from the caches; larger ones go to operator new.
inline constexpr std::size_t kPooledBytesLimit = 256;

/// `bytes` of memory aligned to 16 bytes. Requests up to kPooledBytesLimit come from the
/// calling thread's cache for their 16-byte size class (a pop from a list, which malloc
/// cannot promise for a burst of a hundred allocations of one size), else from operator
/// new. Throws std::bad_alloc.
void* pooled_allocate(std::size_t bytes);
/// Gives back memory from pooled_allocate(bytes), from any thread: it joins that thread's
/// cache, which keeps a bounded number of blocks per size class and frees the rest (and
/// everything when the thread exits). Sanitizer builds bypass the caches, so that a use
/// after free is still caught.
void pooled_free(void* memory, std::size_t bytes) noexcept;

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
