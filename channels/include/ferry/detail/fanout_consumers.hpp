// The consumers of a Distributor or Broadcast: each one's Sender, its bound, and what is in
// flight to it, counted from the delivery acknowledgements its receiver writes
// (its board's delivery word, see docs/design/fanout.md); how a send sleeps until a full one has
// room; and FanoutBase, what the two classes share (the lock, add(), stats(), size()).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ferry/channel.hpp"
#include "ferry/detail/fanout_registry.hpp"
#include "ferry/detail/fanout_wait.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/error.hpp"
#include "ferry/fanout.hpp"
#include "ferry/wait_interruption.hpp"

namespace ferry::detail {

/// A message type whose moves cannot throw. A Distributor keeps such an rvalue itself: it
/// moves it into its record and, when no consumer took it, back, and neither move may
/// fail halfway (a record left behind, or the message lost).
template <class T>
concept NothrowMovable = std::is_nothrow_move_constructible_v<T> && std::is_nothrow_move_assignable_v<T>;

/// The copies a consumer keeps of its messages in flight, oldest first: with `Copy` (a
/// Distributor hands back what a dead consumer never received) a deque of them, without
/// (a Broadcast) none.
template <class T, bool Copy>
struct InFlightCopies {
  std::deque<T> messages;
};
template <class T>
struct InFlightCopies<T, false> {};

/// The consumer set. Not thread-safe: the owner locks (FanoutBase).
template <class T, bool Copy>
class FanoutConsumers {
 public:
  using Clock = std::chrono::steady_clock;
  struct Consumer {
    ConsumerId id;
    Sender<T> end;
    std::size_t bound;
    std::size_t window;  // messages it may have in flight now: `bound`, or less by its pace (pace())
    // Only this object sends on the end since add(), and a send that failed or timed out
    // committed nothing: the n-th message sent has the end's sequence base_sequence + n,
    // so the messages in flight are those numbered delivered + 1 to sent.
    std::uint64_t base_sequence;  // the end's last sequence when it was added
    std::uint64_t sent = 0;
    std::uint64_t delivered = 0;  // of those sent, as of the last read of the delivery word
    std::uint64_t skipped = 0;
    std::uint64_t sent_at_refresh = 0;  // `sent` when the delivery word was last read
    std::uint64_t refresh_every;        // sends between two reads of the word (refresh_for_selection())
    // Its pace (a Distributor with FanoutOptions::work_ahead): the sample of its delivery rate
    // under way, which began at `sample_since` with `sample_from` delivered (the first send,
    // then the end of the sample before), and whether its window held it back meanwhile.
    std::uint64_t sample_from = 0;
    Clock::time_point sample_since{};
    bool sample_limited = false;
    Clock::duration per_message{};  // its time per message over the last sample
    // The end's frame core, for a framed end (sent on without its lock, see send_end());
    // null for an InProcess end.
    SenderCore* framed;
    // The end's delivery board (Sender::delivery_board()), looked up after the first send;
    // null for an end without one, which is asked delivered() instead.
    std::shared_ptr<const ReturnBoard> board{};
    [[no_unique_address]] InFlightCopies<T, Copy> copies{};
    std::size_t in_flight() const noexcept { return static_cast<std::size_t>(sent - delivered); }
    bool has_room() const noexcept { return in_flight() < window; }
    // The end's sequence number of the n-th message sent (1: the first).
    std::uint64_t sequence_of(std::uint64_t n) const noexcept { return base_sequence + n; }
  };

  explicit FanoutConsumers(const FanoutOptions& options)
      : options_(options),
        work_ahead_(Copy ? std::chrono::duration_cast<Clock::duration>(options.work_ahead) : Clock::duration::zero()),
        liveness_(options.liveness_check_interval) {}

  const FanoutOptions& options() const noexcept { return options_; }
  std::vector<Consumer>& all() noexcept { return consumers_; }
  bool empty() const noexcept { return consumers_.empty(); }

  /// Takes `end` in as a consumer with `bound` messages in flight at most.
  ConsumerId add(Sender<T>&& end, std::size_t bound) {
    if (!end.is_open()) throw ChannelClosed("cannot add a consumer: this Sender is closed, moved from or empty");
    end.track_delivery();
    const std::uint64_t base = end.last_sequence();
    bound = std::max<std::size_t>(bound, 1);
    SenderCore* framed = end.transport() == Transport::InProcess ? nullptr : &EndAccess::core(end);
    const std::size_t window = paced() ? std::min(bound, kFirstWindow) : bound;
    consumers_.push_back(Consumer{.id = next_id_,
                                  .end = std::move(end),
                                  .bound = bound,
                                  .window = window,
                                  .base_sequence = base,
                                  .refresh_every = refresh_interval(window),
                                  .framed = framed});
    return next_id_++;
  }

  /// Forgets the messages `consumer`'s receiver has returned from recv() since the last call.
  void refresh(Consumer& consumer) {
    if (consumer.in_flight() == 0) return;
    consumer.sent_at_refresh = consumer.sent;
    forget_delivered(consumer, consumer.board ? consumer.board->resolved() : consumer.end.delivered());
    pace(consumer);
  }

  /// Like refresh(), but reads the consumer's delivery word (a cache line its receiver
  /// writes at every recv) only when the consumer is full or a sixteenth of its bound was
  /// sent since the last read: with a large bound, the counts a selection compares may be
  /// that many messages too high (why not less often: docs/design/fanout.md).
  void refresh_for_selection(Consumer& consumer) {
    if (!consumer.has_room() || consumer.sent - consumer.sent_at_refresh >= consumer.refresh_every) {
      refresh(consumer);
    }
  }

  /// Sends `message` to `consumer` (waiting at most until `deadline` for room in its
  /// transport) and records it in flight; false when the deadline passed first. Throws
  /// ChannelClosed when the consumer is gone (nothing recorded). With `Copy`, the record
  /// keeps a copy of `message`, or for an rvalue the message itself (moved in, and moved
  /// back into `message` when nothing was sent, so that the caller may try another
  /// consumer).
  template <class M>
  bool send_to(Consumer& consumer, M&& message, const Deadline& deadline) {
    if constexpr (Copy) {
      // Recorded before sending, sent from the record: a record that cannot be made
      // (bad_alloc) leaves nothing sent, and a message sent is always recorded.
      auto& kept = consumer.copies.messages;
      kept.push_back(std::forward<M>(message));
      const auto take_back = [&] {  // [&]: an lvalue `message` is not used
        if constexpr (!std::is_lvalue_reference_v<M>) message = std::move(kept.back());
        kept.pop_back();
      };
      bool sent = false;
      try {
        sent = send_end(consumer, kept.back(), deadline);
      } catch (...) {
        take_back();
        throw;
      }
      if (!sent) {
        take_back();
        return false;
      }
    } else {
      if (!send_end(consumer, message, deadline)) return false;
    }
    if (++consumer.sent == 1) {
      consumer.board = EndAccess::delivery_board(consumer.end);  // the frame carried it
      if (paced()) consumer.sample_since = Clock::now();
    }
    return true;
  }

  /// Removes the consumer at `index`, whose receiver is gone: appends to `undelivered`
  /// (Copy only) the messages its recv() never returned, oldest first.
  void remove(std::size_t index, std::vector<T>* undelivered) {
    Consumer& consumer = consumers_[index];
    refresh(consumer);  // after it is gone: no delivery can be recorded any more
    if constexpr (Copy) {
      if (undelivered) {
        for (T& message : consumer.copies.messages) undelivered->push_back(std::move(message));
      }
    }
    consumers_.erase(consumers_.begin() + static_cast<std::ptrdiff_t>(index));
  }

  /// A Distributor whose consumers are all full: gives their bound back to those full by
  /// their window alone that delivered nothing for 4 x max(work_ahead, their time per
  /// message). They are not slow but not reading (yet): the producer's own thread may read
  /// them after sending, and must not wait for ever. True when it reopened one.
  bool reopen_stalled_windows() {
    if (!paced()) return false;
    std::optional<Clock::time_point> now;
    bool reopened = false;
    for (Consumer& consumer : consumers_) {
      if (!stalled_by_window(consumer)) continue;
      if (!now) now = Clock::now();
      if (*now - consumer.sample_since < patience(consumer)) continue;
      set_window(consumer, consumer.bound);
      consumer.sample_from = consumer.delivered;
      consumer.sample_since = *now;
      consumer.sample_limited = false;
      reopened = true;
    }
    return reopened;
  }

  /// Takes every consumer out (their ends, still open, for the caller to close outside
  /// the lock); the messages they were sent stay with their receivers.
  std::vector<Consumer> take_all() noexcept { return std::exchange(consumers_, {}); }

  /// Removes the consumers known gone when a check is due (FanoutOptions::liveness_check_interval);
  /// true when it checked.
  bool remove_gone_if_due(std::vector<T>* undelivered) {
    if (!liveness_.due()) return false;
    remove_gone(undelivered);
    return true;
  }
  /// remove_gone_if_due() for a send that may find a consumer with room: looks at the
  /// clock at one such send in LivenessSchedule::kCallStride (a dead consumer with room is
  /// found by the send that picks it; this finds one that stays full, or is never picked).
  void remove_gone_if_due_at_a_few_sends(std::vector<T>* undelivered) {
    if (liveness_.due_every_few_calls()) remove_gone(undelivered);
  }

  /// Removes every consumer whose receiver is known gone (Sender::receiver_gone()).
  void remove_gone(std::vector<T>* undelivered) {
    for (std::size_t i = consumers_.size(); i-- > 0;) {
      if (consumers_[i].end.receiver_gone()) remove(i, undelivered);
    }
  }

  /// Waits until one of the full consumers that `waited_for(consumer)` selects has room
  /// (or the deadline, or the next liveness check, comes); `lock` (held on entry and on
  /// return) is released meanwhile, so that add() and other senders go on. `wait` lives
  /// for one send.
  ///
  /// Each such consumer's receiver is asked to ring its board's doorbell once its recv()
  /// has returned half of the consumer's bound (at least one message), and the send sleeps
  /// on all the doorbells at once (one futex_waitv). Like a ring writer that waits for a
  /// quarter of the ring, it wakes once there is room for a run of messages, not one at a
  /// time, while the consumer still has the other half to read: a consumer as fast as the
  /// producer neither runs dry nor moves in lock-step with it (a wake-up and a doorbell
  /// per message), and the wake-ups cost one futex call per half bound. That first sleep
  /// lasts kHalfBoundWait at most; a send that still finds every consumer full then
  /// sleeps until any one of them takes a message (a consumer that took fewer than half
  /// and stalled has its room used). Ends without a board (InProcess) are polled
  /// instead (FanoutWait::pause).
  // Gives `lock` up while it sleeps and takes it back, which the analysis cannot follow
  // through a lock passed by reference.
  template <class Select>
  void wait_for_room(detail::MutexLock& lock, const Select& waited_for, const Deadline& deadline,
                     FanoutWait& wait) FERRY_NO_THREAD_SAFETY_ANALYSIS {
    const bool for_half = !wait.waited_for_half();
    // This call's own requests: several threads may send at once, and each waits on its own.
    std::vector<ReturnBoard::DeliveryWake> wakes;
    bool polled = false;
    for (Consumer& consumer : consumers_) {
      if (consumer.has_room() || !waited_for(consumer)) continue;
      const std::uint64_t target = consumer.sequence_of(consumer.delivered + (for_half ? half_bound(consumer) : 1));
      std::optional<ReturnBoard::DeliveryWake> wake = EndAccess::request_delivery_wake(consumer.end, target);
      if (!wake) {
        polled = true;
        continue;
      }
      forget_delivered(consumer, wake->resolved);
      consumer.sent_at_refresh = consumer.sent;
      pace(consumer);
      const bool reached = wake->resolved >= target || consumer.has_room();
      wakes.push_back(std::move(*wake));
      if (reached) {  // took that many since the last look: no sleep
        cancel_wakes(wakes);
        return;
      }
    }
    auto until = std::min({deadline.time_point(), liveness_.next(), next_reopening()});
    if (for_half) {
      until = std::min(until, std::chrono::steady_clock::now() + kHalfBoundWait);
      wait.set_waited_for_half();
    }
    if (const auto slice = wait_interruption_slice(); slice != std::chrono::nanoseconds::max()) {
      until = std::min(until, std::chrono::steady_clock::now() + slice);  // the thread's check is due
    }
    lock.unlock();
    try {
      if (polled || wakes.empty()) {
        wait.pause(until);
      } else {
        sleep_on_doorbells(wakes, until);
      }
      wait_interruption_point();  // may throw: nothing of this message was sent
    } catch (...) {
      lock.lock();
      cancel_wakes(wakes);
      throw;
    }
    lock.lock();
    cancel_wakes(wakes);
  }

  std::vector<ConsumerStats> stats() {
    std::vector<ConsumerStats> out;
    out.reserve(consumers_.size());
    for (Consumer& consumer : consumers_) {
      refresh(consumer);
      ConsumerStats entry;
      entry.id = consumer.id;
      entry.transport = consumer.end.transport();
      entry.sent = consumer.sent;
      entry.in_flight = consumer.in_flight();
      entry.delivered = consumer.sent - entry.in_flight;
      entry.skipped = consumer.skipped;
      entry.window = consumer.window;
      out.push_back(entry);
    }
    return out;
  }

 private:
  // `delivered`: the end's sequence number up to which its receiver took every frame.
  static void forget_delivered(Consumer& consumer, std::uint64_t delivered) {
    if (delivered <= consumer.sequence_of(consumer.delivered)) return;
    const std::uint64_t now = std::min(delivered - consumer.base_sequence, consumer.sent);
    if constexpr (Copy) {
      auto& messages = consumer.copies.messages;
      for (std::uint64_t n = consumer.delivered; n < now; ++n) messages.pop_front();
    }
    consumer.delivered = now;
  }

  // How long a send's first sleep waits for half a bound to drain (see wait_for_room()).
  static constexpr std::chrono::microseconds kHalfBoundWait{200};

  // How many deliveries leave a full consumer with half its window in flight.
  static std::uint64_t half_bound(const Consumer& consumer) {
    return std::clamp<std::size_t>(consumer.window / 2, 1, consumer.in_flight());
  }

  // ---- pace (docs/design/fanout.md, "Pace") ----
  // The window of a consumer not measured yet.
  static constexpr std::size_t kFirstWindow = 4;

  bool paced() const noexcept { return work_ahead_ > Clock::duration::zero(); }
  static std::uint64_t refresh_interval(std::size_t window) { return std::max<std::size_t>(1, window / 16); }
  static void set_window(Consumer& consumer, std::size_t window) {
    consumer.window = window;
    consumer.refresh_every = refresh_interval(window);
  }

  // After `consumer`'s count was refreshed: ends its rate sample once it delivered its window
  // (or, while its window holds it back, once work_ahead passed with some delivered), and
  // sets its window to what it delivers in work_ahead, at most doubling or halving it,
  // lowering it only when the window held it back (an idle consumer's rate is the
  // producer's, not its own).
  void pace(Consumer& consumer) {
    if (!paced()) return;
    const bool full = !consumer.has_room();
    consumer.sample_limited = consumer.sample_limited || full;
    const std::uint64_t delivered = consumer.delivered - consumer.sample_from;
    if (delivered == 0 || (delivered < consumer.window && !full)) return;
    // A full consumer's sample ends early only after work_ahead: the coarse clock tells
    // (a few ns, where a full consumer is looked at at every send).
    if (delivered < consumer.window && coarse_steady_now() - consumer.sample_since < work_ahead_) return;
    const Clock::time_point now = Clock::now();
    const Clock::duration elapsed = std::max(now - consumer.sample_since, Clock::duration(1));
    consumer.per_message = elapsed / static_cast<Clock::rep>(delivered);
    const double fits = static_cast<double>(delivered) *
                        (static_cast<double>(work_ahead_.count()) / static_cast<double>(elapsed.count()));
    const std::size_t target = fits >= static_cast<double>(consumer.bound)
                                   ? consumer.bound
                                   : std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(fits)));
    if (target > consumer.window) {
      set_window(consumer, std::min(target, consumer.window * 2));
    } else if (consumer.sample_limited) {
      set_window(consumer, std::max(target, consumer.window / 2));  // at most halved: one stall is not a pace
    }
    consumer.sample_from = consumer.delivered;
    consumer.sample_since = now;
    consumer.sample_limited = !consumer.has_room();
  }

  bool stalled_by_window(const Consumer& consumer) const noexcept {
    return consumer.window < consumer.bound && !consumer.has_room() && consumer.delivered == consumer.sample_from;
  }
  Clock::duration patience(const Consumer& consumer) const noexcept {
    return 4 * std::max(work_ahead_, consumer.per_message);
  }
  // When reopen_stalled_windows() may reopen one (time_point::max(): none is stalled).
  Clock::time_point next_reopening() const noexcept {
    Clock::time_point next = Clock::time_point::max();
    if (!paced()) return next;
    for (const Consumer& consumer : consumers_) {
      if (stalled_by_window(consumer)) next = std::min(next, consumer.sample_since + patience(consumer));
    }
    return next;
  }

  static void cancel_wakes(std::vector<ReturnBoard::DeliveryWake>& wakes) noexcept {
    for (const ReturnBoard::DeliveryWake& wake : wakes) wake.board->cancel_delivery_wake();
    wakes.clear();
  }

  // Only this object uses a consumer's end, always under its owner's lock (FanoutBase), so
  // a framed end sends without taking the end's own lock too.
  static bool send_end(Consumer& consumer, const T& message, const Deadline& deadline) {
    if (consumer.framed != nullptr && deadline.is_never()) [[likely]] {
      return send_by_owner(*consumer.framed, &message, sent_type<T>, deadline);
    }
    return send_end_with_deadline(consumer, message, deadline);
  }
  // send_end() for an InProcess end, or with a deadline.
  static bool send_end_with_deadline(Consumer& consumer, const T& message, const Deadline& deadline) {
    if (consumer.framed == nullptr) {  // InProcess
      if (deadline.is_never()) {
        consumer.end.send(message);
        return true;
      }
      return consumer.end.send_for(message, deadline.remaining());  // nothing to flush
    }
    if (!send_by_owner(*consumer.framed, &message, sent_type<T>, deadline)) return false;
    if (deadline.is_never()) return true;
    // Accepted: finish a frame the deadline cut short now rather than at the next send to
    // this consumer, which may come much later. Whatever the flush meets, the frame counts
    // as sent (were it not recorded, the caller could send it twice): a consumer gone
    // meanwhile is found by the next send or liveness check, another failure by the next
    // send to it.
    try {
      (void)flush_by_owner(*consumer.framed, Deadline::after(std::chrono::milliseconds(0)));
    } catch (...) {
    }
    return true;
  }

  FanoutOptions options_;
  Clock::duration work_ahead_;  // zero: no pace (a Broadcast, or FanoutOptions::work_ahead 0)
  LivenessSchedule liveness_;
  std::vector<Consumer> consumers_;
  ConsumerId next_id_ = 1;
};

/// What Distributor and Broadcast share: the lock, the consumers, add(), stats(), size().
template <class T, bool Copy>
class FanoutBase {
 public:
  FanoutBase(const FanoutBase&) = delete;
  FanoutBase& operator=(const FanoutBase&) = delete;

  /// Adds a consumer (any open Sender<T>), with FanoutOptions::max_in_flight, or `bound`,
  /// messages in flight at most. Throws ChannelClosed for a closed or empty end.
  ConsumerId add(Sender<T> end) { return add(std::move(end), default_bound_); }
  ConsumerId add(Sender<T> end, std::size_t bound) {
    const detail::MutexLock lock(mutex_);
    if (closed_) {
      end.close();  // its receiver gets end of stream (not the PeerDied of an end lost to an exception)
      throw ChannelClosed("cannot add a consumer: this fan-out was closed (close()); its end was closed too");
    }
    return consumers_.add(std::move(end), bound);
  }

  /// Ends every consumer's stream: each consumer's recv() returns what was sent to it, then
  /// end of stream. Later sends and add() throw ChannelClosed, and so does a send asleep
  /// on full consumers (woken at once). Callable from any thread, also while another
  /// sends (a send in progress to a consumer's transport finishes first); idempotent.
  /// Each end closes as Sender::close() does (a consumer whose transport is too full for
  /// even the end-of-stream header is waited for, at most ChannelOptions::close_linger).
  /// The messages of consumers removed before stay in take_undelivered().
  void close() {
    std::vector<typename FanoutConsumers<T, Copy>::Consumer> consumers;
    {
      const detail::MutexLock lock(mutex_);
      closed_ = true;
      consumers = consumers_.take_all();
    }
    // A send asleep on full consumers' doorbells wakes, takes the lock and throws (one
    // that polls, for ends without a board, sees the flag at its next look).
    for (auto& consumer : consumers) {
      if (consumer.board) consumer.board->ring_doorbell();
    }
    // Outside the lock: stats() and size() (and sends, which throw) need not wait for a
    // consumer whose transport is full.
    std::exception_ptr first_error;
    for (auto& consumer : consumers) {
      try {
        consumer.end.close();
      } catch (...) {
        if (!first_error) first_error = std::current_exception();
      }
    }
    if (first_error) std::rethrow_exception(first_error);
  }

  /// Per consumer (those not removed): messages sent, delivered, in flight (and, for a
  /// Broadcast, skipped).
  std::vector<ConsumerStats> stats() {
    const detail::MutexLock lock(mutex_);
    return consumers_.stats();
  }
  /// stats(), or std::nullopt when another thread holds the fan-out's lock (introspection).
  std::optional<std::vector<ConsumerStats>> try_stats() {
    if (!mutex_.try_lock()) return std::nullopt;
    const detail::MutexLock lock(mutex_, std::adopt_lock);
    return consumers_.stats();
  }
  /// Consumers not removed so far.
  std::size_t size() {
    const detail::MutexLock lock(mutex_);
    return consumers_.all().size();
  }

 protected:
  explicit FanoutBase(const FanoutOptions& options)
      : consumers_(options),
        default_bound_(options.max_in_flight),
        registration_(
            Copy ? "distributor" : "broadcast", this,
            [](void* self) { return static_cast<FanoutBase*>(self)->try_stats(); }, options.name) {}
  /// Closes every consumer's end: each receives what was sent to it, then end-of-stream.
  ~FanoutBase() = default;

  /// Throws ChannelClosed once close() was called (the lock held).
  void throw_if_closed(const char* what) const FERRY_REQUIRES(mutex_) {
    if (closed_) throw ChannelClosed(std::string("cannot send: this ") + what + " was closed (close())");
  }

  detail::Mutex mutex_;
  FanoutConsumers<T, Copy> consumers_ FERRY_GUARDED_BY(mutex_);
  bool closed_ FERRY_GUARDED_BY(mutex_) = false;
  const std::size_t default_bound_;  // FanoutOptions::max_in_flight
  // Last: registered once the rest is made, unregistered before it goes. (A Distributor
  // keeps copies of what it sent, to resend them: Copy.)
  FanoutRegistration registration_;
};

}  // namespace ferry::detail
