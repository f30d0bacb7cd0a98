// The consumers of a Distributor or Broadcast: each one's Sender, its bound, and what is in
// flight to it, counted from the delivery acknowledgements its receiver writes
// (Sender::delivered(), see docs/design/fanout.md). Not thread-safe: the owner locks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "ferry/channel.hpp"
#include "ferry/detail/fanout_wait.hpp"
#include "ferry/error.hpp"
#include "ferry/fanout.hpp"

namespace ferry::detail {

/// What a consumer holds for each message in flight: `Copy` keeps the message (a
/// Distributor hands back what a dead consumer never received), or nothing but its
/// sequence number (a Broadcast).
template <class T, bool Copy>
struct InFlight;
template <class T>
struct InFlight<T, true> {
  std::uint64_t sequence;
  T message;
};
template <class T>
struct InFlight<T, false> {
  std::uint64_t sequence;
};

template <class T, bool Copy>
class FanoutConsumers {
 public:
  struct Consumer {
    ConsumerId id;
    Sender<T> end;
    std::size_t bound;
    std::deque<InFlight<T, Copy>> in_flight;  // oldest first, sequences increasing
    std::uint64_t base_sequence;  // the end's last sequence when it was added
    std::uint64_t sent = 0;
    std::uint64_t skipped = 0;
    std::uint64_t sent_at_refresh = 0;  // `sent` when delivered() was last read
    bool has_room() const noexcept { return in_flight.size() < bound; }
  };

  explicit FanoutConsumers(const FanoutOptions& options)
      : options_(options), liveness_(options.liveness_check_interval) {}

  const FanoutOptions& options() const noexcept { return options_; }
  std::vector<Consumer>& all() noexcept { return consumers_; }
  bool empty() const noexcept { return consumers_.empty(); }

  /// Takes `end` in as a consumer with `bound` messages in flight at most.
  ConsumerId add(Sender<T>&& end, std::size_t bound) {
    if (!end.is_open()) throw ChannelClosed("cannot add a consumer: this Sender is closed, moved from or empty");
    end.track_delivery();
    const std::uint64_t base = end.last_sequence();
    consumers_.push_back(Consumer{next_id_, std::move(end), std::max<std::size_t>(bound, 1), {}, base});
    return next_id_++;
  }

  /// Forgets the messages `consumer`'s receiver has returned from recv() since the last call.
  void refresh(Consumer& consumer) {
    if (consumer.in_flight.empty()) return;
    consumer.sent_at_refresh = consumer.sent;
    const std::uint64_t delivered = consumer.end.delivered();
    while (!consumer.in_flight.empty() && consumer.in_flight.front().sequence <= delivered) {
      consumer.in_flight.pop_front();
    }
  }

  /// Like refresh(), but reads the consumer's delivery word (a cache line its receiver
  /// writes at every recv) only when the consumer is full or a sixteenth of its bound was
  /// sent since the last read: with a large bound, the counts a selection compares may be
  /// that many messages too high.
  void refresh_for_selection(Consumer& consumer) {
    if (!consumer.has_room() || consumer.sent - consumer.sent_at_refresh >= std::max<std::size_t>(1, consumer.bound / 16)) {
      refresh(consumer);
    }
  }

  /// Sends `message` to `consumer` (waiting at most until `deadline` for room in its
  /// transport) and records it in flight; false when the deadline passed first. Throws
  /// ChannelClosed when the consumer is gone (nothing recorded).
  bool send_to(Consumer& consumer, const T& message, const Deadline& deadline) {
    // Only this object sends on the end since add(): the n-th message it sent has the
    // end's sequence number base + n (a send that failed or timed out committed nothing).
    const std::uint64_t sequence = consumer.base_sequence + consumer.sent + 1;
    if constexpr (Copy) {
      T copy(message);  // before sending: a copy that fails leaves nothing half done
      if (!send_end(consumer.end, copy, deadline)) return false;
      consumer.in_flight.push_back(InFlight<T, true>{sequence, std::move(copy)});
    } else {
      if (!send_end(consumer.end, message, deadline)) return false;
      consumer.in_flight.push_back(InFlight<T, false>{sequence});
    }
    ++consumer.sent;
    return true;
  }

  /// Removes the consumer at `index`, whose receiver is gone: appends to `undelivered`
  /// (Copy only) the messages its recv() never returned, oldest first.
  void remove(std::size_t index, std::vector<T>* undelivered) {
    Consumer& consumer = consumers_[index];
    refresh(consumer);  // after it is gone: no delivery can be recorded any more
    if constexpr (Copy) {
      if (undelivered) {
        for (auto& entry : consumer.in_flight) undelivered->push_back(std::move(entry.message));
      }
    }
    consumers_.erase(consumers_.begin() + static_cast<std::ptrdiff_t>(index));
  }

  /// Removes the consumers known gone when a check is due (FanoutOptions::liveness_check_interval);
  /// true when it checked.
  bool remove_gone_if_due(std::vector<T>* undelivered) {
    if (!liveness_.due()) return false;
    remove_gone(undelivered);
    return true;
  }

  /// Removes every consumer whose receiver is known gone (Sender::receiver_gone()).
  void remove_gone(std::vector<T>* undelivered) {
    for (std::size_t i = consumers_.size(); i-- > 0;) {
      if (consumers_[i].end.receiver_gone()) remove(i, undelivered);
    }
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
      entry.in_flight = consumer.in_flight.size();
      entry.delivered = consumer.sent - entry.in_flight;
      entry.skipped = consumer.skipped;
      out.push_back(entry);
    }
    return out;
  }

 private:
  static bool send_end(Sender<T>& end, const T& message, const Deadline& deadline) {
    if (deadline.is_never()) {
      end.send(message);
      return true;
    }
    if (!end.send_for(message, deadline.remaining())) return false;
    // Accepted: finish a frame the deadline cut short now rather than at the next send to
    // this consumer, which may come much later. A consumer gone meanwhile is found by the
    // next send or liveness check (the message is recorded in flight by then).
    try {
      (void)end.flush(std::chrono::milliseconds(0));
    } catch (const ChannelClosed&) {
    }
    return true;
  }

  FanoutOptions options_;
  LivenessSchedule liveness_;
  std::vector<Consumer> consumers_;
  ConsumerId next_id_ = 1;
};

}  // namespace ferry::detail
