// Duplex connections: two processes that both send and receive (requests and replies,
// work and results) over one connection, created as a connected pair by duplex<A, B>().
#pragma once

#include <chrono>
#include <optional>
#include <utility>

#include "ferry/channel.hpp"

namespace ferry {

/// One end of a duplex connection: sends Out to the other end and receives In from it.
/// The two halves are an ordinary Sender<Out> and Receiver<In> (public, so that either can
/// be handed to spawn() or moved elsewhere on its own) with the semantics of a channel's
/// ends; over a Unix socket they share one socketpair, which makes a request/reply round
/// trip one connection's worth of wake-ups instead of two.
///
/// Closing one half ends only its direction, for every process (the other end's recv()
/// sees end-of-stream, or its send() raises ChannelClosed) while the other direction goes
/// on. A process that forks and gives an end to the child lets go of its own copy with
/// detach() (spawn() does this), not close(): close() ends the stream for the child too.
template <class Out, class In>
class DuplexEnd {
 public:
  DuplexEnd() = default;
  /// Joins two halves (for example, the ones a spawned worker received).
  DuplexEnd(Sender<Out> sender_half, Receiver<In> receiver_half)
      : sender(std::move(sender_half)), receiver(std::move(receiver_half)) {}

  /// Sends `value` to the other end (Sender::send).
  void send(const Out& value) { sender.send(value); }
  void send(Out&& value) { sender.send(std::move(value)); }
  /// Waits for the next value from the other end; std::nullopt once it closed its sending
  /// half (Receiver::recv).
  std::optional<In> recv() { return receiver.recv(); }
  /// Waits at most `timeout` for the next value (Receiver::recv_for).
  RecvResult<In> recv_for(Timeout timeout) { return receiver.recv_for(timeout); }
  /// Takes a value if one is ready, without waiting (Receiver::try_recv).
  RecvResult<In> try_recv() { return receiver.try_recv(); }
  /// Sends `request` and waits for the other end's next value: one round trip. Returns
  /// std::nullopt when the other end closed its sending half instead of replying.
  std::optional<In> call(const Out& request) {
    sender.send(request);
    return receiver.recv();
  }
  /// Like call(), but waits at most `timeout` in all (for room to send the request, then
  /// for the reply), like recv_for(): the result has_value() with the reply, timed_out()
  /// when the time ran out, closed() when the other end closed its sending half instead
  /// of replying. A timed-out call has sent its request unless the transport stayed full
  /// the whole time; a reply that comes late is not dropped: the next recv(), call() or
  /// call_for() returns it, ahead of the reply to a later request. After a timeout, take
  /// it with recv()/recv_for() before calling again, or put a request id in the messages.
  RecvResult<In> call_for(const Out& request, Timeout timeout) {
    const detail::Deadline deadline = detail::Deadline::after(timeout);
    const auto left = [&]() -> Timeout { return deadline.is_never() ? timeout : Timeout(deadline.remaining()); };
    if (!sender.send_for(request, left()) || !sender.flush(left())) {
      return RecvResult<In>(ReadStatus::Timeout, std::nullopt);
    }
    return receiver.recv_for(left());
  }
  /// Ends both directions: the other end sees end-of-stream after what was sent, and its
  /// later sends raise ChannelClosed.
  void close() {
    try {
      sender.close();
    } catch (...) {
      receiver.close();  // the receiving half ends too, whatever the sending half reported
      throw;
    }
    receiver.close();
  }
  /// Lets go of this process's copy of both halves without ending anything (a process that
  /// handed the end to a forked worker; see Sender::detach and Receiver::detach).
  void detach() noexcept {
    sender.detach();
    receiver.detach();
  }
  /// Makes the calling process the owner of both halves (a forked worker that took the end
  /// over): its destructors end the stream, as close() does.
  void adopt() noexcept {
    sender.adopt();
    receiver.adopt();
  }
  bool is_open() const noexcept { return sender.is_open() || receiver.is_open(); }

  Sender<Out> sender;
  Receiver<In> receiver;
};

/// Creates a connected pair of duplex ends over `transport`: the first sends A and
/// receives B, the second sends B and receives A. Over Transport::UnixSocket both
/// directions share one socketpair; over Pipe and ShmRing each direction is a transport of
/// its own (a pipe is one-way; a ring per direction never waits for the other's room);
/// InProcess gives two queues. `options` apply to both directions.
template <class A, class B>
std::pair<DuplexEnd<A, B>, DuplexEnd<B, A>> duplex(Transport transport, const ChannelOptions& options = {}) {
  detail::DuplexEnds ends =
      detail::make_duplex_ends(transport, options, detail::type_fingerprint<A>(), detail::type_name<A>(),
                               detail::type_fingerprint<B>(), detail::type_name<B>());
  return {DuplexEnd<A, B>(Sender<A>(std::move(ends.a_sender)), Receiver<B>(std::move(ends.a_receiver))),
          DuplexEnd<B, A>(Sender<B>(std::move(ends.b_sender)), Receiver<A>(std::move(ends.b_receiver)))};
}

}  // namespace ferry
