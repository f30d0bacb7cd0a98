// Settings and statistics shared by ferry's one-to-many senders, Distributor<T> (each
// message to one consumer) and Broadcast<T> (each message to every consumer).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ferry/channel_options.hpp"

namespace ferry {

/// Settings of a Distributor or a Broadcast.
struct FanoutOptions {
  /// Messages a consumer may have in flight (sent to it, not yet returned by its recv())
  /// before it is passed over (Distributor) or waited for (Broadcast); at least 1. add()
  /// may set another bound for one consumer. A consumer holds at most this many messages
  /// to read, so a small bound makes fast consumers run dry and sleep (one wake-up per few
  /// messages) and costs throughput; a large one lets a stalled consumer keep that many
  /// messages from the others (and keeps their storages pinned). A Distributor's window
  /// (work_ahead) keeps a slow worker's share below this; see docs/design/fanout.md,
  /// "Limits". The default lets four consumers as fast as the producer keep up with four
  /// plain channels.
  std::size_t max_in_flight = 128;
  /// Distributor only: how much of a consumer's own work, in its time, may wait in flight
  /// for it. Each consumer's window (the messages it may have in flight now) starts at 4
  /// and follows its measured delivery rate: rate x work_ahead, between 1 and its bound,
  /// at most doubling per window delivered. A pool of uneven workers thus shares a burst
  /// by speed (a worker ten times slower gets a tenth as much), while consumers as fast as
  /// the producer reach their bound within a few hundred messages. A consumer full by its
  /// window (not its bound) that delivered nothing for 4 x max(work_ahead, its time per
  /// message) gets its bound back: consumers that do not read yet (say, the producer's own
  /// thread reads them later) hold up a send that long, not for ever. Zero: no windows,
  /// max_in_flight alone. See docs/design/fanout.md, "Pace".
  std::chrono::microseconds work_ahead{5000};
  /// How often sends check that the consumers still live (one poll() each): a consumer
  /// that died or closed is removed within about this long, at one of the next eight sends
  /// (at the next, when every consumer is full; a send to it that fails removes it at once).
  std::chrono::milliseconds liveness_check_interval{10};
  /// The label introspection shows for the fan-out (ferry/introspection.hpp); may be empty.
  std::string name;
};

/// Names a consumer of a Distributor or Broadcast (add() returns it; never reused).
using ConsumerId = std::uint64_t;

/// One consumer's figures, as stats() reports them.
struct ConsumerStats {
  ConsumerId id = 0;
  Transport transport = Transport::Pipe;
  /// Messages sent to it, and of those, returned by its recv() (delivered) or not yet
  /// (in_flight = sent - delivered).
  std::uint64_t sent = 0;
  std::uint64_t delivered = 0;
  std::size_t in_flight = 0;
  /// Messages it may have in flight now: its bound, or (Distributor, FanoutOptions::work_ahead)
  /// less while its measured pace says so.
  std::size_t window = 0;
  /// Broadcast only: messages it missed because it stayed full until send_for() gave up.
  std::uint64_t skipped = 0;
};

}  // namespace ferry
