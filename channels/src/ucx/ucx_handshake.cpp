#include "ucx_handshake.hpp"

#include <sodium.h>

#include <cstdlib>
#include <cstring>

#include "ferry/detail/frame.hpp"
#include "ferry/error.hpp"
#include "ferry/peer_credentials.hpp"

namespace ferry::ucx::detail {
namespace {

struct Hello {
  std::uint32_t magic = kHandshakeMagic;
  std::uint16_t version = kHandshakeVersion;
  std::uint16_t frame_version = kFrameVersion;
  std::array<unsigned char, 32> nonce{};
};
// Both sides are ferry builds of the same version on little-endian hosts (x86-64,
// aarch64): integers travel native-endian, as in the unix: handshake.
struct WireLimits {
  std::uint64_t max_body_bytes = 0;
  std::uint32_t max_handles = 0;
  std::uint32_t max_segments = 0;
  std::uint32_t max_fds = 0;
  std::uint32_t max_releases = 0;
  std::uint32_t max_type_name_bytes = 0;
  std::uint32_t reserved = 0;
};
struct Claim {
  std::uint32_t magic = kHandshakeMagic;
  std::uint16_t version = kHandshakeVersion;
  std::uint16_t frame_version = kFrameVersion;
  std::uint8_t end = 0;
  std::uint8_t reserved[3] = {};
  std::uint32_t sends_name_bytes = 0;
  std::uint32_t receives_name_bytes = 0;
  std::uint32_t reserved2 = 0;
  std::uint64_t sends = 0;
  std::uint64_t receives = 0;
  WireLimits limits;
  std::array<unsigned char, 32> nonce{};
  std::array<unsigned char, crypto_auth_BYTES> mac{};
};
struct Verdict {
  std::uint32_t magic = kHandshakeMagic;
  std::uint8_t outcome = 0;
  std::uint8_t reserved[3] = {};
  std::uint32_t reason_bytes = 0;
  std::uint32_t reserved2 = 0;
  WireLimits limits;
  std::array<unsigned char, crypto_auth_BYTES> mac{};
};

WireLimits to_wire(const FrameLimits& limits) {
  return WireLimits{limits.max_body_bytes, limits.max_handles, limits.max_segments, limits.max_fds,
                    limits.max_releases, limits.max_type_name_bytes, 0};
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
constexpr std::size_t kMaxTypeName = 4096;
constexpr std::size_t kMaxReason = 4096;

void start_sodium() {
  static const int started = sodium_init();
  if (started < 0) throw Error("libsodium failed to start (sodium_init)");
}

template <class Message>
std::vector<std::byte> pack(const Message& message, std::string_view tail) {
  std::vector<std::byte> bytes(sizeof message + tail.size());
  std::memcpy(bytes.data(), &message, sizeof message);
  if (!tail.empty()) std::memcpy(bytes.data() + sizeof message, tail.data(), tail.size());
  return bytes;
}

template <class Message>
std::optional<Message> unpack(const std::vector<std::byte>& bytes) {
  if (bytes.size() < sizeof(Message)) return std::nullopt;
  Message message;
  std::memcpy(&message, bytes.data(), sizeof message);
  if (message.magic != kHandshakeMagic) return std::nullopt;
  return message;
}

// The bytes a claim's MAC covers: the listener's nonce, the claim (its MAC zeroed) and the
// type names.
std::vector<unsigned char> claim_text(const std::array<unsigned char, 32>& listener_nonce, Claim claim,
                                      std::string_view names) {
  static constexpr std::string_view label = "ferry-ucx-claim";
  claim.mac.fill(0);
  std::vector<unsigned char> text(label.begin(), label.end());
  text.insert(text.end(), listener_nonce.begin(), listener_nonce.end());
  const auto* fixed = reinterpret_cast<const unsigned char*>(&claim);
  text.insert(text.end(), fixed, fixed + sizeof claim);
  text.insert(text.end(), names.begin(), names.end());
  return text;
}

// The bytes the listener's MAC covers (without allocating: checked inside a UCX callback).
constexpr std::string_view kAcceptLabel = "ferry-ucx-accept";
constexpr std::size_t accept_text_bytes = kAcceptLabel.size() + 32 + 32 + sizeof(WireLimits);
void accept_text(const std::array<unsigned char, 32>& client_nonce, const std::array<unsigned char, 32>& listener_nonce,
                 const WireLimits& limits, unsigned char (&text)[accept_text_bytes]) noexcept {
  unsigned char* out = text;
  std::memcpy(out, kAcceptLabel.data(), kAcceptLabel.size());
  out += kAcceptLabel.size();
  std::memcpy(out, client_nonce.data(), 32);
  out += 32;
  std::memcpy(out, listener_nonce.data(), 32);
  out += 32;
  std::memcpy(out, &limits, sizeof limits);
}

constexpr const char* kSecretAdvice = " (set the same EndpointOptions::secret, or FERRY_SECRET, on both sides)";

std::string version_text(std::uint16_t handshake, std::uint16_t frame) {
  return "ucx handshake " + std::to_string(handshake) + ", frame version " + std::to_string(frame);
}

}  // namespace

SecretKey derive_key(const std::string& secret) {
  start_sodium();
  std::string text = secret;
  if (text.empty()) {
    if (const char* from_env = std::getenv("FERRY_SECRET")) text = from_env;
  }
  SecretKey key;
  key.configured = !text.empty();
  static constexpr std::string_view label = "ferry ucx secret";
  crypto_generichash(key.key.data(), key.key.size(), reinterpret_cast<const unsigned char*>(text.data()), text.size(),
                     reinterpret_cast<const unsigned char*>(label.data()), label.size());
  return key;
}

FrameLimits client_handshake(UcxConnection& connection, const EndKind& kind, const FrameLimits& limits,
                             const SecretKey& key, const Deadline& deadline) {
  start_sodium();
  const std::string where = "ucx://" + connection.peer_address();
  const auto hello_bytes = connection.receive_control(deadline);
  if (!hello_bytes) throw Error("the listener at " + where + " sent no handshake before the connect timeout");
  const auto hello = unpack<Hello>(*hello_bytes);
  if (!hello) throw ProtocolError("the listener at " + where + " is not a ferry ucx:// listener (bad handshake)");
  if (hello->version != kHandshakeVersion || hello->frame_version != kFrameVersion) {
    throw Error("the listener at " + where + " speaks " + version_text(hello->version, hello->frame_version) +
                "; this build speaks " + version_text(kHandshakeVersion, kFrameVersion) +
                ": build both sides from the same ferry");
  }
  Claim claim;
  claim.end = static_cast<std::uint8_t>(kind.end);
  claim.sends = kind.sends;
  claim.receives = kind.receives;
  const std::string sends_name = kind.sends_name.substr(0, kMaxTypeName);
  const std::string receives_name = kind.receives_name.substr(0, kMaxTypeName);
  claim.sends_name_bytes = static_cast<std::uint32_t>(sends_name.size());
  claim.receives_name_bytes = static_cast<std::uint32_t>(receives_name.size());
  claim.limits = to_wire(limits);
  randombytes_buf(claim.nonce.data(), claim.nonce.size());
  const std::string names = sends_name + receives_name;
  const auto text = claim_text(hello->nonce, claim, names);
  crypto_auth(claim.mac.data(), text.data(), text.size(), key.key.data());
  // The listener may send frames right behind its verdict: the connection takes them only
  // once the verdict proved the secret, checked as it arrives.
  connection.authenticate_if([key, client_nonce = claim.nonce, listener_nonce = hello->nonce](
                                 std::span<const std::byte> bytes) noexcept {
    Verdict verdict;
    if (bytes.size() != sizeof verdict) return false;
    std::memcpy(&verdict, bytes.data(), sizeof verdict);
    if (verdict.magic != kHandshakeMagic || verdict.outcome != static_cast<std::uint8_t>(Outcome::Accepted)) {
      return false;
    }
    unsigned char text[accept_text_bytes];
    accept_text(client_nonce, listener_nonce, verdict.limits, text);
    return crypto_auth_verify(verdict.mac.data(), text, sizeof text, key.key.data()) == 0;
  });
  connection.send_control(pack(claim, names));

  const auto verdict_bytes = connection.receive_control(deadline);
  if (!verdict_bytes) throw Error("the listener at " + where + " did not answer the handshake before the timeout");
  const auto verdict = unpack<Verdict>(*verdict_bytes);
  if (!verdict || verdict->reason_bytes != verdict_bytes->size() - sizeof(Verdict)) {
    throw ProtocolError("the listener at " + where + " sent a malformed handshake answer");
  }
  const std::string reason(reinterpret_cast<const char*>(verdict_bytes->data() + sizeof(Verdict)),
                           verdict->reason_bytes);
  switch (static_cast<Outcome>(verdict->outcome)) {
    case Outcome::Accepted: {
      if (!connection.authenticated()) {
        throw UntrustedPeer("the listener at " + where +
                            " accepted this client without proving the shared secret: it is not the listener "
                            "this process expects" + kSecretAdvice);
      }
      return from_wire(verdict->limits);
    }
    case Outcome::TypeMismatch:
      throw TypeMismatch("the listener at " + where + " refused this " + kind.describe() + ": " + reason);
    case Outcome::WrongSecret:
      throw UntrustedPeer("the listener at " + where + " refused this client: " + reason + kSecretAdvice);
    case Outcome::Version:
    case Outcome::Garbage: throw Error("the listener at " + where + " refused this client: " + reason);
  }
  throw ProtocolError("the listener at " + where + " sent an unknown handshake outcome");
}

ServerHandshake::ServerHandshake(UcxConnection& connection, const SecretKey& key) : connection_(connection), key_(key) {
  start_sodium();
  Hello hello;
  randombytes_buf(listener_nonce_.data(), listener_nonce_.size());
  hello.nonce = listener_nonce_;
  connection_.send_control(pack(hello, {}));
}

std::optional<EndKind> ServerHandshake::poll() {
  std::optional<std::vector<std::byte>> bytes;
  try {
    bytes = connection_.poll_control();
  } catch (const ProtocolError& error) {
    throw Error(std::string("garbage instead of a handshake: ") + error.what());
  }
  if (!bytes) return std::nullopt;
  const auto claim = unpack<Claim>(*bytes);
  if (!claim || claim->sends_name_bytes > kMaxTypeName || claim->receives_name_bytes > kMaxTypeName ||
      std::size_t{claim->sends_name_bytes} + claim->receives_name_bytes != bytes->size() - sizeof(Claim)) {
    refuse(Outcome::Garbage, "the client's handshake is malformed");
    throw Error("a client sent a malformed handshake (not a ferry ucx:// client)");
  }
  if (claim->version != kHandshakeVersion || claim->frame_version != kFrameVersion) {
    const std::string reason = "the listener speaks " + version_text(kHandshakeVersion, kFrameVersion) +
                               ", the client " + version_text(claim->version, claim->frame_version) +
                               ": build both sides from the same ferry";
    refuse(Outcome::Version, reason);
    throw Error("refused a client: " + reason);
  }
  const std::string names(reinterpret_cast<const char*>(bytes->data() + sizeof(Claim)),
                          bytes->size() - sizeof(Claim));
  const auto text = claim_text(listener_nonce_, *claim, names);
  if (crypto_auth_verify(claim->mac.data(), text.data(), text.size(), key_.key.data()) != 0) {
    refuse(Outcome::WrongSecret, "it did not prove the listener's shared secret");
    throw Error("refused a client that did not prove the shared secret (wrong or missing secret)");
  }
  if (claim->end < static_cast<std::uint8_t>(ferry::detail::ClientEnd::Receiver) ||
      claim->end > static_cast<std::uint8_t>(ferry::detail::ClientEnd::Duplex)) {
    refuse(Outcome::Garbage, "unknown end");
    throw Error("refused a client that declared an unknown end");
  }
  client_nonce_ = claim->nonce;
  client_limits_ = from_wire(claim->limits);
  EndKind kind;
  kind.end = static_cast<ferry::detail::ClientEnd>(claim->end);
  kind.sends = claim->sends;
  kind.receives = claim->receives;
  kind.sends_name = names.substr(0, claim->sends_name_bytes);
  kind.receives_name = names.substr(claim->sends_name_bytes);
  return kind;
}

void ServerHandshake::accept(const FrameLimits& limits) {
  Verdict verdict;
  verdict.outcome = static_cast<std::uint8_t>(Outcome::Accepted);
  verdict.limits = to_wire(limits);
  unsigned char proof[accept_text_bytes];
  accept_text(client_nonce_, listener_nonce_, verdict.limits, proof);
  crypto_auth(verdict.mac.data(), proof, sizeof proof, key_.key.data());
  connection_.authenticate();  // the client proved the secret; its frames follow the verdict
  connection_.send_control(pack(verdict, {}));
}

void ServerHandshake::refuse(Outcome outcome, const std::string& reason) {
  Verdict verdict;
  verdict.outcome = static_cast<std::uint8_t>(outcome);
  const std::string text = reason.substr(0, kMaxReason);
  verdict.reason_bytes = static_cast<std::uint32_t>(text.size());
  try {
    connection_.send_control(pack(verdict, text));
  } catch (const Error&) {
    // The client is gone already: nobody to tell.
  }
}

}  // namespace ferry::ucx::detail
