// The counters of one channel end that introspection reports (ferry/introspection.hpp),
// kept in the end itself (SenderCore, ReceiverCore) and read by any thread without a lock.
//
// Contract:
// - Kept only while introspection is on (introspecting()): a send or recv reads the flag
//   once, after the frame moved, and while it is off touches nothing here (one predictable
//   branch; a transport's wait reads the flag before anything else too). Counts therefore
//   start when introspection is turned on.
// - Each counter has one writer: the thread inside the end's send or recv (they run under
//   the end's lock, or under a fan-out's, which owns the end); last activity's is the
//   introspection server's thread. It adds with one unlocked add to memory on x86-64 (a
//   relaxed load and store elsewhere), no locked instruction; readers see each counter
//   tear-free, the counters together only roughly consistent. What a message writes
//   shares one cache line, the end's own.
// - Per message: four additions, no branch, no clock read. Messages in flight are not kept
//   here: a sender's describe() reads them off its encoder's frame count and the return
//   board. Last activity is sampled: every kActivityTick the server marks an end whose
//   message count moved as active then.
// - The time blocked is measured on the waiting path only (a ring end that spun 16 rounds
//   without its peer answering, a pipe or socket end about to poll, a socket's untimed
//   receive in its blocking recvmsg), charged to the end its transport end serves
//   (FrameWriter::charge_waits_to()): an end that finds room or a message at once reads no
//   clock, except a socket's untimed receive, which cannot tell before its recvmsg.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#if defined(__SANITIZE_THREAD__)
#define FERRY_DETAIL_END_STATS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_DETAIL_END_STATS_TSAN 1
#endif
#endif

namespace ferry::detail {

/// Whether introspection is on in this process (ferry::enable_introspection(), or
/// FERRY_INTROSPECT=1). Relaxed: a counter that starts a little late is fine.
inline std::atomic<bool> g_introspecting{false};
inline bool introspecting() noexcept { return g_introspecting.load(std::memory_order_relaxed); }

/// CLOCK_MONOTONIC in nanoseconds (what steady_clock reads on Linux).
inline std::int64_t monotonic_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
/// How often the introspection server samples each end's last activity (sample_activity()).
/// A clock read per message would cost 10-50 ns on a VM; a sample every tick costs nothing
/// on the message path.
inline constexpr std::chrono::milliseconds kActivityTick{20};

struct alignas(64) EndStats {
  // Written per message, first: one cache line.
  std::atomic<std::uint64_t> messages{0};
  std::atomic<std::uint64_t> bytes{0};
  std::atomic<std::uint64_t> tensors{0};       ///< tensor storages the frames named
  std::atomic<std::uint64_t> new_segments{0};  ///< shared-memory segments the frames introduced
  // Written while waiting, by the server's tick, or once.
  std::uint64_t id = 0;  ///< next_end_id(), set as the end is made
  /// Bytes of each message that `bytes` leaves out, added when it is read (bytes_moved()):
  /// a receiver counts the frame's payload per message, its fixed-size header here.
  std::uint32_t header_bytes = 0;
  std::atomic<std::uint64_t> blocked_ns{0};       ///< total time waiting for room or for a message
  std::atomic<std::int64_t> blocked_since_ns{0};  ///< monotonic_ns() the current wait began; 0: none
  std::atomic<std::int64_t> last_activity_ns{0};  ///< when the last message moved, to kActivityTick; 0: unknown
  std::uint64_t messages_sampled = 0;             ///< messages at the last sample_activity()
  std::atomic<std::int32_t> peer_pid{0};          ///< 0: unknown
  std::atomic<bool> peer_died{false};

  /// One message moved: `frame_bytes` on the wire, naming `storages` and introducing
  /// `segments` (only while introspection is on).
  void count(std::uint64_t frame_bytes, std::uint32_t storages, std::uint32_t segments) noexcept {
    add(messages, 1);
    add(bytes, frame_bytes);
    // Without a branch: two adds cost what testing for tensors costs.
    add(tensors, storages);
    add(new_segments, segments);
  }
  /// Bytes on the wire so far (`bytes`, and each message's header where counted apart).
  std::uint64_t bytes_moved() const noexcept {
    return bytes.load(std::memory_order_relaxed) + messages.load(std::memory_order_relaxed) * header_bytes;
  }
  /// The server's tick, every kActivityTick (under the list of live ends' lock, its only
  /// caller): the end was last active `now` if it moved a message since the last tick. A
  /// process without a server (a child forked without one) does not know it (0).
  void sample_activity(std::int64_t now) noexcept {
    const std::uint64_t moved = messages.load(std::memory_order_relaxed);
    if (moved == messages_sampled) return;
    messages_sampled = moved;
    last_activity_ns.store(now, std::memory_order_relaxed);
  }
  /// `counter` += `amount`, by its one writer: readers on other threads see the old value or
  /// the new one. On x86-64 one unlocked add to memory (an aligned 8-byte write is never
  /// torn there), where a relaxed load and store cost three instructions; elsewhere, and
  /// under ThreadSanitizer (which must see the write), the relaxed load and store.
  static void add(std::atomic<std::uint64_t>& counter, std::uint64_t amount) noexcept {
#if defined(__x86_64__) && !defined(FERRY_DETAIL_END_STATS_TSAN)
    static_assert(sizeof(counter) == sizeof(std::uint64_t) && std::atomic<std::uint64_t>::is_always_lock_free);
    // volatile: kept and in order even where this thread never reads the counter again.
    asm volatile("addq %1, %0" : "+m"(counter) : "er"(amount));
#else
    counter.store(counter.load(std::memory_order_relaxed) + amount, std::memory_order_relaxed);
#endif
  }
};

/// A transport's wait, charged to `charged` (the end the transport serves, see
/// FrameWriter::charge_waits_to(); nullptr: nobody, as a handshake's): blocked from begin()
/// until end() or destruction. While introspection is off it reads the flag only, and
/// never a clock.
class BlockedSpan {
 public:
  explicit BlockedSpan(EndStats* charged) noexcept : stats_(introspecting() ? charged : nullptr) {}
  ~BlockedSpan() {
    if (since_ != 0) [[unlikely]]
      end_at(monotonic_ns());
  }
  BlockedSpan(const BlockedSpan&) = delete;
  BlockedSpan& operator=(const BlockedSpan&) = delete;

  bool active() const noexcept { return stats_ != nullptr; }
  /// The wait began at `at` (monotonic ns); nothing after the first call.
  void begin_at(std::int64_t at) noexcept {
    if (stats_ == nullptr || since_ != 0) return;
    since_ = at;
    stats_->blocked_since_ns.store(at, std::memory_order_relaxed);
  }
  void begin_now() noexcept {
    if (stats_ != nullptr && since_ == 0) begin_at(monotonic_ns());
  }
  /// The wait ended at `at`.
  void end_at(std::int64_t at) noexcept {
    if (since_ == 0) return;
    if (at > since_) EndStats::add(stats_->blocked_ns, static_cast<std::uint64_t>(at - since_));
    stats_->blocked_since_ns.store(0, std::memory_order_relaxed);
    since_ = 0;
  }

 private:
  EndStats* stats_;
  std::int64_t since_ = 0;
};

inline std::int64_t to_ns(std::chrono::steady_clock::time_point at) noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
}

}  // namespace ferry::detail

#undef FERRY_DETAIL_END_STATS_TSAN
