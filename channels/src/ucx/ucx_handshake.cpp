#include "ucx_handshake.hpp"

#include <sodium.h>

#include <cstdlib>
#include <vector>

#include "ferry/detail/thread_annotations.hpp"
#include "ferry/error.hpp"

namespace ferry::ucx::detail {

std::string shared_secret(const EndpointOptions& options, std::string_view address, bool listening) {
  if (!options.secret.empty()) return options.secret;
  if (const char* from_env = std::getenv("FERRY_SECRET"); from_env != nullptr && *from_env != '\0') return from_env;
  if (options.allow_no_secret) return {};
  throw Error(std::string(listening ? "refusing to listen at \"" : "refusing to connect to \"") + std::string(address) +
              "\" without a shared secret: without one, anyone who can reach the port could connect, and a client "
              "would talk to whoever answers. Set EndpointOptions::secret (or FERRY_SECRET) to the same long random "
              "text on the listener and its clients; EndpointOptions::allow_no_secret = true accepts the risk");
}

SecretKey client_key(const std::string& secret, const Salt& salt) {
  struct Entry {
    std::array<unsigned char, 32> secret_hash;
    Salt salt;
    SecretKey key;
  };
  // One derivation at a time (each takes 64 MiB and a fifth of a second): clients that
  // connect at once to one listener wait for the first one's key instead of each deriving
  // it (64 at once would need 4 GiB and outlast their connect timeout).
  static ferry::detail::Mutex mutex;
  static std::vector<Entry> cache;  // the most recent few
  constexpr std::size_t kKept = 8;
  std::array<unsigned char, 32> hash{};
  crypto_generichash(hash.data(), hash.size(), reinterpret_cast<const unsigned char*>(secret.data()), secret.size(),
                     nullptr, 0);
  const ferry::detail::MutexLock lock(mutex);
  for (const Entry& entry : cache) {
    if (entry.secret_hash == hash && entry.salt == salt) return entry.key;
  }
  const SecretKey key = derive_key(secret, salt);
  if (cache.size() == kKept) cache.erase(cache.begin());
  cache.push_back(Entry{hash, salt, key});
  return key;
}

FrameLimits client_handshake(UcxConnection& connection, const EndKind& kind, const FrameLimits& limits,
                             const std::string& secret, const ferry::detail::Deadline& deadline) {
  const std::string where = "ucx://" + connection.peer_address();
  ClientHandshake machine(where, kind, limits, random_nonce(),
                          [&secret](const Salt& salt) { return client_key(secret, salt); });
  while (!machine.done()) {
    const auto message = connection.receive_control(deadline);
    if (!message) throw Error("the listener at " + where + " did not complete the handshake before the timeout");
    const Bytes reply = machine.receive(*message);
    // The listener may send frames right behind its Verdict: the connection takes them only
    // once the Verdict proved the secret, checked as it arrives.
    if (machine.awaiting_verdict()) connection.authenticate_if(machine.verdict_check());
    if (!reply.empty()) connection.send_control(reply);
  }
  if (!connection.authenticated()) {
    throw UntrustedPeer("the listener at " + where + " accepted this client without proving the shared secret");
  }
  return machine.listener_limits();
}

ServerHandshake::ServerHandshake(UcxConnection& connection, const SecretKey& key, const Salt& salt)
    : connection_(connection), machine_(key, salt, random_nonce()) {
  connection_.send_control(machine_.hello());
}

std::optional<EndKind> ServerHandshake::poll() {
  std::optional<std::vector<std::byte>> bytes;
  try {
    bytes = connection_.poll_control();
  } catch (const ProtocolError& error) {
    throw Error(std::string("garbage instead of a handshake: ") + error.what());
  }
  if (!bytes) return std::nullopt;
  ListenerHandshake::Step step = machine_.receive(*bytes);
  if (!step.reply.empty()) connection_.send_control(step.reply);
  if (!step.refused.empty()) throw Error(step.refused);
  return std::move(step.claim);
}

void ServerHandshake::accept(const FrameLimits& limits) {
  connection_.authenticate();  // the client proved the secret; its frames follow the Verdict
  connection_.send_control(machine_.accept(limits));
}

void ServerHandshake::refuse(Outcome outcome, const std::string& reason) {
  try {
    connection_.send_control(ListenerHandshake::refuse(outcome, reason));
  } catch (const Error&) {
    // The client is gone already: nobody to tell.
  }
}

}  // namespace ferry::ucx::detail
