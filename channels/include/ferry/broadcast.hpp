// Broadcast<T>: one producer, many consumers, each message to every consumer. A tensor
// inside travels as a handle to the same storage to each of them (the block is shared,
// never copied per consumer) and is recycled only once the last consumer let go of it.
// Consumers are ordinary Sender<T> ends and may join at any time (they receive the
// messages sent after they joined); one that dies or closes is removed and the others go
// on. See docs/design/fanout.md.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "ferry/channel.hpp"
#include "ferry/detail/fanout_consumers.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/error.hpp"
#include "ferry/fanout.hpp"

namespace ferry {

/// Sends each message to every consumer. A consumer with FanoutOptions::max_in_flight
/// messages in flight (sent, not yet returned by its recv()) is full: send() sends at once
/// to those with room and waits for the full ones; send_for() waits at most its timeout,
/// and a consumer still full then misses the message (ConsumerStats::skipped), so a stalled
/// consumer holds the others back for at most that long. Thread-safe; not movable.
///
/// Storage sharing: every consumer maps the producer's block (one storage, leased to each;
/// ChannelOptions::pool isolation copies into each consumer's pool instead).
template <class T>
class Broadcast : public detail::FanoutBase<T, false> {
 public:
  explicit Broadcast(FanoutOptions options = {}) : detail::FanoutBase<T, false>(options) {}
  /// Closes every consumer's end: each receives what was sent to it, then end-of-stream.
  ~Broadcast() = default;

  // add(end[, bound]), close(), stats(), size(): see detail::FanoutBase.

  /// Sends `message` to every consumer, waiting for each full one until it has room;
  /// returns how many consumers it reached (consumers found gone are removed, not
  /// counted; 0 when there are none). Throws ChannelClosed after close() (also when
  /// close() came while it waited for a full consumer), and what Sender::send throws for
  /// a message the channels refuse (their limits), after sending it to the consumers before.
  std::size_t send(const T& message) { return send_until(message, detail::Deadline::never()); }
  /// Like send(), but a consumer still full (or whose transport is) after `timeout` misses
  /// this message; returns how many consumers it reached.
  std::size_t send_for(const T& message, Timeout timeout) {
    return send_until(message, detail::Deadline::after(timeout));
  }

 private:
  std::size_t send_until(const T& message, const detail::Deadline& deadline) {
    auto& consumers = this->consumers_;
    detail::FanoutWait wait;
    detail::MutexLock lock(this->mutex_);
    this->throw_if_closed("Broadcast");
    consumers.remove_gone_if_due(nullptr);
    // The consumers this message is for: those present now (one added meanwhile gets the next).
    std::vector<ConsumerId> waiting;
    waiting.reserve(consumers.all().size());
    for (const auto& consumer : consumers.all()) waiting.push_back(consumer.id);
    const auto is_waiting = [&waiting](const auto& consumer) {
      return std::find(waiting.begin(), waiting.end(), consumer.id) != waiting.end();
    };
    std::size_t reached = 0;
    while (true) {
      auto& all = consumers.all();
      for (std::size_t i = 0; i < all.size();) {
        auto& consumer = all[i];
        const auto it = std::find(waiting.begin(), waiting.end(), consumer.id);
        if (it == waiting.end()) {
          ++i;
          continue;
        }
        consumers.refresh_for_selection(consumer);
        if (!consumer.has_room()) {
          ++i;
          continue;
        }
        waiting.erase(it);
        try {
          // Room in flight; the transport's own room is waited for here (a consumer whose
          // transport stays full until the deadline misses the message).
          if (consumers.send_to(consumer, message, deadline)) {
            ++reached;
          } else {
            ++consumer.skipped;
          }
        } catch (const ChannelClosed&) {
          consumers.remove(i, nullptr);
          continue;
        }
        ++i;
      }
      // Those removed meanwhile are not waited for.
      std::erase_if(waiting, [&](ConsumerId id) {
        return std::none_of(all.begin(), all.end(), [id](const auto& consumer) { return consumer.id == id; });
      });
      if (waiting.empty()) return reached;
      if (consumers.remove_gone_if_due(nullptr)) continue;
      if (deadline.expired()) {
        for (auto& consumer : all) {
          if (is_waiting(consumer)) ++consumer.skipped;
        }
        return reached;
      }
      consumers.wait_for_room(lock, is_waiting, deadline, wait);
      this->throw_if_closed("Broadcast");
    }
  }
};

}  // namespace ferry
