// The untyped halves of Sender<T> and Receiver<T>: everything an end does that does not
// depend on its value type, compiled once in the library. An end is either a frame end
// (a SenderCore or ReceiverCore over a transport) or an in-process end (a share of an
// InProcessQueue), or empty; the typed ends add only the conversions of their values.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>

#include "ferry/channel_options.hpp"
#include "ferry/detail/deadline.hpp"
#include "ferry/detail/erased_body.hpp"
#include "ferry/detail/return_board.hpp"

namespace ferry::detail {

class FrameWriter;
class FrameReader;

class SenderCore;
class ReceiverCore;
class InProcessQueue;
class LiveEnd;
class Parcel;
struct SelectorMember;

/// Makes the parcel that carries the value at `value` (a T, moved from) through an
/// in-process queue; make_parcel<T> (in_process_channel.hpp) is the one for T.
using MakeParcel = std::unique_ptr<Parcel> (*)(void* value);

/// The sending end without its value type. Move-only; empty after a move. Destroying it
/// ends the stream as Sender<T> documents (an in-process end: PeerDied for the receiver
/// when destroyed while an exception unwinds the stack).
class SenderEnd {
 public:
  SenderEnd() noexcept;
  explicit SenderEnd(std::unique_ptr<SenderCore> core) noexcept;
  explicit SenderEnd(std::shared_ptr<InProcessQueue> queue) noexcept;
  SenderEnd(SenderEnd&&) noexcept;
  SenderEnd& operator=(SenderEnd&&) noexcept;
  ~SenderEnd();

  /// True for the end of a Transport::InProcess channel.
  bool is_local() const noexcept { return queue_ != nullptr; }
  /// Sends the value at `value` as a frame (a frame end only).
  bool send(const void* value, const SentType& type, const Deadline& deadline);
  /// Moves the value at `value` into the in-process queue once there is room (`make` is
  /// called only then); false, the value untouched, when `deadline` passed first.
  bool send_local(void* value, MakeParcel make, const Deadline& deadline);
  bool flush(const Deadline& deadline);
  void close();
  void detach() noexcept;
  void adopt() noexcept;
  bool is_open() const noexcept;
  Transport transport() const;
  void track_delivery();
  std::uint64_t last_sequence();
  std::uint64_t delivered();
  std::shared_ptr<const ReturnBoard> delivery_board();
  std::optional<ReturnBoard::DeliveryWake> request_delivery_wake(std::uint64_t sequence);
  void cancel_delivery_wake();
  bool receiver_gone();
  std::optional<SharedAllocator> pool() const;
  /// The frame core; throws Error for an in-process end and ChannelClosed for an empty one.
  SenderCore& core();

 private:
  std::unique_ptr<SenderCore> core_;
  std::shared_ptr<InProcessQueue> queue_;
};

/// The receiving end without its value type. Move-only; empty after a move. Destroying it
/// closes it.
class ReceiverEnd {
 public:
  ReceiverEnd() noexcept;
  explicit ReceiverEnd(std::unique_ptr<ReceiverCore> core) noexcept;
  explicit ReceiverEnd(std::shared_ptr<InProcessQueue> queue) noexcept;
  ReceiverEnd(ReceiverEnd&&) noexcept;
  ReceiverEnd& operator=(ReceiverEnd&&) noexcept;
  ~ReceiverEnd();

  /// True for the end of a Transport::InProcess channel.
  bool is_local() const noexcept { return queue_ != nullptr; }
  /// Reads the next frame's value into the T at `out` (a frame end only).
  ReadStatus receive(void* out, const ReceivedType& type, const Deadline& deadline);
  /// Takes the next parcel from the in-process queue, waiting until `deadline`.
  ReadStatus receive_local(std::unique_ptr<Parcel>& out, const Deadline& deadline);
  void close() noexcept;
  void detach() noexcept;
  void adopt() noexcept;
  bool is_open() const noexcept;
  Transport transport() const;
  /// What a Selector waits on for this end (empty for an empty end).
  SelectorMember selector_member() const noexcept;
  /// The frame core; throws Error for an in-process end and ChannelClosed for an empty one.
  ReceiverCore& core();

 private:
  std::unique_ptr<ReceiverCore> core_;
  std::shared_ptr<InProcessQueue> queue_;
};

/// The untyped ends over one transport end (sender_over<T>() and receiver_over<T>() wrap them).
/// `peer_pid`: the process at the other end when known (an endpoint's handshake), for
/// introspection; 0 when not.
SenderEnd sender_end_over(std::unique_ptr<FrameWriter> writer, Transport transport, const ChannelOptions& options,
                          pid_t peer_pid = 0);
ReceiverEnd receiver_end_over(std::unique_ptr<FrameReader> reader, Transport transport, std::uint64_t fingerprint,
                              std::string_view type_name, const ChannelOptions& options, pid_t peer_pid = 0);

/// Both ends of a new channel over `transport` (InProcess included), whose receiver
/// accepts the type of `fingerprint` / `type_name` (channel<T>() passes T's).
std::pair<SenderEnd, ReceiverEnd> make_channel_ends(Transport transport, const ChannelOptions& options,
                                                    std::uint64_t fingerprint, std::string_view type_name);

/// The four ends of a new duplex connection (duplex<A, B>() makes its DuplexEnds of them):
/// side A sends A's type and receives B's, side B the other way round.
struct DuplexEnds {
  SenderEnd a_sender;
  ReceiverEnd a_receiver;
  SenderEnd b_sender;
  ReceiverEnd b_receiver;
};
DuplexEnds make_duplex_ends(Transport transport, const ChannelOptions& options, std::uint64_t a_fingerprint,
                            std::string_view a_type_name, std::uint64_t b_fingerprint, std::string_view b_type_name);

/// A frame core as the process-wide registry of live ends sees it (spawn keeps a forked
/// worker's own ends alive and abandons the others), and whether it ever moved a frame.
const LiveEnd* as_live_end(SenderCore& core) noexcept;
const LiveEnd* as_live_end(ReceiverCore& core) noexcept;
bool core_used(const SenderCore& core) noexcept;
bool core_used(const ReceiverCore& core) noexcept;

/// What the fan-outs (Distributor, Broadcast) send through: SenderCore's
/// send_serialized_by_owner() and flush(), without the end's own lock (the fan-out's lock
/// serializes its ends), reachable where the frame core's class is not.
bool send_by_owner(SenderCore& core, const void* message, const SentType& type, const Deadline& deadline);
bool flush_by_owner(SenderCore& core, const Deadline& deadline);

/// How ferry's own code (spawn, fan-outs, end descriptions, Selector, tests) reaches the
/// untyped core of a typed end: Sender, Receiver and Listener keep core() and the delivery
/// board private and befriend this struct, so that a user's code never names them.
struct EndAccess {
  template <class End>
  static auto& core(End& end) {
    return end.core();
  }
  template <class End>
  static auto delivery_board(End& end) {
    return end.delivery_board();
  }
  template <class End>
  static auto request_delivery_wake(End& end, std::uint64_t sequence) {
    return end.request_delivery_wake(sequence);
  }
  template <class End>
  static void cancel_delivery_wake(End& end) {
    end.cancel_delivery_wake();
  }
};

}  // namespace ferry::detail
