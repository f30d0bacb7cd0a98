#pragma once
// Lock contracts the compiler checks: clang's thread-safety analysis (-Wthread-safety, on
// with -Werror in the clang builds) proves at compile time that a member marked
// FERRY_GUARDED_BY(mutex_) is touched only with mutex_ held, and that a function marked
// FERRY_REQUIRES(mutex_) (ferry's `*_locked` functions) is called only with it held. Under
// g++ the macros expand to nothing; Mutex and MutexLock stay: Mutex a lock of one word
// (below), MutexLock a thin wrapper of std::unique_lock that inlines away.
//
//   class Board {
//     void add(int v) { const MutexLock lock(mutex_); add_locked(v); }
//     void add_locked(int v) FERRY_REQUIRES(mutex_) { total_ += v; }
//     Mutex mutex_;
//     int total_ FERRY_GUARDED_BY(mutex_) = 0;
//   };
//
// std::mutex cannot carry the capability attribute (libstdc++ does not annotate it), hence
// a Mutex of ferry's own. It is a word (0 free, 1 held, 2 held with waiters) whose
// uncontended lock and unlock are one atomic instruction each, inline: a std::mutex costs a
// call into the C library and about 25 instructions each way, which every send and receive
// pays twice. A contended lock sleeps on the word (std::atomic::wait, a futex on Linux). MutexLock holds a Mutex for
// its scope and may be unlocked and locked again within it (lock.unlock(); poll(); lock.lock();), which the analysis
// follows. To wait on a condition, use std::condition_variable_any with the MutexLock itself as its lock:
// `ready_.wait(lock, [&]() FERRY_REQUIRES(mutex_) { return done_; })` (a lambda's body is
// analysed on its own, so a predicate that reads guarded members says that it runs with the
// mutex held). FERRY_NO_THREAD_SAFETY_ANALYSIS is for the few functions whose locking the
// analysis cannot follow; each use says why on its line.
//
// Names follow clang's documentation (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html).

#include <atomic>
#include <cstdint>
#include <mutex>

#if defined(__clang__)
#define FERRY_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define FERRY_THREAD_ANNOTATION(x)
#endif

#define FERRY_CAPABILITY(name) FERRY_THREAD_ANNOTATION(capability(name))
#define FERRY_SCOPED_CAPABILITY FERRY_THREAD_ANNOTATION(scoped_lockable)
#define FERRY_GUARDED_BY(mutex) FERRY_THREAD_ANNOTATION(guarded_by(mutex))
#define FERRY_PT_GUARDED_BY(mutex) FERRY_THREAD_ANNOTATION(pt_guarded_by(mutex))
#define FERRY_REQUIRES(...) FERRY_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define FERRY_EXCLUDES(...) FERRY_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define FERRY_ACQUIRE(...) FERRY_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define FERRY_RELEASE(...) FERRY_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define FERRY_TRY_ACQUIRE(...) FERRY_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define FERRY_ASSERT_CAPABILITY(mutex) FERRY_THREAD_ANNOTATION(assert_capability(mutex))
#define FERRY_RETURN_CAPABILITY(mutex) FERRY_THREAD_ANNOTATION(lock_returned(mutex))
#define FERRY_NO_THREAD_SAFETY_ANALYSIS FERRY_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace ferry::detail {

/// A mutex the analysis knows as a capability, with std::mutex's contract (Lockable). Not
/// recursive; lock it through MutexLock. Process-private: a copy inherited through fork()
/// is held in the child exactly when it was held in the parent at the fork, as a std::mutex
/// would be. The word's protocol is the classic one (U. Drepper, "Futexes Are Tricky",
/// mutex 2): an unlock that finds 2 (held with waiters) wakes one of them.
class FERRY_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() FERRY_ACQUIRE() {
    if (!try_lock()) [[unlikely]]
      lock_contended();
  }
  void unlock() FERRY_RELEASE() {
    if (word_.exchange(kFree, std::memory_order_release) == kHeldWithWaiters) [[unlikely]]
      word_.notify_one();
  }
  bool try_lock() FERRY_TRY_ACQUIRE(true) {
    std::uint32_t free = kFree;
    return word_.compare_exchange_strong(free, kHeld, std::memory_order_acquire, std::memory_order_relaxed);
  }

 private:
  static constexpr std::uint32_t kFree = 0;
  static constexpr std::uint32_t kHeld = 1;
  static constexpr std::uint32_t kHeldWithWaiters = 2;

  // Marks the word "held with waiters" and sleeps until an unlock frees it. Whoever takes it
  // this way keeps the mark (it cannot tell whether others still wait), so that its unlock
  // wakes the next waiter.
  [[gnu::noinline, gnu::cold]] void lock_contended() FERRY_NO_THREAD_SAFETY_ANALYSIS {
    while (word_.exchange(kHeldWithWaiters, std::memory_order_acquire) != kFree) word_.wait(kHeldWithWaiters);
  }

  std::atomic<std::uint32_t> word_{kFree};
};

/// Holds a Mutex from construction to destruction (std::unique_lock's role). unlock() and
/// lock() give it up and take it again within the scope. A try-lock is
/// `if (!mutex_.try_lock()) return; const MutexLock lock(mutex_, std::adopt_lock);`.
/// It is BasicLockable, so std::condition_variable_any waits on it.
class FERRY_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) FERRY_ACQUIRE(mutex) : lock_(mutex) {}
  MutexLock(Mutex& mutex, std::adopt_lock_t) FERRY_REQUIRES(mutex) : lock_(mutex, std::adopt_lock) {}
  ~MutexLock() FERRY_RELEASE() = default;
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void lock() FERRY_ACQUIRE() { lock_.lock(); }
  void unlock() FERRY_RELEASE() { lock_.unlock(); }

 private:
  std::unique_lock<Mutex> lock_;
};

}  // namespace ferry::detail
