// The handshake of a ucx:// connection, before any frame: the listener proves nothing
// about the network, so both sides prove that they know the shared secret by challenge
// and response (libsodium's crypto_auth, HMAC-SHA-512-256, keyed by a BLAKE2b hash of the
// secret), and the client declares its end (direction, type fingerprint and name), which
// the listener checks against the kinds it serves. The round trip also warms the endpoint
// up: UCX sends the first messages of a fresh endpoint eagerly (copied) even when large.
//
//   listener -> client   Hello   {magic, version, listener nonce}
//   client -> listener   Claim   {magic, version, end, fingerprints, limits, client nonce,
//                                 mac over the listener's nonce and the claim, type names}
//   listener -> client   Verdict {magic, outcome, limits, mac over both nonces and the
//                                 limits (Accepted), reason}
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/detail/deadline.hpp"
#include "ferry/detail/endpoint_core.hpp"
#include "ucx_connection.hpp"

namespace ferry::ucx::detail {

inline constexpr std::uint32_t kHandshakeMagic = 0x55595246;  // "FRYU"
// 3: readers report the delivery of tracked frames (AM id 4), which a fan-out relies on.
inline constexpr std::uint16_t kHandshakeVersion = 3;

/// What a client declares: ferry::detail::EndKind (its end, the types it sends and
/// receives), and the limits it enforces on what it receives.
using ferry::detail::EndKind;

/// The key both sides derive from the shared secret.
struct SecretKey {
  std::array<unsigned char, 32> key{};
  bool configured = false;  ///< false: no secret given (allowed on loopback only)
};
/// The key of `secret`, or of FERRY_SECRET when `secret` is empty.
SecretKey derive_key(const std::string& secret);

/// Why a listener refused a client.
enum class Outcome : std::uint8_t { Accepted = 1, WrongSecret = 2, TypeMismatch = 3, Version = 4, Garbage = 5 };

/// The client's side: proves the secret, declares `kind` and the limits it enforces,
/// checks the listener's proof; returns the listener's limits. Throws TypeMismatch,
/// UntrustedPeer (wrong secret, either way), Error (version, timeout), ChannelClosed when
/// the listener went away.
FrameLimits client_handshake(UcxConnection& connection, const EndKind& kind, const FrameLimits& limits,
                             const SecretKey& key, const Deadline& deadline);

/// The listener's side of one connection, driven without blocking so that a silent or
/// garbage-sending client delays no other one.
class ServerHandshake {
 public:
  /// Sends the challenge.
  ServerHandshake(UcxConnection& connection, const SecretKey& key);
  /// The client's claim once it arrived and proved the secret; nullopt while it has not
  /// arrived yet. Throws Error naming why the client is refused (after telling it).
  std::optional<EndKind> poll();
  /// The limits the client enforces on what it receives (once poll() returned its kind).
  const FrameLimits& client_limits() const noexcept { return client_limits_; }
  /// Tells the client it is accepted (with the listener's proof and `limits`, which the
  /// listener enforces) or refused.
  void accept(const FrameLimits& limits);
  void refuse(Outcome outcome, const std::string& reason);

 private:
  UcxConnection& connection_;
  SecretKey key_;
  std::array<unsigned char, 32> listener_nonce_{};
  std::array<unsigned char, 32> client_nonce_{};
  FrameLimits client_limits_;
};

}  // namespace ferry::ucx::detail
