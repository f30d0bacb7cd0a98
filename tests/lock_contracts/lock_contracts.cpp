// The lock contracts of ferry/detail/thread_annotations.hpp, both ways. Built as it is, it
// is a program that exercises Mutex and MutexLock (a scope, unlock() and lock() within it,
// a try-lock adopted, a wait of std::condition_variable_any on the MutexLock, a lock asked
// for while held, threads contending for one Mutex) and exits 0.
// Built by clang with -Wthread-safety -Werror and one of the FERRY_BREAK_* macros, it must
// not compile: each is a use the analysis has to refuse (tests/CMakeLists.txt).
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <thread>
#include <vector>

#include "ferry/detail/thread_annotations.hpp"

namespace {

using ferry::detail::Mutex;
using ferry::detail::MutexLock;

class Counter {
 public:
  void add(int value) {
    const MutexLock lock(mutex_);
    add_locked(value);
    changed_.notify_all();
  }
  // Waits until the total reaches `at_least`, then gives it back and zeroes it.
  int take_when(int at_least) {
    MutexLock lock(mutex_);
    changed_.wait(lock, [&]() FERRY_REQUIRES(mutex_) { return total_ >= at_least; });
    const int taken = total_;
    total_ = 0;
    return taken;
  }
  // Gives the lock up in the middle of its scope and takes it again.
  int add_twice_around_a_gap(int value) {
    MutexLock lock(mutex_);
    add_locked(value);
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
    add_locked(value);
    return total_;
  }
  // Holds the mutex while another thread adds: that thread sleeps on the Mutex (its
  // contended path) until the unlock wakes it. Returns the total the other thread left.
  int add_from_a_thread_while_held() {
    std::thread other;
    {
      const MutexLock lock(mutex_);
      other = std::thread([this] { add(1); });
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (total_ != 0) return -1;  // the other thread got in while the mutex was held
    }
    other.join();
    const MutexLock lock(mutex_);
    return total_;
  }
  bool try_add(int value) {
    if (!mutex_.try_lock()) return false;
    const MutexLock lock(mutex_, std::adopt_lock);
    add_locked(value);
    return true;
  }

#ifdef FERRY_BREAK_UNLOCKED_MEMBER
  void broken() { total_ = 1; }  // a guarded member written without its mutex
#endif
#ifdef FERRY_BREAK_UNLOCKED_CALL
  void broken() { add_locked(1); }  // a *_locked function called without the mutex
#endif
#ifdef FERRY_BREAK_AFTER_UNLOCK
  void broken() {
    MutexLock lock(mutex_);
    lock.unlock();
    total_ = 1;  // after the scope gave the mutex up
  }
#endif
#ifdef FERRY_BREAK_UNANNOTATED_PREDICATE
  void broken() {
    MutexLock lock(mutex_);
    changed_.wait(lock, [&] { return total_ > 0; });  // the predicate does not say it holds the mutex
  }
#endif

 private:
  void add_locked(int value) FERRY_REQUIRES(mutex_) { total_ += value; }

  Mutex mutex_;
  std::condition_variable_any changed_;
  int total_ FERRY_GUARDED_BY(mutex_) = 0;
};

}  // namespace

int main() {
  Counter counter;
  if (counter.add_twice_around_a_gap(2) != 4) return std::puts("unlock()/lock() within a scope lost a change"), 1;
  if (!counter.try_add(1)) return std::puts("try_lock() of a free Mutex failed"), 1;
  std::thread adder([&] {
    for (int i = 0; i < 5; ++i) counter.add(1);
  });
  const int taken = counter.take_when(10);
  adder.join();
  if (taken != 10) return std::printf("the wait returned at %d, not 10\n", taken), 1;
  if (const int total = counter.add_from_a_thread_while_held(); total != 1) {
    return std::printf("a thread that asked for a held Mutex left %d, not 1 after the unlock\n", total), 1;
  }
  // Threads taking one Mutex in turn, more of them than CPUs: waiters sleep and are woken.
  // A lost wake-up hangs here (ctest's timeout); a broken exclusion loses additions.
  Counter contended;
  constexpr int kThreads = 4;
  constexpr int kAdds = 20000;
  std::vector<std::thread> adders;
  for (int t = 0; t < kThreads; ++t) {
    adders.emplace_back([&] {
      for (int i = 0; i < kAdds; ++i) contended.add(1);
    });
  }
  for (std::thread& thread : adders) thread.join();
  if (const int total = contended.take_when(0); total != kThreads * kAdds) {
    return std::printf("%d threads adding %d each under one Mutex left %d\n", kThreads, kAdds, total), 1;
  }
  return 0;
}
