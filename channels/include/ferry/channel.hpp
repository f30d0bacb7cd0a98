// Typed channels: Sender<T> and Receiver<T>, created as a connected pair by channel<T>().
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "ferry/channel_options.hpp"
#include "ferry/detail/channel_ends.hpp"
#include "ferry/detail/in_process_channel.hpp"
#include "ferry/detail/type_name.hpp"
#include "ferry/shared_allocator.hpp"
#include "ferry/tensor_wire.hpp"

namespace ferry {

class Selector;

/// The result of a receive that may time out: a value, a timeout, or the end of the stream.
template <class T>
class RecvResult {
 public:
  RecvResult(ReadStatus status, std::optional<T> value) : status_(status), value_(std::move(value)) {}
  RecvResult() noexcept : status_(ReadStatus::Closed) {}
  /// True when a value arrived.
  explicit operator bool() const noexcept { return value_.has_value(); }
  bool has_value() const noexcept { return value_.has_value(); }
  /// True when nothing arrived before the deadline (the channel is still open).
  bool timed_out() const noexcept { return status_ == ReadStatus::Timeout; }
  /// True when the sender closed the stream: no value will ever arrive.
  bool closed() const noexcept { return status_ == ReadStatus::Closed; }
  /// The value; std::bad_optional_access when none arrived.
  T& value() & { return value_.value(); }
  const T& value() const& { return value_.value(); }
  T&& value() && { return std::move(value_).value(); }
  /// The value, which must have arrived.
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  /// The value as an optional (empty on timeout or end of stream).
  std::optional<T> take() && { return std::move(value_); }

 private:
  template <class>
  friend class Receiver;  // receives in place
  ReadStatus status_;
  std::optional<T> value_;
};

/// The sending end of a channel of T. Move-only; send() may be called from several
/// threads. Destroying the Sender in the process that owns it closes the stream, unless it
/// is destroyed by an exception unwinding the stack: then the receiver sees PeerDied, as
/// it would for a crash, instead of a clean end of stream.
///
/// An end belongs to one process (see ferry/detail/end_claim.hpp). A copy inherited
/// through fork() may be used only after a handover (spawn(), or detach() in the giving
/// process and adopt() in the taking one), or when no process used the end yet (the first
/// user takes it); any other use throws EndOwnedElsewhere. A copy that does not own the
/// end never ends the stream: its close() and destructor only let go of its descriptors.
template <class T>
class Sender {
 public:
  Sender() = default;
  /// The typed end over an untyped one (channel<T>() makes them).
  explicit Sender(detail::SenderEnd end) noexcept : end_(std::move(end)) {}

  /// Sends `value`, blocking while the transport is full. Tensors inside travel as
  /// handles. Throws ChannelClosed when the receiver is gone or this end was closed, and
  /// Error, sending nothing, when the message is above the channel's limits
  /// (ChannelOptions::limits: storages, body bytes ...), which the receiver enforces.
  void send(const T& value) { send_until(value, detail::Deadline::never()); }
  /// Like send(const T&); an InProcess channel moves `value` instead of copying it.
  void send(T&& value) { send_until(std::move(value), detail::Deadline::never()); }
  /// Like send(), but gives up when the transport stays full for `timeout`; returns
  /// whether the value was accepted. A value is never half sent: one whose frame was
  /// started when the time ran out is accepted, and the rest of its frame goes out with
  /// the next send(), flush() or close().
  bool send_for(const T& value, Timeout timeout) { return send_until(value, detail::Deadline::after(timeout)); }
  /// Like send_for(const T&); an InProcess channel moves `value` when it accepts it (and
  /// leaves it untouched otherwise).
  bool send_for(T&& value, Timeout timeout) { return send_until(std::move(value), detail::Deadline::after(timeout)); }
  /// Finishes writing a value that send_for() accepted but could not finish; returns
  /// false if the transport stayed full for `timeout`. (InProcess: nothing to finish.)
  bool flush(Timeout timeout) { return end_.flush(detail::Deadline::after(timeout)); }
  /// Ends the stream: the receiver gets end-of-stream after the values sent before.
  /// Idempotent; does not throw when the receiver is already gone (only ProtocolError,
  /// when another process corrupted a ShmRing's shared positions; the end is closed anyway).
  /// The end of the stream is a bare 56-byte frame header: a pipe, socket or ring too full
  /// for any message may still take it, and close() then returns at once (the receiver
  /// gets end-of-stream after the values). Only when it does not fit does close() wait, at
  /// most ChannelOptions::close_linger (10 s), for room; a receiver that does not read for
  /// that long gets PeerDied after the values sent before, instead of end-of-stream.
  void close() { end_.close(); }
  /// Releases this process's copy of the end without ending the stream; use it in a
  /// forked child that does not use this end, so that the peer can see its death, or in
  /// the process that handed the end to a forked worker (spawn does): the receiver's
  /// returns are then the worker's, and what this process sent stays pinned until the
  /// receiver exits. (InProcess: no effect; the stream ends when the Sender is closed or
  /// destroyed.)
  void detach() noexcept { end_.detach(); }
  /// Makes the calling process the end's owner (whose destructor closes the stream); from
  /// then on the process that owned it before is refused (EndOwnedElsewhere). No effect
  /// on an end its owner closed.
  void adopt() noexcept { end_.adopt(); }
  bool is_open() const noexcept { return end_.is_open(); }
  /// The channel's transport; ChannelClosed for an empty end (moved from or default-constructed).
  Transport transport() const { return end_.transport(); }

  /// Delivery acknowledgements (Distributor and Broadcast use them). After
  /// track_delivery(), the receiver records on the connection's return board every
  /// message its recv() returns (the next message sent carries the board if none went
  /// yet); an InProcess channel counts what its receiver took without being asked.
  void track_delivery() { end_.track_delivery(); }
  /// The sequence number of the last message sent: messages count from 1 (0: none).
  std::uint64_t last_sequence() { return end_.last_sequence(); }
  /// The receiver's recv() has returned every message up to this sequence number (0:
  /// none, or delivery not tracked). Keeps its last value once the receiver is gone.
  std::uint64_t delivered() { return end_.delivered(); }
  /// True when the receiving end is known to be gone (closed, or every process that held
  /// it exited), or this end is closed; one poll() without waiting. (A transport that
  /// cannot tell answers false; its next send raises ChannelClosed.)
  bool receiver_gone() { return end_.receiver_gone(); }

  /// The pool of an isolated channel (ChannelOptions::pool): allocate tensors for this
  /// peer from it to send them without a copy. Empty for a channel without isolation (and
  /// for an InProcess channel, whose values are moved, never serialized).
  std::optional<SharedAllocator> pool() const { return end_.pool(); }

 private:
  friend struct detail::EndAccess;  // ferry's own code reaches the core through it

  // The untyped core (transports, spawn, fan-outs). Throws Error for an InProcess Sender,
  // which has none, and ChannelClosed for an empty one.
  detail::SenderCore& core() { return end_.core(); }
  // The return board whose resolved word is delivered() as this end's receiver writes
  // it (ReturnBoard::resolved(); no lock, no system call), once the first message went
  // after track_delivery(); null before, and for ends whose transport has no board
  // (InProcess, Ucx): ask delivered().
  std::shared_ptr<const detail::ReturnBoard> delivery_board() { return end_.delivery_board(); }
  // Asks the receiver to ring a doorbell (a shared futex word) once its recv() has
  // returned message `sequence`, for a fan-out that sleeps until a consumer has room
  // (see ReturnBoard::request_delivery_wake()); nullopt when the end cannot (InProcess,
  // closed, or no message sent yet). cancel_delivery_wake() withdraws the request.
  std::optional<detail::ReturnBoard::DeliveryWake> request_delivery_wake(std::uint64_t sequence) {
    return end_.request_delivery_wake(sequence);
  }
  void cancel_delivery_wake() { end_.cancel_delivery_wake(); }

  // An InProcess end moves a copy of (or `value` itself) into the queue; the others frame it.
  template <class V>
  bool send_until(V&& value, const detail::Deadline& deadline) {
    if (!end_.is_local()) return end_.send(&value, detail::sent_type<T>, deadline);
    if constexpr (std::is_same_v<V, T>) {
      return end_.send_local(&value, &detail::make_parcel<T>, deadline);
    } else {
      T copy(value);
      return end_.send_local(&copy, &detail::make_parcel<T>, deadline);
    }
  }

  detail::SenderEnd end_;
};

/// The receiving end of a channel of T. Move-only; use it from one thread at a time.
/// It belongs to one process, as a Sender does.
template <class T>
class Receiver {
 public:
  Receiver() = default;
  /// The typed end over an untyped one (channel<T>() makes them).
  explicit Receiver(detail::ReceiverEnd end) noexcept : end_(std::move(end)) {}

  /// Waits for the next value; std::nullopt once the sender closed the stream, and also
  /// after this end's own close() (where a closed Sender's send() throws instead). Throws
  /// PeerDied when the sender vanished without closing, ProtocolError for a bad frame
  /// (TypeMismatch when the sender sends another type).
  std::optional<T> recv() {
    std::optional<T> value;
    receive_into(value, detail::Deadline::never());
    return value;
  }
  /// Waits at most `timeout` for the next value (any std::chrono::duration; one too long
  /// for nanoseconds, such as milliseconds::max(), waits for ever instead of wrapping).
  RecvResult<T> recv_for(Timeout timeout) { return receive(detail::Deadline::after(timeout)); }
  /// Takes a value if one is ready, without waiting.
  RecvResult<T> try_recv() { return receive(detail::Deadline::now()); }
  /// Closes this end; the sender's next send() raises ChannelClosed. (A forked child that
  /// inherited the end and does not use it, or the process that handed it to one, lets go
  /// of its copy with detach() instead: on a duplex socket close() ends the stream for
  /// every process.)
  void close() noexcept { end_.close(); }
  /// Closes this process's copy of the end, for a process that handed the end to a
  /// forked worker (spawn does this) or a forked child that does not use it: unlike
  /// close(), what this process received so far is never given back to the sender from
  /// here (the worker inherited it and may still use it); the sender keeps it until every
  /// process holding it has exited.
  void detach() noexcept { end_.detach(); }
  /// Makes the calling process the end's owner: it alone may receive (the process that
  /// owned it before is refused with EndOwnedElsewhere), and its destructor closes the end
  /// for every process (matters on a duplex socket only; elsewhere the last copy closing does).
  void adopt() noexcept { end_.adopt(); }
  bool is_open() const noexcept { return end_.is_open(); }
  /// The channel's transport; ChannelClosed for an empty end (moved from or default-constructed).
  Transport transport() const { return end_.transport(); }

 private:
  friend class Selector;            // waits on end_'s core or queue
  friend struct detail::EndAccess;  // ferry's own code reaches the core through it

  // The untyped core (transports, spawn). Throws Error for an InProcess Receiver, which
  // has none, and ChannelClosed for an empty one.
  detail::ReceiverCore& core() { return end_.core(); }

  RecvResult<T> receive(const detail::Deadline& deadline) {
    RecvResult<T> result;
    result.status_ = receive_into(result.value_, deadline);
    return result;
  }
  // Receives the next value into `out` (left empty unless a value arrived).
  ReadStatus receive_into(std::optional<T>& out, const detail::Deadline& deadline) {
    if (end_.is_local()) {
      std::unique_ptr<detail::Parcel> parcel;
      const ReadStatus status = end_.receive_local(parcel, deadline);
      // Both ends were made for T by channel<T>(): every parcel holds a T.
      if (status == ReadStatus::Frame) out.emplace(std::move(static_cast<detail::ParcelOf<T>&>(*parcel).value));
      return status;
    }
    out.emplace();
    const ReadStatus status = end_.receive(&*out, detail::received_type<T>, deadline);
    if (status != ReadStatus::Frame) out.reset();
    return status;
  }

  detail::ReceiverEnd end_;
};

namespace detail {
/// The typed ends over one transport end (channel() and duplex() make them).
template <class T>
Sender<T> sender_over(std::unique_ptr<FrameWriter> writer, Transport transport, const ChannelOptions& options,
                      pid_t peer_pid = 0) {
  return Sender<T>(sender_end_over(std::move(writer), transport, options, peer_pid));
}
template <class T>
Receiver<T> receiver_over(std::unique_ptr<FrameReader> reader, Transport transport, const ChannelOptions& options,
                          pid_t peer_pid = 0) {
  return Receiver<T>(
      receiver_end_over(std::move(reader), transport, type_fingerprint<T>(), type_name<T>(), options, peer_pid));
}
}  // namespace detail

/// Creates a connected Sender/Receiver pair over `transport`. Hand one end to another
/// process (fork, or ferry::spawn) and keep the other; an InProcess pair stays in this
/// process (hand one end to another thread).
template <class T>
std::pair<Sender<T>, Receiver<T>> channel(Transport transport, const ChannelOptions& options = {}) {
  auto ends = detail::make_channel_ends(transport, options, detail::type_fingerprint<T>(), detail::type_name<T>());
  return {Sender<T>(std::move(ends.first)), Receiver<T>(std::move(ends.second))};
}

}  // namespace ferry
