// The untyped half of endpoints (endpoint.hpp): what a client declares it holds, the
// listener's accept queue, and connecting. Listener and connect_* are thin typed
// wrappers around these.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/detail/deadline.hpp"
#include "ferry/detail/frame_channel.hpp"
#include "ferry/detail/live_ends.hpp"
#include "ferry/detail/transport.hpp"
#include "ferry/detail/type_name.hpp"
#include "ferry/detail/unique_fd.hpp"
#include "ferry/peer_credentials.hpp"

namespace ferry {
struct EndpointOptions;
}

namespace ferry::detail {

/// The end a client holds; the listener's end is its opposite.
enum class ClientEnd : std::uint8_t { Receiver = 1, Sender = 2, Duplex = 3 };

/// What a client connects as: its end and the message types it sends and receives (a
/// fingerprint of 0 and an empty name where it does not send, or does not receive).
/// Two kinds match when end and fingerprints agree; names only serve messages.
struct EndKind {
  ClientEnd end = ClientEnd::Receiver;
  std::uint64_t sends = 0;
  std::uint64_t receives = 0;
  std::string sends_name;
  std::string receives_name;

  bool matches(const EndKind& other) const noexcept {
    return end == other.end && sends == other.sends && receives == other.receives;
  }
  /// The client's end as a user writes it: "Receiver<Batch>", "DuplexEnd<Request, Reply>".
  std::string describe() const;
};

template <class T>
EndKind client_receiver_kind() {
  return EndKind{ClientEnd::Receiver, 0, type_fingerprint<T>(), {}, std::string(type_name<T>())};
}
template <class T>
EndKind client_sender_kind() {
  return EndKind{ClientEnd::Sender, type_fingerprint<T>(), 0, std::string(type_name<T>()), {}};
}
template <class Out, class In>
EndKind client_duplex_kind() {  // the client sends Out and receives In
  return EndKind{ClientEnd::Duplex, type_fingerprint<Out>(), type_fingerprint<In>(), std::string(type_name<Out>()),
                 std::string(type_name<In>())};
}

/// The transport ends of one connection, for this process's side: a writer when this side
/// sends, a reader when it receives, and the options each typed end is built with (the
/// sender's limits are the peer's receiving limits, which the peer enforces).
struct ConnectionEnds {
  Transport transport = Transport::UnixSocket;
  std::unique_ptr<FrameWriter> writer;
  std::unique_ptr<FrameReader> reader;
  ChannelOptions sender_options;
  ChannelOptions receiver_options;
  PeerCredentials peer;
};

/// A listener, whatever its scheme: the handshakes in progress (side by side, each with
/// its own deadline) and the clients that completed theirs, oldest first. All work happens
/// inside accept() and pump(), in the calling thread: no thread of its own. Use from one
/// thread at a time. A forked worker (spawn) drops its inherited copy
/// (LiveEnd::abandon_in_child) without touching what the parent's copy holds (a socket
/// file, UCX state). Listener wraps one; Selector drives it through pump().
class ListenerCore : public LiveEnd {
 public:
  /// Why a listener refused a client, as introspection counts it.
  enum class Refusal : std::uint8_t {
    NotAllowed,         ///< EndpointOptions::allowed_peers
    VersionMismatch,    ///< another endpoint wire version
    TypeMismatch,       ///< a kind of end the listener does not serve
    TransportMismatch,  ///< another transport
    Malformed,          ///< not a ferry hello, or a broken one
    HandshakeTimeout,   ///< no complete hello within EndpointOptions::handshake_timeout
    Unavailable,        ///< too many clients, or the listener out of descriptors
    ClientLeft,         ///< the client went away before it was accepted
  };
  static constexpr std::size_t kRefusals = 8;
  /// "not_allowed", "version_mismatch", ...
  static const char* refusal_name(Refusal refusal) noexcept;

  virtual ~ListenerCore() = default;
  /// The address clients connect to (for ucx://, with the port actually bound).
  virtual const std::string& address() const noexcept = 0;
  /// Adds `kind` to the kinds served: clients of it wait for accept() instead of being refused.
  virtual void serve(const EndKind& kind) = 0;
  /// Takes the oldest client of `kind` (serving the kind first), or waits for one until
  /// `deadline`; std::nullopt when none came. Throws SystemError when this side's ends of
  /// an accepted client cannot be made (out of descriptors; the listener goes on).
  virtual std::optional<ConnectionEnds> accept(const EndKind& kind, const Deadline& deadline) = 0;
  /// Accepts new connections and advances handshakes until `deadline` or until something
  /// happened; returns whether a client is waiting.
  virtual bool pump(const Deadline& deadline) = 0;
  /// True when a client of a served kind completed its handshake and waits for accept().
  virtual bool has_waiting_client() const noexcept = 0;
  /// Appends the descriptors to poll for progress (POLLIN) to `fds`.
  virtual void append_poll_fds(std::vector<pollfd>& fds) const = 0;
  /// The earliest deadline of a handshake in progress (Deadline::never() when none; now
  /// when progress is due without a descriptor reporting it).
  virtual Deadline next_deadline() const = 0;
  /// Closes the listening socket (removing its file) and every waiting connection.
  virtual void close() noexcept = 0;
  virtual bool is_open() const noexcept = 0;
  /// Handshakes in progress (for tests).
  virtual std::size_t pending_count() const noexcept = 0;
  /// Appends the listener's figures to out.listeners (see LiveEnd::describe()).
  void describe(Snapshot& out) const override;

 protected:
  ListenerCore() = default;
  // Counters for introspection: written by the thread inside accept() or pump(), read by
  // any thread.
  void count_accepted() noexcept;
  void count_refusal(Refusal refusal) noexcept;
  void publish_pending(std::size_t pending) noexcept { pending_now_.store(pending, std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> accepted_{0};
  std::array<std::atomic<std::uint64_t>, kRefusals> refused_{};
  std::atomic<std::size_t> pending_now_{0};
};

/// A stream-socket scheme's listening socket (scheme_registry.hpp makes them).
class ListeningPoint;
struct AcceptedSocket;
class RefusalLog;

/// The listener of a scheme whose connections are stream sockets that pass fds (unix:):
/// the scheme's listening socket, the endpoint handshake (handshake.hpp) on each new
/// connection, and the accept queue. What a crowd of clients can hold is bounded
/// (EndpointOptions::max_pending_handshakes, max_waiting_connections); out of descriptors,
/// a reserved one takes the connections off the backlog to refuse them, so the listener
/// never stops expiring handshakes and noticing clients that left.
class StreamListenerCore final : public ListenerCore {
 public:
  StreamListenerCore(std::unique_ptr<ListeningPoint> point, std::string address, const EndpointOptions& options);
  ~StreamListenerCore() override;

  const std::string& address() const noexcept override { return address_; }
  void serve(const EndKind& kind) override;
  std::optional<ConnectionEnds> accept(const EndKind& kind, const Deadline& deadline) override;
  bool pump(const Deadline& deadline) override;
  bool has_waiting_client() const noexcept override { return !ready_.empty(); }
  void append_poll_fds(std::vector<pollfd>& fds) const override;
  Deadline next_deadline() const override;
  void close() noexcept override;
  void abandon_in_child() noexcept override;
  bool is_open() const noexcept override { return point_ != nullptr; }
  std::size_t pending_count() const noexcept override { return pending_.size(); }

 private:
  struct Pending;
  struct Waiting;
  void accept_new_connections();
  // Starts the handshake of a new connection (or refuses it).
  void admit(AcceptedSocket accepted);
  // Out of descriptors: takes one connection off the backlog with the reserved descriptor
  // and refuses it. False when there is no reserve to do it with.
  bool shed_one();
  // Reads what arrived on `pending`; true when it is finished (queued or dropped).
  bool advance(Pending& pending);
  void drop_expired();
  // Sends a refusal (the reason, or `told` when the client should learn less), reports
  // the reason and closes the connection.
  void refuse(AcceptedSocket& connection, std::uint8_t status, const std::string& reason, const std::string& told = {},
              std::optional<Refusal> counted_as = std::nullopt);
  void report(const PeerCredentials& peer, const std::string& reason);
  std::string served_kinds() const;
  // Builds this side's ends for `waiting` and sends the client its reply; std::nullopt
  // when the client is gone.
  std::optional<ConnectionEnds> complete(Waiting& waiting);

  std::unique_ptr<ListeningPoint> point_;
  std::string address_;
  std::unique_ptr<EndpointOptions> options_;
  pid_t owner_;
  std::vector<EndKind> served_;
  std::vector<std::unique_ptr<Pending>> pending_;
  std::deque<std::unique_ptr<Waiting>> ready_;
  std::unique_ptr<RefusalLog> log_;                   // stderr, when options_->on_refusal is empty
  UniqueFd reserve_;                                  // freed to refuse a connection when out of descriptors
  Deadline accept_paused_until_ = Deadline::never();  // out of descriptors, no reserve
};

/// Connects to `address` as a client of `kind`: waits for the listener to appear, checks
/// its credentials, handshakes and builds this side's ends. Throws as connect_* documents.
ConnectionEnds connect_endpoint(std::string_view address, const EndKind& kind, const EndpointOptions& options);

/// The channel options of an accepted or connected end: `options` with an isolated pool
/// (ChannelOptions::pool) replaced by a new one of the same settings, one per connection.
ChannelOptions per_connection_options(const ChannelOptions& options);

}  // namespace ferry::detail
