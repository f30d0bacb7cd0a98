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

struct FreeBlock {
  FreeBlock* next;
};

// Trivially destructible, so that it is usable until the thread's very end; `Reaper`
// empties it when the thread exits and marks it closed.
struct Caches {
  FreeBlock* head[kClasses];
  std::uint32_t count[kClasses];
  bool reaper_registered;
  bool closed;
};
constinit thread_local Caches t_caches{};

void release_all(Caches& caches) noexcept {
  for (std::size_t c = 0; c < kClasses; ++c) {
    while (FreeBlock* block = caches.head[c]) {
      caches.head[c] = block->next;
      ::operator delete(block);
    }
    caches.count[c] = 0;
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
  if (FreeBlock* block = caches.head[c]) {
    caches.head[c] = block->next;
    --caches.count[c];
    return block;
  }
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
  if (!caches.reaper_registered) {
    caches.reaper_registered = true;
    [[maybe_unused]] Reaper& reaper = t_reaper;  // first use: its destructor runs at thread exit
  }
  auto* block = static_cast<FreeBlock*>(memory);
  block->next = caches.head[c];
  caches.head[c] = block;
  ++caches.count[c];
}

}  // namespace ferry::detail
