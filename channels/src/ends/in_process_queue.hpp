// The queue behind Transport::InProcess channels (see ferry/detail/in_process_channel.hpp for
// the parcels it carries); only the untyped ends and the Selector use it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ferry/detail/deadline.hpp"
#include "ferry/detail/end_claim.hpp"
#include "ferry/detail/in_process_channel.hpp"
#include "ferry/detail/transport.hpp"
#include "introspection/described_list.hpp"

namespace ferry::detail {

/// The state both ends of an in-process channel share, without the value type: a queue of
/// parcels (an empty one marks the end of the stream) and a semaphore that counts free
/// places, so that a sender blocks while `capacity` values wait. Values arrive in the order
/// they were queued, from whichever thread (one producer token, under a lock). The queue
/// itself lives in in_process_channel.cpp, so that only that file compiles moodycamel's
/// queue.
///
/// End of stream: close_sender() records how many values were sent in all, and the
/// receiver reports the end only once it has received that many. A sender dropped by an
/// exception (drop_sender()) ends the stream the same way, but the receiver then gets
/// PeerDied instead of end of stream, as from a crashed peer on the other transports.
///
/// Introspection lists the queue as its two ends (labelled `label`), counted by the queue's
/// own bookkeeping since it was made.
class InProcessQueue final : public Described {
 public:
  explicit InProcessQueue(std::size_t capacity, std::string label = {});
  ~InProcessQueue();
  InProcessQueue(const InProcessQueue&) = delete;
  InProcessQueue& operator=(const InProcessQueue&) = delete;

  /// Throws EndOwnedElsewhere in any process but the one that made the queue: a child of
  /// fork() holds a private copy, which no other process ever reads (`role` names the end).
  void check_process(const char* role) const {
    if (current_process_id() != creator_) [[unlikely]]
      throw_other_process(role);
  }
  /// Takes one free place, waiting until `deadline`; false on timeout. Throws
  /// ChannelClosed when the receiver closed.
  bool reserve(const Deadline& deadline);
  /// Queues `parcel` in a place taken by reserve(). Throws ChannelClosed (and gives the
  /// place back) when either end closed meanwhile.
  void push(std::unique_ptr<Parcel> parcel);
  /// Ends the stream after the values sent so far. Idempotent.
  void close_sender() noexcept;
  /// Cuts the stream off after the values sent so far, for a sender destroyed while an
  /// exception unwinds: the receiver gets them, then PeerDied (on every later call).
  /// No effect once the sender closed.
  void drop_sender() noexcept;
  /// Neither end has closed.
  bool sender_open() const noexcept;

  /// Takes the next parcel, waiting until `deadline`. One receiving thread at a time.
  /// Throws PeerDied once every value of a dropped sender was taken.
  ReadStatus receive(std::unique_ptr<Parcel>& out, const Deadline& deadline);
  /// Closes the receiving end: senders (also those waiting for room) get ChannelClosed,
  /// and the values still queued are destroyed.
  void close_receiver() noexcept;
  bool receiver_open() const noexcept;
  /// True when receive() would return without waiting (a value or the end of the stream is
  /// queued, or the receiver closed); false may be briefly stale while a value is being
  /// queued. For the receiving thread (a Selector waiting on this queue).
  bool ready() const noexcept;
  /// Values queued so far, and values the receiver took so far: values leave in the order
  /// they were queued (from any thread), so the receiver has taken the first taken() of them.
  std::uint64_t sent() const noexcept;
  std::uint64_t taken() const noexcept;
  /// Both ends, for introspection; waits for no lock a send holds.
  void describe(Snapshot& out) const override;

 private:
  struct State;
  // Ends the stream after the values sent so far; `dropped`: as PeerDied.
  void end_stream(bool dropped) noexcept;
  [[noreturn]] void throw_other_process(const char* role) const;
  std::unique_ptr<State> state_;
  pid_t creator_ = current_process_id();
  std::string label_;
  std::uint64_t sender_id_;  // introspection's ids of the two ends (next_end_id())
  std::uint64_t receiver_id_;
};

}  // namespace ferry::detail
