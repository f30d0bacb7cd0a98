#include "ucx_handshake_wire.hpp"

#include <sodium.h>

#include <cstring>
#include <utility>

#include "ferry/error.hpp"

namespace ferry::ucx::detail {
namespace {

static_assert(sizeof(Salt) == crypto_pwhash_SALTBYTES);
static_assert(crypto_auth_hmacsha512256_BYTES == 32 && crypto_auth_hmacsha512256_KEYBYTES == 32);
using Mac = std::array<unsigned char, 32>;

// Both sides are ferry builds of the same version on little-endian hosts (x86-64,
// aarch64): integers travel native-endian, as in the unix: handshake.
struct Versions {
  std::uint32_t magic = kHandshakeMagic;
  std::uint16_t version = kHandshakeVersion;
  std::uint16_t frame_version = ferry::detail::kFrameVersion;
};
struct HelloWire {
  Versions versions;
  Salt salt{};
  Nonce nonce{};
};
struct ChallengeWire {
  Versions versions;
  Nonce nonce{};
};
struct ProofWire {
  std::uint32_t magic = kHandshakeMagic;
  std::uint32_t reserved = 0;
  Mac mac{};
};
struct WireLimits {
  std::uint64_t max_body_bytes = 0;
  std::uint32_t max_handles = 0;
  std::uint32_t max_segments = 0;
  std::uint32_t max_fds = 0;
  std::uint32_t max_releases = 0;
  std::uint32_t max_type_name_bytes = 0;
  std::uint32_t reserved = 0;
};
struct ClaimWire {
  std::uint32_t magic = kHandshakeMagic;
  std::uint8_t end = 0;
  std::uint8_t reserved[3] = {};
  std::uint32_t sends_name_bytes = 0;
  std::uint32_t receives_name_bytes = 0;
  std::uint64_t sends = 0;
  std::uint64_t receives = 0;
  WireLimits limits;
  Mac mac{};
};
struct VerdictWire {
  std::uint32_t magic = kHandshakeMagic;
  std::uint8_t outcome = 0;
  std::uint8_t reserved[3] = {};
  std::uint32_t reason_bytes = 0;
  std::uint32_t reserved2 = 0;
  WireLimits limits;
  Mac mac{};
};

WireLimits to_wire(const FrameLimits& limits) {
  return WireLimits{limits.max_body_bytes,
                    limits.max_handles,
                    limits.max_segments,
                    limits.max_fds,
                    limits.max_releases,
                    limits.max_type_name_bytes,
                    0};
}
FrameLimits from_wire(const WireLimits& wire) {
  FrameLimits limits;
  limits.max_body_bytes = wire.max_body_bytes;
  limits.max_handles = wire.max_handles;
  limits.max_segments = wire.max_segments;
  limits.max_fds = wire.max_fds;
  limits.max_releases = wire.max_releases;
  limits.max_type_name_bytes = wire.max_type_name_bytes;
  return limits;
}

void start_sodium() {
  static const int started = sodium_init();
  if (started < 0) throw Error("libsodium failed to start (sodium_init)");
}

template <class Message>
Bytes pack(const Message& message, std::string_view tail = {}) {
  Bytes bytes(sizeof message + tail.size());
  std::memcpy(bytes.data(), &message, sizeof message);
  if (!tail.empty()) std::memcpy(bytes.data() + sizeof message, tail.data(), tail.size());
  return bytes;
}

// The fixed part of a message of at least its size (nullopt: shorter).
template <class Message>
std::optional<Message> fixed_part(std::span<const std::byte> bytes) noexcept {
  if (bytes.size() < sizeof(Message)) return std::nullopt;
  Message message;
  std::memcpy(&message, bytes.data(), sizeof message);
  return message;
}

// HMAC-SHA-512-256 under `key` of a label, both nonces (listener's first), and `parts`.
Mac mac_of(const SecretKey& key, std::string_view label, const Nonce& listener_nonce, const Nonce& client_nonce,
           std::initializer_list<std::span<const unsigned char>> parts) noexcept {
  crypto_auth_hmacsha512256_state state;
  crypto_auth_hmacsha512256_init(&state, key.key.data(), key.key.size());
  crypto_auth_hmacsha512256_update(&state, reinterpret_cast<const unsigned char*>(label.data()), label.size());
  crypto_auth_hmacsha512256_update(&state, listener_nonce.data(), listener_nonce.size());
  crypto_auth_hmacsha512256_update(&state, client_nonce.data(), client_nonce.size());
  for (const auto& part : parts) crypto_auth_hmacsha512256_update(&state, part.data(), part.size());
  Mac mac{};
  crypto_auth_hmacsha512256_final(&state, mac.data());
  sodium_memzero(&state, sizeof state);
  return mac;
}
bool same_mac(const Mac& a, const Mac& b) noexcept { return sodium_memcmp(a.data(), b.data(), a.size()) == 0; }

template <class T>
std::span<const unsigned char> bytes_of(const T& value) noexcept {
  return {reinterpret_cast<const unsigned char*>(&value), sizeof value};
}
std::span<const unsigned char> bytes_of(std::string_view text) noexcept {
  return {reinterpret_cast<const unsigned char*>(text.data()), text.size()};
}

constexpr std::string_view kListenerLabel = "ferry-ucx-listener-proof";
constexpr std::string_view kClaimLabel = "ferry-ucx-claim";
constexpr std::string_view kAcceptLabel = "ferry-ucx-accept";

Mac claim_mac(const SecretKey& key, const Nonce& listener_nonce, const Nonce& client_nonce, ClaimWire claim,
              std::string_view names) noexcept {
  claim.mac.fill(0);
  return mac_of(key, kClaimLabel, listener_nonce, client_nonce, {bytes_of(claim), bytes_of(names)});
}
Mac accept_mac(const SecretKey& key, const Nonce& listener_nonce, const Nonce& client_nonce,
               const WireLimits& limits) noexcept {
  return mac_of(key, kAcceptLabel, listener_nonce, client_nonce, {bytes_of(limits)});
}

std::string version_text(std::uint16_t handshake, std::uint16_t frame) {
  return "ucx handshake " + std::to_string(handshake) + ", frame version " + std::to_string(frame);
}
bool same_versions(const Versions& versions) noexcept {
  return versions.version == kHandshakeVersion && versions.frame_version == ferry::detail::kFrameVersion;
}

constexpr const char* kSecretAdvice = " (set the same EndpointOptions::secret, or FERRY_SECRET, on both sides)";

}  // namespace

SecretKey derive_key(std::string_view secret, const Salt& salt) {
  start_sodium();
  SecretKey key;
  if (crypto_pwhash(key.key.data(), key.key.size(), secret.data(), secret.size(), salt.data(),
                    crypto_pwhash_OPSLIMIT_INTERACTIVE, crypto_pwhash_MEMLIMIT_INTERACTIVE,
                    crypto_pwhash_ALG_ARGON2ID13) != 0) {
    throw Error("deriving the ucx:// key from the shared secret failed (crypto_pwhash needs 64 MiB of memory)");
  }
  return key;
}

Nonce random_nonce() {
  start_sodium();
  Nonce nonce;
  randombytes_buf(nonce.data(), nonce.size());
  return nonce;
}

Salt random_salt() {
  start_sodium();
  Salt salt;
  randombytes_buf(salt.data(), salt.size());
  return salt;
}

// ---- listener ------------------------------------------------------------------

ListenerHandshake::ListenerHandshake(const SecretKey& key, const Salt& salt, const Nonce& nonce)
    : key_(key), salt_(salt), listener_nonce_(nonce) {}

Bytes ListenerHandshake::hello() const {
  HelloWire hello;
  hello.salt = salt_;
  hello.nonce = listener_nonce_;
  return pack(hello);
}

ListenerHandshake::Step ListenerHandshake::refusal(Outcome outcome, std::string reason) {
  state_ = State::Done;
  Step step;
  step.reply = refuse(outcome, outcome == Outcome::WrongSecret ? "it did not prove the listener's shared secret"
                                                               : std::string_view(reason));
  step.refused = std::move(reason);
  return step;
}

ListenerHandshake::Step ListenerHandshake::receive(std::span<const std::byte> message) {
  switch (state_) {
    case State::Challenge: {
      const auto versions = fixed_part<Versions>(message);
      if (!versions || versions->magic != kHandshakeMagic) {
        return refusal(Outcome::Garbage, "a client sent a malformed handshake (not a ferry ucx:// client)");
      }
      if (!same_versions(*versions)) {
        return refusal(Outcome::Version,
                       "the listener speaks " + version_text(kHandshakeVersion, ferry::detail::kFrameVersion) +
                           ", the client " + version_text(versions->version, versions->frame_version) +
                           ": build both sides from the same ferry");
      }
      const auto challenge = fixed_part<ChallengeWire>(message);
      if (!challenge || message.size() != sizeof(ChallengeWire)) {
        return refusal(Outcome::Garbage, "a client sent a malformed handshake challenge");
      }
      client_nonce_ = challenge->nonce;
      state_ = State::Claim;
      ProofWire proof;
      proof.mac = mac_of(key_, kListenerLabel, listener_nonce_, client_nonce_, {});
      return Step{pack(proof), std::nullopt, {}};
    }
    case State::Claim: {
      const auto claim = fixed_part<ClaimWire>(message);
      if (!claim || claim->magic != kHandshakeMagic || claim->sends_name_bytes > kMaxTypeName ||
          claim->receives_name_bytes > kMaxTypeName ||
          std::size_t{claim->sends_name_bytes} + claim->receives_name_bytes != message.size() - sizeof(ClaimWire)) {
        return refusal(Outcome::Garbage, "a client sent a malformed handshake claim");
      }
      const std::string_view names(reinterpret_cast<const char*>(message.data() + sizeof(ClaimWire)),
                                   message.size() - sizeof(ClaimWire));
      if (!same_mac(claim->mac, claim_mac(key_, listener_nonce_, client_nonce_, *claim, names))) {
        return refusal(Outcome::WrongSecret,
                       "refused a client that did not prove the shared secret (wrong or missing secret)");
      }
      if (claim->end < static_cast<std::uint8_t>(ferry::detail::ClientEnd::Receiver) ||
          claim->end > static_cast<std::uint8_t>(ferry::detail::ClientEnd::Duplex)) {
        return refusal(Outcome::Garbage, "refused a client that declared an unknown end");
      }
      state_ = State::Done;
      client_limits_ = from_wire(claim->limits);
      EndKind kind;
      kind.end = static_cast<ferry::detail::ClientEnd>(claim->end);
      kind.sends = claim->sends;
      kind.receives = claim->receives;
      kind.sends_name = std::string(names.substr(0, claim->sends_name_bytes));
      kind.receives_name = std::string(names.substr(claim->sends_name_bytes));
      return Step{{}, std::move(kind), {}};
    }
    case State::Done: break;
  }
  return refusal(Outcome::Garbage, "a client sent a handshake message after its handshake ended");
}

Bytes ListenerHandshake::accept(const FrameLimits& limits) const {
  VerdictWire verdict;
  verdict.outcome = static_cast<std::uint8_t>(Outcome::Accepted);
  verdict.limits = to_wire(limits);
  verdict.mac = accept_mac(key_, listener_nonce_, client_nonce_, verdict.limits);
  return pack(verdict);
}

Bytes ListenerHandshake::refuse(Outcome outcome, std::string_view reason) {
  VerdictWire verdict;
  verdict.outcome = static_cast<std::uint8_t>(outcome);
  const std::string_view text = reason.substr(0, kMaxReason);
  verdict.reason_bytes = static_cast<std::uint32_t>(text.size());
  return pack(verdict, text);
}

// ---- client --------------------------------------------------------------------

ClientHandshake::ClientHandshake(std::string where, EndKind kind, const FrameLimits& limits, const Nonce& nonce,
                                 std::function<SecretKey(const Salt&)> key_for)
    : where_(std::move(where)),
      kind_(std::move(kind)),
      limits_(limits),
      key_for_(std::move(key_for)),
      client_nonce_(nonce) {}

Bytes ClientHandshake::receive(std::span<const std::byte> message) {
  switch (state_) {
    case State::Hello: return on_hello(message);
    case State::Proof: return on_proof(message);
    case State::Verdict: on_verdict(message); return {};
    case State::Done: break;
  }
  throw ProtocolError("the listener at " + where_ + " sent a handshake message after the handshake ended");
}

Bytes ClientHandshake::on_hello(std::span<const std::byte> message) {
  const auto versions = fixed_part<Versions>(message);
  if (!versions || versions->magic != kHandshakeMagic) {
    throw ProtocolError("the listener at " + where_ + " is not a ferry ucx:// listener (bad handshake)");
  }
  if (!same_versions(*versions)) {
    throw Error("the listener at " + where_ + " speaks " + version_text(versions->version, versions->frame_version) +
                "; this build speaks " + version_text(kHandshakeVersion, ferry::detail::kFrameVersion) +
                ": build both sides from the same ferry");
  }
  const auto hello = fixed_part<HelloWire>(message);
  if (!hello || message.size() != sizeof(HelloWire)) {
    throw ProtocolError("the listener at " + where_ + " sent a malformed handshake");
  }
  listener_nonce_ = hello->nonce;
  key_ = key_for_(hello->salt);
  state_ = State::Proof;
  ChallengeWire challenge;
  challenge.nonce = client_nonce_;
  return pack(challenge);
}

Bytes ClientHandshake::on_proof(std::span<const std::byte> message) {
  const auto proof = fixed_part<ProofWire>(message);
  if (!proof || proof->magic != kHandshakeMagic || message.size() != sizeof(ProofWire)) {
    // A refusal Verdict (version, garbage) comes instead of a Proof: say what it says.
    on_verdict(message);
    throw ProtocolError("the listener at " + where_ + " sent a malformed handshake proof");
  }
  if (!same_mac(proof->mac, mac_of(key_, kListenerLabel, listener_nonce_, client_nonce_, {}))) {
    throw UntrustedPeer("the listener at " + where_ +
                        " did not prove the shared secret: it is not the listener this process expects" +
                        kSecretAdvice);
  }
  state_ = State::Verdict;
  ClaimWire claim;
  claim.end = static_cast<std::uint8_t>(kind_.end);
  claim.sends = kind_.sends;
  claim.receives = kind_.receives;
  const std::string_view sends_name = std::string_view(kind_.sends_name).substr(0, kMaxTypeName);
  const std::string_view receives_name = std::string_view(kind_.receives_name).substr(0, kMaxTypeName);
  claim.sends_name_bytes = static_cast<std::uint32_t>(sends_name.size());
  claim.receives_name_bytes = static_cast<std::uint32_t>(receives_name.size());
  claim.limits = to_wire(limits_);
  const std::string names = std::string(sends_name) + std::string(receives_name);
  claim.mac = claim_mac(key_, listener_nonce_, client_nonce_, claim, names);
  return pack(claim, names);
}

void ClientHandshake::on_verdict(std::span<const std::byte> message) {
  const auto verdict = fixed_part<VerdictWire>(message);
  if (!verdict || verdict->magic != kHandshakeMagic || verdict->reason_bytes > kMaxReason ||
      verdict->reason_bytes != message.size() - sizeof(VerdictWire)) {
    throw ProtocolError("the listener at " + where_ + " sent a malformed handshake answer");
  }
  const std::string reason(reinterpret_cast<const char*>(message.data() + sizeof(VerdictWire)), verdict->reason_bytes);
  switch (static_cast<Outcome>(verdict->outcome)) {
    case Outcome::Accepted:
      if (state_ != State::Verdict ||
          !same_mac(verdict->mac, accept_mac(key_, listener_nonce_, client_nonce_, verdict->limits))) {
        throw UntrustedPeer("the listener at " + where_ + " accepted this client without proving the shared secret" +
                            kSecretAdvice);
      }
      state_ = State::Done;
      listener_limits_ = from_wire(verdict->limits);
      return;
    case Outcome::TypeMismatch:
      throw TypeMismatch("the listener at " + where_ + " refused this " + kind_.describe() + ": " + reason);
    case Outcome::WrongSecret:
      throw UntrustedPeer("the listener at " + where_ + " refused this client: " + reason + kSecretAdvice);
    case Outcome::Version:
    case Outcome::Garbage: throw Error("the listener at " + where_ + " refused this client: " + reason);
  }
  throw ProtocolError("the listener at " + where_ + " sent an unknown handshake outcome");
}

std::function<bool(std::span<const std::byte>)> ClientHandshake::verdict_check() const {
  return [key = key_, listener_nonce = listener_nonce_,
          client_nonce = client_nonce_](std::span<const std::byte> message) noexcept {
    const auto verdict = fixed_part<VerdictWire>(message);
    return verdict && message.size() == sizeof(VerdictWire) && verdict->magic == kHandshakeMagic &&
           verdict->outcome == static_cast<std::uint8_t>(Outcome::Accepted) &&
           same_mac(verdict->mac, accept_mac(key, listener_nonce, client_nonce, verdict->limits));
  };
}

}  // namespace ferry::ucx::detail
