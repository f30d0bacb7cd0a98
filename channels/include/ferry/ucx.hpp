// Across hosts: ucx:// endpoints on UCX (library ferry_ucx, target ferry::ucx; built when
// FERRY_WITH_UCX finds libucx-dev and libsodium-dev). A listener on one host accepts
// clients from others; each accepted connection is an ordinary Sender<T> or Receiver<T>.
// Tensors travel as their bytes (there is no shared memory between hosts): the receiver's
// tensor is its own copy in Device::SharedCpu memory from its caching allocator, and its
// writes are not seen by the sender.
//
// ```cpp
// auto listener = ferry::ucx::listen("ucx://0.0.0.0:7000", {.secret = "..."});     // loader host
// ferry::Sender<Batch> tx = listener.accept_sender<Batch>();
// auto rx = ferry::ucx::connect_receiver<Batch>("ucx://10.0.0.5:7000", {.secret = "..."});  // trainer
// ```
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ferry/channel.hpp"
#include "ferry/detail/type_name.hpp"

namespace ferry::ucx {

/// TCP keepalive of UCX's connections: a peer whose host vanished (link down, power off)
/// is reported (PeerDied / ChannelClosed) after about idle + interval x count. UCX 1.13
/// takes these only from its environment when it starts (UCX_TCP_KEEPIDLE, _KEEPINTVL,
/// _KEEPCNT): the first ucx:// end of a process sets them unless the environment already
/// does, and later settings in the same process have no effect.
struct Keepalive {
  std::chrono::seconds idle{1};
  std::chrono::seconds interval{1};
  int count = 3;
};

/// Settings of listen() and connect_*().
struct Options {
  /// The shared secret both sides prove (challenge and response, keyed BLAKE2b/HMAC from
  /// libsodium); empty: the FERRY_SECRET environment variable. A listener on an address
  /// other than loopback refuses to start without one. Traffic is authenticated at
  /// connect, not encrypted.
  std::string secret;
  /// How long connect_*() waits in all (for the listener to appear and to accept).
  std::chrono::milliseconds connect_timeout{10'000};
  /// How long a listener waits for a connected client's handshake before dropping it.
  std::chrono::milliseconds handshake_timeout{5'000};
  Keepalive keepalive;
  /// The options of each connection's channel (limits, close_linger).
  ChannelOptions channel;
  /// Listener only: told why each refused or dropped client was; empty: one line on stderr.
  std::function<void(const std::string&)> on_refusal;
};

namespace detail {
/// The end a client connects as (the listener's end is the opposite one).
enum class Role : std::uint8_t { Receiver = 1, Sender = 2 };
struct Kind {
  Role role;
  std::uint64_t fingerprint;
  std::string_view type_name;
};
template <class T>
Kind kind_of(Role role) {
  return Kind{role, type_fingerprint<T>(), type_name<T>()};
}
/// A connection's end on this side: a writer (this side sends) or a reader.
struct Connected {
  std::unique_ptr<FrameWriter> writer;
  std::unique_ptr<FrameReader> reader;
  ChannelOptions channel;
};
class ListenerCore {
 public:
  virtual ~ListenerCore() = default;
  /// The oldest client that connected as `kind` and proved the secret, waiting until `deadline`.
  virtual std::optional<Connected> accept(const Kind& kind, const Deadline& deadline) = 0;
  /// Declares that clients of `kind` are served (they wait instead of being refused).
  virtual void serve(const Kind& kind) = 0;
  virtual const std::string& address() const = 0;
  virtual void close() noexcept = 0;
};
std::unique_ptr<ListenerCore> make_listener(std::string_view address, Options options);
Connected connect(std::string_view address, const Kind& kind, const Options& options);
}  // namespace detail

/// A listening ucx:// endpoint. Move-only. Handshakes make progress while this process is
/// inside accept_*(); each has its own deadline, so a silent or garbage-sending client
/// delays no other.
class Listener {
 public:
  Listener() = default;
  explicit Listener(std::unique_ptr<detail::ListenerCore> core) : core_(std::move(core)) {}

  /// Waits for a client that connects as Receiver<T>; returns this side's Sender<T>.
  template <class T>
  Sender<T> accept_sender() {
    return std::move(*accept_sender_for<T>(std::chrono::nanoseconds::max()));
  }
  template <class T>
  std::optional<Sender<T>> accept_sender_for(Timeout timeout) {
    auto ends = core().accept(detail::kind_of<T>(detail::Role::Receiver), Deadline::after(timeout));
    if (!ends) return std::nullopt;
    return ferry::detail::sender_over<T>(std::move(ends->writer), Transport::Ucx, ends->channel);
  }
  /// Waits for a client that connects as Sender<T>; returns this side's Receiver<T>.
  template <class T>
  Receiver<T> accept_receiver() {
    return std::move(*accept_receiver_for<T>(std::chrono::nanoseconds::max()));
  }
  template <class T>
  std::optional<Receiver<T>> accept_receiver_for(Timeout timeout) {
    auto ends = core().accept(detail::kind_of<T>(detail::Role::Sender), Deadline::after(timeout));
    if (!ends) return std::nullopt;
    return ferry::detail::receiver_over<T>(std::move(ends->reader), Transport::Ucx, ends->channel);
  }
  /// Declares kinds served before the first accept (see ferry::Listener).
  template <class T>
  void serve_sender() {
    core().serve(detail::kind_of<T>(detail::Role::Receiver));
  }
  template <class T>
  void serve_receiver() {
    core().serve(detail::kind_of<T>(detail::Role::Sender));
  }
  /// "ucx://HOST:PORT" with the port actually bound (port 0 picks a free one).
  const std::string& address() const {
    if (!core_) throw ChannelClosed("this ucx Listener is empty (moved from or default-constructed)");
    return core_->address();
  }
  /// Stops listening and drops the clients still waiting (accepted ends live on).
  void close() noexcept { core_.reset(); }
  bool is_open() const noexcept { return core_ != nullptr; }

 private:
  detail::ListenerCore& core() {
    if (!core_) throw ChannelClosed("this ucx Listener is closed (or moved from)");
    return *core_;
  }
  std::unique_ptr<detail::ListenerCore> core_;
};

/// Listens at "ucx://HOST:PORT" (HOST: an IPv4 or bracketed IPv6 literal, or a name;
/// 0.0.0.0 / [::] for every interface; PORT 0 picks a free port). Throws Error for a
/// malformed address, an address in use, or no secret on a non-loopback address.
inline Listener listen(std::string_view address, Options options = {}) {
  return Listener(detail::make_listener(address, std::move(options)));
}

/// Connects to the listener at "ucx://HOST:PORT" as a Receiver<T> (its accept_sender<T>).
/// Waits up to options.connect_timeout for the listener to appear and accept. Throws
/// TypeMismatch when it serves no Receiver<T>, Error when it refused the secret or the
/// version or did not answer in time.
template <class T>
Receiver<T> connect_receiver(std::string_view address, const Options& options = {}) {
  detail::Connected ends = detail::connect(address, detail::kind_of<T>(detail::Role::Receiver), options);
  return ferry::detail::receiver_over<T>(std::move(ends.reader), Transport::Ucx, ends.channel);
}

/// Connects as a Sender<T> (the listener's accept_receiver<T>); see connect_receiver.
template <class T>
Sender<T> connect_sender(std::string_view address, const Options& options = {}) {
  detail::Connected ends = detail::connect(address, detail::kind_of<T>(detail::Role::Sender), options);
  return ferry::detail::sender_over<T>(std::move(ends.writer), Transport::Ucx, ends.channel);
}

}  // namespace ferry::ucx
