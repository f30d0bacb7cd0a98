// Endpoints by address: processes started independently find each other through an
// address ("unix:@loader", "unix:/run/app/loader.sock") instead of inheriting channel ends
// from a common parent. A listener accepts clients; each accepted connection is an
// ordinary Sender<T>, Receiver<T> or DuplexEnd, as channel() makes them.
//
// ```cpp
// ferry::Listener listener = ferry::listen("unix:@loader");            // the serving process
// ferry::Sender<Batch> to_trainer = listener.accept_sender<Batch>();
// ferry::Receiver<Batch> from_loader = ferry::connect_receiver<Batch>("unix:@loader");  // another one
// ```
// Across hosts, the same calls take "ucx://HOST:PORT" in a program that links ferry::ucx.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/channel.hpp"
#include "ferry/detail/endpoint_core.hpp"
#include "ferry/duplex.hpp"
#include "ferry/error.hpp"
#include "ferry/peer_credentials.hpp"

namespace ferry {

/// A listener cannot take its address: a live listener holds it (never stolen).
class AddressInUse : public Error {
 public:
  using Error::Error;
};

/// Which peers may connect: a peer is allowed when its uid is in `uids` or its gid in
/// `gids` (as SO_PEERCRED reports them). By default only this process's own user. The
/// listener checks its clients; a client checks its listener the same way (anyone can take
/// an abstract name first).
struct AllowedPeers {
  std::vector<uid_t> uids = {::geteuid()};
  std::vector<gid_t> gids;
  bool allows(const PeerCredentials& peer) const;
  /// "user 1000" / "users 0, 1000 and group 100", for messages.
  std::string describe() const;
};

/// TCP keepalive of ucx:// connections: a peer whose host vanished (link down, power off)
/// is reported (PeerDied / ChannelClosed) after about idle + interval x count (5 s by
/// default). UCX 1.13 takes these only from its environment when it starts
/// (UCX_TCP_KEEPIDLE, UCX_TCP_KEEPINTVL, UCX_TCP_KEEPCNT): the first ucx:// end of a process
/// sets them unless the environment already does; later settings in that process have no
/// effect.
struct Keepalive {
  std::chrono::seconds idle{1};
  std::chrono::seconds interval{1};
  int count = 3;
};

/// Settings of listen() and connect_*().
struct EndpointOptions {
  /// How messages travel once connected. UnixSocket (the default): over the connection
  /// itself, tensors' segments as SCM_RIGHTS. ShmRing: the listener makes a shared ring per
  /// direction and passes it to the client over the connection. Pipe works the same way.
  /// Listener and client must agree; a client of another transport is refused. A ucx://
  /// address always travels over UCX (leave the default, or say Transport::Ucx).
  Transport transport = Transport::UnixSocket;
  /// How long connect_*() waits in all: for the listener to appear (start order does not
  /// matter), and for it to accept this client.
  std::chrono::milliseconds connect_timeout{10'000};
  /// How long a listener waits for a connected client's handshake before dropping it.
  std::chrono::milliseconds handshake_timeout{5'000};
  /// Who may connect (listener) and who may be listened to (client). unix: only (the
  /// kernel tells a Unix socket's peer; TCP has no peer credentials: ucx:// uses `secret`).
  AllowedPeers allowed_peers;
  /// ucx:// only: the shared secret both sides prove at connect, the listener first, before
  /// either tells the other anything about the channel (the key: Argon2id of the secret
  /// with a salt the listener draws; use a long random text). Empty: the FERRY_SECRET
  /// environment variable. Without either, listen and connect refuse (loopback too) unless
  /// allow_no_secret. Only the connect is authenticated: frames afterwards are neither
  /// encrypted nor authenticated (README, "Trust").
  std::string secret;
  /// Listener only: how many clients may be in their handshake at once (connected, not yet
  /// proved); bounds what silent or slow peers can hold. At least 1. unix: a connection
  /// beyond it whose Hello has not arrived with it is refused at once with Unavailable, and
  /// its client tries again until its connect_timeout. ucx://: a client beyond it drops the
  /// oldest pending one (each holds a UCX worker: about 12 fds and 4 MB), so a client that
  /// completes its handshake promptly still gets in.
  std::size_t max_pending_handshakes = 64;
  /// unix: listener only: at most this many clients of each kind served (accept_sender<T>'s,
  /// accept_receiver<U>'s, ...) that completed their handshake wait for their accept_*()
  /// (each holds a descriptor). One more is refused with Unavailable, and its client tries
  /// again until its connect_timeout. A waiting client that hangs up is dropped.
  std::size_t max_waiting_connections = 128;
  /// ucx:// only: true lets a listener or client run without a secret. It then gives
  /// away all access control: anyone who can reach the listener's port can connect as any
  /// client (the key of an empty secret is public), and a client talks to whoever answers
  /// at the address. For a trusted, isolated network only.
  bool allow_no_secret = false;
  /// ucx:// only: how soon a peer whose host vanished is noticed (see Keepalive).
  Keepalive keepalive;
  /// The options of each connection's channel (limits, ring size, timeouts, pool). A pool
  /// (ChannelOptions::pool) is copied per connection: each peer gets a new pool of the same
  /// settings. Limits: each side enforces its own on what it receives, and its peer's
  /// sender refuses messages above them.
  ChannelOptions channel;
  /// Listener only: told why each refused or dropped client was (type, version, user,
  /// transport, garbage, silence, a full queue, no descriptors left). Empty (the default):
  /// one line on stderr, at most 10 at once and then one a second (the lines left out are
  /// counted in the next), so that clients cannot flood the log.
  std::function<void(const std::string&)> on_refusal;
};

/// A listening endpoint. Move-only; destroying or closing it removes its socket file and
/// drops the clients still waiting (accepted ends live on). Handshakes make progress while
/// this process is inside accept_*() or a Selector wait that holds the listener; a client
/// waits (up to its connect_timeout) until then.
///
/// One listener serves several kinds of client: each accept_*<T> takes the oldest client
/// that connected as the matching end (accept_sender<T>: a client's connect_receiver<T>).
/// A client of a kind this listener was never asked for is refused at once with
/// TypeMismatch; declare kinds with serve_*() before the first accept when several kinds
/// connect (otherwise an early client of the second kind is refused).
class Listener {
 public:
  Listener() = default;
  explicit Listener(std::unique_ptr<detail::ListenerCore> core) : core_(std::move(core)) {}

  /// Waits for a client that connects as Receiver<T>; returns this side's Sender<T>.
  template <class T>
  Sender<T> accept_sender() {
    return std::move(*accept_sender_for<T>(std::chrono::nanoseconds::max()));
  }
  /// Like accept_sender(), waiting at most `timeout`; std::nullopt when no client came.
  template <class T>
  std::optional<Sender<T>> accept_sender_for(Timeout timeout) {
    auto ends = core().accept(detail::client_receiver_kind<T>(), detail::Deadline::after(timeout));
    if (!ends) return std::nullopt;
    return sender_of<T>(*ends);
  }
  /// Waits for a client that connects as Sender<T>; returns this side's Receiver<T>.
  template <class T>
  Receiver<T> accept_receiver() {
    return std::move(*accept_receiver_for<T>(std::chrono::nanoseconds::max()));
  }
  template <class T>
  std::optional<Receiver<T>> accept_receiver_for(Timeout timeout) {
    auto ends = core().accept(detail::client_sender_kind<T>(), detail::Deadline::after(timeout));
    if (!ends) return std::nullopt;
    return receiver_of<T>(*ends);
  }
  /// Waits for a client that connects as DuplexEnd<In, Out>; returns this side's
  /// DuplexEnd<Out, In> (sends Out, receives In).
  template <class Out, class In>
  DuplexEnd<Out, In> accept_duplex() {
    return std::move(*accept_duplex_for<Out, In>(std::chrono::nanoseconds::max()));
  }
  template <class Out, class In>
  std::optional<DuplexEnd<Out, In>> accept_duplex_for(Timeout timeout) {
    auto ends = core().accept(detail::client_duplex_kind<In, Out>(), detail::Deadline::after(timeout));
    if (!ends) return std::nullopt;
    return DuplexEnd<Out, In>(sender_of<Out>(*ends), receiver_of<In>(*ends));
  }

  /// Declares that clients for accept_sender<T>() are served (they wait instead of being
  /// refused), without accepting one now.
  template <class T>
  void serve_sender() {
    core().serve(detail::client_receiver_kind<T>());
  }
  template <class T>
  void serve_receiver() {
    core().serve(detail::client_sender_kind<T>());
  }
  template <class Out, class In>
  void serve_duplex() {
    core().serve(detail::client_duplex_kind<In, Out>());
  }

  /// The address clients connect to: as given to listen(), except that a ucx:// address
  /// names the port actually bound (port 0 picks a free one).
  const std::string& address() const { return const_core().address(); }
  /// Whether a client of a served kind completed its handshake and waits to be accepted.
  bool has_waiting_client() const noexcept { return core_ && core_->has_waiting_client(); }
  /// Stops listening: removes the socket file, drops waiting clients. Idempotent.
  void close() noexcept {
    if (core_) core_->close();
  }
  bool is_open() const noexcept { return core_ && core_->is_open(); }

 private:
  friend struct detail::EndAccess;  // Selector reaches the core through it

  // The untyped core (Selector uses it).
  detail::ListenerCore& core() {
    if (!core_ || !core_->is_open()) throw ChannelClosed("this Listener is closed (or moved from)");
    return *core_;
  }
  const detail::ListenerCore& const_core() const {
    if (!core_) throw ChannelClosed("this Listener is empty (moved from or default-constructed)");
    return *core_;
  }
  template <class T>
  static Sender<T> sender_of(detail::ConnectionEnds& ends) {
    return detail::sender_over<T>(std::move(ends.writer), ends.transport, ends.sender_options, ends.peer.pid);
  }
  template <class T>
  static Receiver<T> receiver_of(detail::ConnectionEnds& ends) {
    return detail::receiver_over<T>(std::move(ends.reader), ends.transport, ends.receiver_options, ends.peer.pid);
  }

  std::unique_ptr<detail::ListenerCore> core_;
};

/// Listens at `address`: "unix:PATH" (a socket file, created owner-only unless
/// options.allowed_peers admits others; removed when the listener closes; a stale file
/// left by a killed listener is replaced), "unix:@NAME" (Linux's abstract namespace:
/// nothing on disk), or, in a program that links ferry::ucx, "ucx://HOST:PORT" (across
/// hosts, on UCX; HOST an IPv4 address or a name, 0.0.0.0 for every interface (IPv6, in
/// brackets, is refused for now); PORT 0 picks a free one: address() tells which). Across
/// hosts each tensor's bytes travel: the receiver's tensor is its own copy (in
/// Device::SharedCpu memory), and its writes are not seen by the sender. Throws
/// AddressInUse when a live listener holds the address, Error for a malformed address,
/// an unknown scheme (naming the accepted forms), ucx:// without ferry::ucx (saying how to
/// get it), or ucx:// without a secret (unless options.allow_no_secret).
Listener listen(std::string_view address, const EndpointOptions& options = {});

/// Connects to the listener at `address` as a Receiver<T> (the listener's
/// accept_sender<T>). Waits up to options.connect_timeout for the listener to appear and
/// accept. Throws TypeMismatch when the listener serves no Receiver<T> clients,
/// UntrustedPeer when one side's user is not allowed by the other (unix:) or the secrets
/// differ (ucx://), Error for another refusal (wire version, transport) or the timeout,
/// PeerDied when the listener died.
template <class T>
Receiver<T> connect_receiver(std::string_view address, const EndpointOptions& options = {}) {
  detail::ConnectionEnds ends = detail::connect_endpoint(address, detail::client_receiver_kind<T>(), options);
  return detail::receiver_over<T>(std::move(ends.reader), ends.transport, ends.receiver_options, ends.peer.pid);
}

/// Connects as a Sender<T> (the listener's accept_receiver<T>); see connect_receiver.
template <class T>
Sender<T> connect_sender(std::string_view address, const EndpointOptions& options = {}) {
  detail::ConnectionEnds ends = detail::connect_endpoint(address, detail::client_sender_kind<T>(), options);
  return detail::sender_over<T>(std::move(ends.writer), ends.transport, ends.sender_options, ends.peer.pid);
}

/// Connects as a DuplexEnd<Out, In> (sends Out, receives In; the listener's
/// accept_duplex<In, Out>); see connect_receiver.
template <class Out, class In>
DuplexEnd<Out, In> connect_duplex(std::string_view address, const EndpointOptions& options = {}) {
  detail::ConnectionEnds ends = detail::connect_endpoint(address, detail::client_duplex_kind<Out, In>(), options);
  return DuplexEnd<Out, In>(
      detail::sender_over<Out>(std::move(ends.writer), ends.transport, ends.sender_options, ends.peer.pid),
      detail::receiver_over<In>(std::move(ends.reader), ends.transport, ends.receiver_options, ends.peer.pid));
}

}  // namespace ferry
