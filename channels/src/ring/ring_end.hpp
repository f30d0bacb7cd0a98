// What both ends of a shared-memory ring share: the mapped segment, the companion socket
// that tells whether the peer still exists, copies in and out of the wrapping data, and
// the spin-then-futex wait. Used by RingFrameWriter and RingFrameReader.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "ferry/detail/deadline.hpp"
#include "ferry/detail/transport.hpp"
#include "ferry/detail/unique_fd.hpp"
#include "ring/ring_segment.hpp"
#include "ring/spin_policy.hpp"

namespace ferry::detail {

/// A non-owning reference to a condition (a callable returning bool) that a wait polls.
class Condition {
 public:
  template <class F>
  Condition(const F& condition) noexcept  // NOLINT: implicit on purpose, like function_ref
      : object_(&condition), call_([](const void* object) { return (*static_cast<const F*>(object))(); }) {}
  bool operator()() const { return call_(object_); }

 private:
  const void* object_;
  bool (*call_)(const void*);
};

/// How a wait ended.
enum class WaitOutcome {
  Ready,     ///< the condition became true
  Timeout,   ///< the deadline passed first
  PeerGone,  ///< every process holding the other end dropped it or died
};

/// One end's view of a ring: its share of the segment's mapping (both ends of a channel
/// in one process share one mapping) and its end of the companion socket pair. Each end
/// holds one side of an AF_UNIX socket pair on which only segment fds are ever sent (writer
/// to reader, SegmentFdChannel); when the last process holding the other side exits,
/// however it exits, the kernel reports a hang-up on this side. That is how a ring end
/// tells a dead or departed peer from a slow one.
class RingEnd {
 public:
  RingEnd(std::shared_ptr<const RingSegment> segment, UniqueFd companion, const RingTiming& timing);

  bool is_open() const noexcept { return segment_ != nullptr; }
  RingHeader& header() const noexcept { return segment_->header(); }
  /// This end's copy of the capacity (a power of two).
  std::uint64_t capacity() const noexcept { return capacity_; }

  /// Where stream position `position` lies in this process; the `capacity()` bytes from
  /// there are contiguous (the data is mapped twice in a row).
  std::byte* at(std::uint64_t position) const noexcept {
    return data_ + static_cast<std::size_t>(position & (capacity_ - 1));
  }
  /// Copies `size` (<= capacity) bytes to stream position `position`, wrapping around.
  /// Inline, so that copies of a known size (a frame header) compile to a few moves.
  void copy_in(std::uint64_t position, const std::byte* from, std::size_t size) const noexcept {
    std::memcpy(at(position), from, size);  // contiguous: the data is mapped twice in a row
  }
  /// Copies `size` (<= capacity) bytes from stream position `position`, wrapping around.
  void copy_out(std::uint64_t position, std::byte* to, std::size_t size) const noexcept {
    std::memcpy(to, at(position), size);
  }

  /// True when the peer's end is gone for good (asks the kernel: one poll system call).
  /// Sticky: once gone, always gone.
  bool peer_gone();
  /// Like peer_gone(), but asks the kernel at most once per peer_check_interval; false
  /// without a system call in between.
  bool peer_gone_lately();

  /// Waits until `ready()` holds: checks it, spins for the spin budget, then sleeps on
  /// `word` (the futex word this end sleeps on, see ring_layout.hpp) with a timeout so
  /// that the peer's liveness is checked every peer_check_interval. A sleep that begins
  /// within `first_sleep` of announcing it ends by then and re-checks `ready()` (a wait
  /// whose wake-up the peer may owe: see publish_unfenced()). Returns Timeout when the
  /// deadline passed, PeerGone when the peer is gone and `ready()` is still false.
  /// The spin budget adapts to how waits end (SpinPolicy). While spinning, the clock is
  /// read every 16 spins and never between `ready()` turning true and the return: a wait
  /// that ends within its first 16 spins reads no clock, and a longer catch counts the time
  /// spun up to the last reading. A wait that slept reads it once more to time the wake-up.
  /// The time blocked is charged to `charged` (the transport end's waits_charged_to()).
  WaitOutcome wait(std::atomic<std::uint32_t>& word, Condition ready, const Deadline& deadline, EndStats* charged,
                   std::chrono::nanoseconds first_sleep = std::chrono::nanoseconds::max());

  /// Wakes the peer if it sleeps on `word`, leaving in the word the CPU this thread runs
  /// on. Only publish(), publish_unfenced() and settle() call it, after the fence that pairs
  /// with the sleeper (see wait()), or having seen the sleeper's 1 (publish_unfenced()).
  static void wake(std::atomic<std::uint32_t>& word) noexcept;
  /// Stores `value` into `position` (release), then wakes the peer sleeping on `word`.
  /// A sequentially consistent fence between the two pairs with the sleeper's store of its
  /// word and load of the position (see wait()), without a locked write to the position's
  /// line, which the peer may be polling (docs/design/shm-ring.md, "Waiting").
  static void publish(std::atomic<std::uint64_t>& position, std::uint64_t value,
                      std::atomic<std::uint32_t>& word) noexcept;
  /// Stores `value` into `position` (release) without the fence: the peer sees it as soon
  /// as with publish(), and a peer already asleep on `word` is woken, but one that goes to
  /// sleep at this very moment may not be (it then wakes after its `first_sleep`). Returns
  /// true when that wake-up check is still owed: settle() pays it, after the fence. Used
  /// where the fence would delay the caller's next message (docs/design/shm-ring.md,
  /// "Waiting").
  [[nodiscard]] static bool publish_unfenced(std::atomic<std::uint64_t>& position, std::uint64_t value,
                                             std::atomic<std::uint32_t>& word) noexcept;
  /// The fence and the wake-up check that publish_unfenced() left owed.
  static void settle(std::atomic<std::uint32_t>& word) noexcept;

  /// Drops this end's share of the mapping and its companion socket.
  void close() noexcept;
  /// The memfd of the segment and this end's companion socket.
  std::vector<int> descriptors() const;
  /// This end's companion socket: it reports POLLRDHUP (hang-up) once the peer is gone, and
  /// POLLIN on the reader's side while segment fds wait there.
  int companion_fd() const noexcept { return companion_.get(); }

 private:
  // Sleeps until ready() holds; `waker` tells who woke us (Unknown when nobody did).
  WaitOutcome sleep(std::atomic<std::uint32_t>& word, Condition ready, const Deadline& deadline,
                    std::chrono::nanoseconds first_sleep, Waker& waker);

  std::shared_ptr<const RingSegment> segment_;
  std::byte* data_ = nullptr;
  std::uint64_t capacity_ = 0;
  UniqueFd companion_;
  std::chrono::milliseconds peer_check_interval_;  // 1 ms to 1 hour
  SpinPolicy spin_;
  // When the peer is due for its next check, on CLOCK_MONOTONIC_COARSE (nanoseconds): that
  // clock costs a few nanoseconds to read, so a send can afford to look at it.
  std::int64_t next_peer_check_ = 0;
  bool peer_gone_ = false;
};

/// A pause for a spinning loop (the x86 `pause`, the Arm `yield`).
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace ferry::detail
