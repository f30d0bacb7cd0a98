// Distributor<T>: one producer, many consumers, each message to exactly one of them, the
// one with the fewest messages in flight (a pool of workers balances itself). Consumers
// are ordinary Sender<T> ends (channel(), spawn, accepted ends) and may join at any time;
// one that dies or closes is removed, and the messages its recv() never returned are kept
// for take_undelivered(). See docs/design/fanout.md.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "ferry/channel.hpp"
#include "ferry/detail/fanout_consumers.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/error.hpp"
#include "ferry/fanout.hpp"

namespace ferry {

/// Sends each message to one consumer: the one with the fewest messages in flight (sent,
/// not yet returned by its recv()); among equals, the next in turn. A consumer with its
/// window of messages in flight is full and passed over; send() blocks while every
/// consumer is full. The window is FanoutOptions::max_in_flight at most, less for a
/// consumer whose measured pace says so (FanoutOptions::work_ahead): a burst is shared by
/// the consumers' speeds. Thread-safe; not movable.
///
/// Nothing is silently lost: the Distributor keeps a copy of each message (for tensors, a
/// reference to the same storage), or the message itself when send() is given an rvalue,
/// until the consumer's recv() returned it. A consumer that
/// closed its end or died is removed when a send to it fails, or when a send's periodic
/// check (FanoutOptions::liveness_check_interval) or take_undelivered() finds it gone;
/// the messages it never received are then handed back by take_undelivered(), oldest
/// first, for the caller to send again. Each message sent is thus either returned by
/// exactly one consumer's recv() or handed back once.
template <class T>
class Distributor : public detail::FanoutBase<T, true> {
 public:
  explicit Distributor(FanoutOptions options = {}) : detail::FanoutBase<T, true>(options) {}
  /// Closes every consumer's end: each receives what was sent to it, then end-of-stream.
  ~Distributor() = default;

  // add(end[, bound]), close(), stats(), size(): see detail::FanoutBase.

  /// Sends `message` to the consumer with the fewest messages in flight, blocking while
  /// every consumer is full (or while the chosen one's transport is). Throws
  /// ChannelClosed when there is no consumer (none added, or all removed) or after
  /// close(), and what
  /// Sender::send throws for a message the channel refuses (its limits).
  void send(const T& message) { (void)send_until(message, detail::Deadline::never()); }
  /// Like send(const T&), but keeps `message` itself in flight instead of a copy of it
  /// (no copy of its strings, containers or tensors' shapes). After a send that threw,
  /// `message` holds the message again. (For a T whose moves may throw, an rvalue is
  /// copied as by send(const T&).)
  void send(T&& message) requires detail::NothrowMovable<T> {
    (void)send_until(std::move(message), detail::Deadline::never());
  }
  /// Like send(), but gives up when every consumer stayed full for `timeout`; returns
  /// whether a consumer took the message (an rvalue that none took is left in `message`).
  bool send_for(const T& message, Timeout timeout) { return send_until(message, detail::Deadline::after(timeout)); }
  bool send_for(T&& message, Timeout timeout) requires detail::NothrowMovable<T> {
    return send_until(std::move(message), detail::Deadline::after(timeout));
  }

  /// Removes the consumers known to be gone, and returns (and forgets) every message that
  /// removed consumers never received, oldest first per consumer.
  std::vector<T> take_undelivered() {
    const detail::MutexLock lock(this->mutex_);
    this->consumers_.remove_gone(&undelivered_);
    return std::exchange(undelivered_, {});
  }

 private:
  // `M`: const T& or T. An rvalue is moved only by a send that succeeds (send_to() moves
  // it back otherwise), so the loop may offer it to one consumer after another.
  template <class M>
  bool send_until(M&& message, const detail::Deadline& deadline) {
    auto& consumers = this->consumers_;
    detail::FanoutWait wait;
    detail::MutexLock lock(this->mutex_);
    this->throw_if_closed("Distributor");
    consumers.remove_gone_if_due_at_a_few_sends(&undelivered_);
    while (true) {
      this->throw_if_closed("Distributor");
      if (consumers.empty()) {
        throw ChannelClosed(
            "cannot send: the Distributor has no consumer (add() one; removed consumers' "
            "messages are in take_undelivered())");
      }
      if (const std::size_t chosen = least_loaded(); chosen != kNone) {
        auto& consumer = consumers.all()[chosen];
        try {
          if (!consumers.send_to(consumer, static_cast<M&&>(message), deadline)) return false;
        } catch (const ChannelClosed&) {
          consumers.remove(chosen, &undelivered_);  // gone: try the next one
          continue;
        }
        turn_ = chosen + 1;
        return true;
      }
      // Every consumer is full: one that died stays full for ever, so look for those now and then.
      if (consumers.remove_gone_if_due(&undelivered_)) continue;
      if (consumers.reopen_stalled_windows()) continue;
      if (deadline.expired()) return false;
      consumers.wait_for_room(
          lock, [](const auto&) { return true; }, deadline, wait);
    }
  }

  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);

  // The index of the consumer with room and the fewest messages in flight, the first from
  // turn_ among equals; kNone when all are full. (An index, not an optional: the optional's
  // two parts, stored apart and read back as one, stalled every send.)
  std::size_t least_loaded() FERRY_REQUIRES(this->mutex_) {
    auto& all = this->consumers_.all();
    const std::size_t count = all.size();
    std::size_t best = kNone;
    const std::size_t first = turn_ < count ? turn_ : 0;
    for (std::size_t k = 0, i = first; k < count; ++k, i = i + 1 < count ? i + 1 : 0) {
      this->consumers_.refresh_for_selection(all[i]);
      if (!all[i].has_room()) continue;
      if (best == kNone || all[i].in_flight() < all[best].in_flight()) best = i;
    }
    return best;
  }

  std::vector<T> undelivered_;
  std::size_t turn_ = 0;
};

}  // namespace ferry
