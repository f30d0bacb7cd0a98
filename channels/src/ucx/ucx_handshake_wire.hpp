// The ucx:// handshake as pure state machines: bytes in, bytes out, no UCX (ucx_handshake.*
// drives them over a connection; the fuzz target ucx_handshake_fuzzer drives them with
// arbitrary bytes). Both sides prove the shared secret before either reveals anything
// about the channel, the listener first:
//
//   listener -> client   Hello     {magic, versions, the listener's salt, listener nonce}
//   client -> listener   Challenge {magic, versions, client nonce}
//   listener -> client   Proof     {MAC over both nonces}                  the listener proved
//   client -> listener   Claim     {end, fingerprints, limits, type names, MAC over both
//                                   nonces and the claim}                  the client proved
//   listener -> client   Verdict   {outcome, limits, reason; Accepted: MAC over both nonces
//                                   and the limits}
//
// The key is derived from the secret with a slow password hash (libsodium's crypto_pwhash,
// Argon2id, its "interactive" cost: 64 MiB and about 0.2 s here) and a salt the listener
// draws when it starts; MACs are HMAC-SHA-512-256 (crypto_auth). Until the Claim, nothing
// names a type, a limit or a fingerprint. What a peer without the secret still gets: a
// rogue listener, the client's Challenge (a nonce) and nothing else; a rogue client, the
// listener's Proof, one MAC under the key, which lets it guess the secret offline at the
// cost of one Argon2id hash per guess (so use a long random secret).
//
// Every message is checked for its exact size before it is read; a type name is at most
// kMaxTypeName bytes, a reason kMaxReason.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/detail/endpoint_core.hpp"
#include "ferry/detail/frame.hpp"

namespace ferry::ucx::detail {

inline constexpr std::uint32_t kHandshakeMagic = 0x55595246;  // "FRYU"
// 4: the listener proves the secret first; Argon2id key with the listener's salt.
inline constexpr std::uint16_t kHandshakeVersion = 4;
inline constexpr std::size_t kMaxTypeName = 4096;
inline constexpr std::size_t kMaxReason = 1024;

using ferry::detail::EndKind;
using Bytes = std::vector<std::byte>;
using Nonce = std::array<unsigned char, 32>;
using Salt = std::array<unsigned char, 16>;  // crypto_pwhash_SALTBYTES

/// The key both sides derive from the shared secret.
struct SecretKey {
  std::array<unsigned char, 32> key{};
};
/// crypto_pwhash (Argon2id, OPSLIMIT/MEMLIMIT_INTERACTIVE) of `secret` with `salt`. Throws
/// Error when libsodium cannot (out of memory).
SecretKey derive_key(std::string_view secret, const Salt& salt);
/// Random bytes (libsodium's randombytes_buf).
Nonce random_nonce();
Salt random_salt();

/// Why a listener refused a client.
enum class Outcome : std::uint8_t { Accepted = 1, WrongSecret = 2, TypeMismatch = 3, Version = 4, Garbage = 5 };

/// The listener's side of one connection.
class ListenerHandshake {
 public:
  ListenerHandshake(const SecretKey& key, const Salt& salt, const Nonce& nonce);
  /// The first message.
  Bytes hello() const;
  /// What one message from the client led to: `reply` to send (may be empty); `claim`
  /// once the client proved the secret (then accept() or refuse()); `refused` (not empty)
  /// when the client is refused: `reply` then tells it why, and the connection ends.
  struct Step {
    Bytes reply;
    std::optional<EndKind> claim;
    std::string refused;
  };
  Step receive(std::span<const std::byte> message);
  /// The Verdict that accepts the client (the listener enforces `limits` on what it receives).
  Bytes accept(const FrameLimits& limits) const;
  /// A Verdict that refuses it, saying `reason` (cut at kMaxReason).
  static Bytes refuse(Outcome outcome, std::string_view reason);
  /// The limits the client enforces on what it receives (once receive() returned its claim).
  const FrameLimits& client_limits() const noexcept { return client_limits_; }

 private:
  enum class State { Challenge, Claim, Done };
  Step refusal(Outcome outcome, std::string reason);
  State state_ = State::Challenge;
  SecretKey key_;
  Salt salt_;
  Nonce listener_nonce_;
  Nonce client_nonce_{};
  FrameLimits client_limits_;
};

/// The client's side. Errors are thrown in the caller's words, naming `where`
/// ("ucx://HOST:PORT"): UntrustedPeer (the listener did not prove the secret, or refused
/// this client's), TypeMismatch, Error (versions, other refusals), ProtocolError (not a
/// ferry listener, malformed messages).
class ClientHandshake {
 public:
  /// `key_for`: the key of this client's secret with a listener's salt (may be slow: cache it).
  ClientHandshake(std::string where, EndKind kind, const FrameLimits& limits, const Nonce& nonce,
                  std::function<SecretKey(const Salt&)> key_for);
  /// The reply to the listener's next message (empty after the Verdict: done()).
  Bytes receive(std::span<const std::byte> message);
  bool done() const noexcept { return state_ == State::Done; }
  /// True once the listener's Proof was checked (the next message is the Verdict).
  bool awaiting_verdict() const noexcept { return state_ == State::Verdict; }
  /// The limits the listener enforces on what it receives (once done()).
  const FrameLimits& listener_limits() const noexcept { return listener_limits_; }
  /// A check, noexcept and allocation-free, of whether a message is the Accepted Verdict
  /// proving the secret (for UcxConnection::authenticate_if; once awaiting_verdict()).
  std::function<bool(std::span<const std::byte>)> verdict_check() const;

 private:
  enum class State { Hello, Proof, Verdict, Done };
  Bytes on_hello(std::span<const std::byte> message);
  Bytes on_proof(std::span<const std::byte> message);
  void on_verdict(std::span<const std::byte> message);
  std::string where_;
  EndKind kind_;
  FrameLimits limits_;
  std::function<SecretKey(const Salt&)> key_for_;
  State state_ = State::Hello;
  SecretKey key_;
  Nonce client_nonce_;
  Nonce listener_nonce_{};
  FrameLimits listener_limits_;
};

}  // namespace ferry::ucx::detail
