// The handshake of a ucx:// connection, before any frame (the protocol and what it proves:
// ucx_handshake_wire.hpp), driven over a UcxConnection. The round trips also warm the
// endpoint up: UCX sends the first messages of a fresh endpoint eagerly (copied) even when
// large.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "ferry/detail/deadline.hpp"
#include "ferry/endpoint.hpp"
#include "ucx_connection.hpp"
#include "ucx_handshake_wire.hpp"

namespace ferry::ucx::detail {

/// The shared secret of `options` (or FERRY_SECRET when it is empty). Throws Error, naming
/// `address` and what to do, when there is none and options.allow_no_secret is false;
/// `listening` says which side asks (for the message).
std::string shared_secret(const EndpointOptions& options, std::string_view address, bool listening);

/// The key of `secret` with a listener's `salt`, derived once per process and kept (a
/// client that connects again to the same listener pays the slow hash once).
SecretKey client_key(const std::string& secret, const Salt& salt);

/// The client's side: both sides prove the secret, then the client declares `kind` and the
/// limits it enforces; returns the listener's limits. Throws TypeMismatch, UntrustedPeer
/// (wrong secret, either way), Error (version, timeout), ChannelClosed when the listener
/// went away.
FrameLimits client_handshake(UcxConnection& connection, const EndKind& kind, const FrameLimits& limits,
                             const std::string& secret, const ferry::detail::Deadline& deadline);

/// The listener's side of one connection, driven without blocking so that a silent or
/// garbage-sending client delays no other one.
class ServerHandshake {
 public:
  /// Sends the Hello (not waiting for it to leave).
  ServerHandshake(UcxConnection& connection, const SecretKey& key, const Salt& salt);
  /// The client's claim once it arrived and proved the secret; nullopt while it has not
  /// arrived yet. Throws Error naming why the client is refused (after telling it).
  std::optional<EndKind> poll();
  /// The limits the client enforces on what it receives (once poll() returned its kind).
  const FrameLimits& client_limits() const noexcept { return machine_.client_limits(); }
  /// Tells the client it is accepted (with the listener's proof and `limits`, which the
  /// listener enforces) or refused.
  void accept(const FrameLimits& limits);
  void refuse(Outcome outcome, const std::string& reason);

 private:
  UcxConnection& connection_;
  ListenerHandshake machine_;
};

}  // namespace ferry::ucx::detail
