#include "ferry/object_pool.hpp"

#include <cstdint>
#include <new>

namespace ferry::detail {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kBypass = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kBypass = true;
#else
constexpr bool kBypass = false;
#endif
#else
constexpr bool kBypass = false;
#endif

constexpr std::size_t kGranule = 16;
constexpr std::size_t kClasses = kPooledBytesLimit / kGranule;
// Blocks a thread keeps per size class: enough for a few messages of a hundred tensors in
// flight, at most 1024 * 256 bytes per class.
constexpr std::uint32_t kMaxCachedPerClass = 1024;

// Trivially destructible, so that it is usable until the thread's very end; `Reaper`
// empties it when the thread exits and marks it closed. A cache is an array of pointers
// rather than a list threaded through the free blocks: taking a block reads no memory of
// a block that has gone cold since it was freed.
struct Caches {
  void** blocks[kClasses];  // kMaxCachedPerClass entries each, allocated at the first free
  std::uint32_t count[kClasses];
  bool reaper_registered;
  bool closed;
};
constinit thread_local Caches t_caches{};

void release_all(Caches& caches) noexcept {
  for (std::size_t c = 0; c < kClasses; ++c) {
    for (std::uint32_t i = 0; i < caches.count[c]; ++i) ::operator delete(caches.blocks[c][i]);
    caches.count[c] = 0;
    delete[] caches.blocks[c];
    caches.blocks[c] = nullptr;
  }
}

struct Reaper {
  ~Reaper() {
    t_caches.closed = true;  // blocks freed later in this thread's exit go to the heap
    release_all(t_caches);
  }
};
thread_local Reaper t_reaper;

std::size_t class_of(std::size_t bytes) noexcept { return (bytes + kGranule - 1) / kGranule - 1; }

}  // namespace

void* pooled_allocate(std::size_t bytes) {
  if (kBypass || bytes == 0 || bytes > kPooledBytesLimit) return ::operator new(bytes);
  const std::size_t c = class_of(bytes);
  Caches& caches = t_caches;
  if (caches.count[c] > 0) return caches.blocks[c][--caches.count[c]];
  return ::operator new((c + 1) * kGranule);
}

void pooled_free(void* memory, std::size_t bytes) noexcept {
  if (memory == nullptr) return;
  if (kBypass || bytes == 0 || bytes > kPooledBytesLimit) {
    ::operator delete(memory);
    return;
  }
  const std::size_t c = class_of(bytes);
  Caches& caches = t_caches;
  if (caches.closed || caches.count[c] >= kMaxCachedPerClass) {
    ::operator delete(memory);
    return;
  }
  if (caches.blocks[c] == nullptr) [[unlikely]] {
    if (!caches.reaper_registered) {
      caches.reaper_registered = true;
      [[maybe_unused]] Reaper& reaper = t_reaper;  // first use: its destructor runs at thread exit
    }
    caches.blocks[c] = new (std::nothrow) void*[kMaxCachedPerClass];
    if (caches.blocks[c] == nullptr) {
      ::operator delete(memory);
      return;
    }
  }
  caches.blocks[c][caches.count[c]++] = memory;
}

}  // namespace ferry::detail
