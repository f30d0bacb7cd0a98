// connect_*(): find the listener, check who it is, handshake, build this side's ends.
#include <sys/stat.h>

#include <algorithm>
#include <string>

#include "endpoints/address.hpp"
#include "endpoints/connection_ends.hpp"
#include "endpoints/handshake.hpp"
#include "endpoints/scheme_registry.hpp"
#include "ferry/endpoint.hpp"
#include "ferry/wait_interruption.hpp"

namespace ferry::detail {
namespace {

std::string milliseconds_text(std::chrono::milliseconds duration) { return std::to_string(duration.count()) + " ms"; }

// Whether the process `pid` (as SO_PEERCRED gives it: 0 when it is not visible from here)
// runs in this process's PID namespace. When /proc cannot tell, it is taken to.
bool in_this_pid_namespace(pid_t pid) {
  if (pid <= 0) return false;
  struct stat mine {};
  struct stat theirs {};
  if (::stat("/proc/self/ns/pid", &mine) != 0) return true;
  if (::stat(("/proc/" + std::to_string(pid) + "/ns/pid").c_str(), &theirs) != 0) return true;
  return mine.st_ino == theirs.st_ino && mine.st_dev == theirs.st_dev;
}

// Connects, retrying while nobody listens, until `deadline`.
UniqueFd reach_listener(const SocketScheme& scheme, std::string_view address, std::string_view rest,
                        const EndpointOptions& options, const Deadline& deadline) {
  std::chrono::microseconds pause{200};
  while (true) {
    if (UniqueFd fd = scheme.try_connect(address, rest)) return fd;
    if (deadline.expired()) {
      throw Error("no listener at " + std::string(address) + ": nothing accepted connections there within " +
                  milliseconds_text(options.connect_timeout) +
                  " (EndpointOptions::connect_timeout); start the listening process or check the address" +
                  (address.starts_with("unix:@")
                       ? std::string("; an abstract name (unix:@NAME) is reachable only in the listener's network "
                                     "namespace: from another container, use a unix:PATH in a directory both share")
                       : std::string()));
    }
    // Nothing to wait on but time: the listener's socket does not exist yet.
    interruptible_sleep_for(std::min<std::chrono::nanoseconds>(pause, deadline.remaining()));
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
  }
}

[[noreturn]] void throw_refusal(const Reply& reply) {
  switch (reply.status) {
    case ReplyStatus::TypeMismatch: throw TypeMismatch(reply.message);
    case ReplyStatus::NotAllowed: throw UntrustedPeer(reply.message);
    case ReplyStatus::Malformed: throw ProtocolError(reply.message);
    default: throw Error(reply.message);
  }
}

}  // namespace

ConnectionEnds connect_endpoint(std::string_view address, const EndKind& kind, const EndpointOptions& options) {
  const Address parsed = parse_address(address);
  const Scheme& scheme = scheme_of(address, parsed.scheme);
  if (options.transport == Transport::InProcess) {
    throw Error("an endpoint connects processes: Transport::InProcess cannot carry it (use UnixSocket or ShmRing)");
  }
  return scheme.connect(address, parsed.rest, kind, options);
}

std::unique_ptr<ListenerCore> SocketScheme::listen(std::string_view address, std::string_view rest,
                                                   const EndpointOptions& options) const {
  return std::make_unique<StreamListenerCore>(listen_point(address, rest, options), std::string(address), options);
}

namespace {

// One connection and handshake: this side's ends, or std::nullopt when the listener
// answered Unavailable (too busy, out of descriptors: worth another try), with its reply
// in `busy`. Throws for every other refusal and failure.
std::optional<ConnectionEnds> try_handshake(const SocketScheme& scheme, std::string_view address, std::string_view rest,
                                            const EndKind& kind, const EndpointOptions& options,
                                            const Deadline& deadline, Reply& busy) {
  UniqueFd connection = reach_listener(scheme, address, rest, options, deadline);
  const PeerCredentials listener = peer_credentials(connection.get());
  if (!options.allowed_peers.allows(listener)) {
    throw UntrustedPeer("the listener at " + std::string(address) + " (process " + std::to_string(listener.pid) +
                        ") runs as user " + std::to_string(listener.uid) + ", group " + std::to_string(listener.gid) +
                        "; this client admits only " + options.allowed_peers.describe() +
                        " (EndpointOptions::allowed_peers): refusing to connect");
  }
  // Holders of shared storages are known by their process ids (the return board), which
  // mean nothing in another PID namespace: a storage would be taken back while the peer
  // still reads it, or never.
  if (!in_this_pid_namespace(listener.pid)) {
    throw Error("the listener at " + std::string(address) +
                " runs in another PID namespace (another container): ferry tells which shared tensors a peer "
                "still holds by its process id, which means nothing across PID namespaces; run both in one PID "
                "namespace (docker run --pid=container:NAME or --pid=host, Kubernetes shareProcessNamespace)");
  }
  Hello hello;
  hello.kind = kind;
  hello.transport = options.transport;
  hello.limits = options.channel.limits;
  const std::string waiting_for = " within " + milliseconds_text(options.connect_timeout) +
                                  " (EndpointOptions::connect_timeout; it accepts clients only while it is inside "
                                  "accept_*() or a Selector wait)";
  std::vector<UniqueFd> fds;
  std::optional<std::vector<std::byte>> bytes;
  try {
    bool sent = false;
    try {
      sent = send_all(connection.get(), encode_hello(hello), deadline);
    } catch (const PeerDied&) {
      sent = true;  // refused at once (its user, say): the reply waits to be read
    }
    if (!sent) {
      throw Error("the listener at " + std::string(address) + " did not take this client's handshake" + waiting_for);
    }
    bytes = receive_message(connection.get(), kMaxReplyBytes, fds, deadline);
  } catch (const PeerDied&) {
    throw PeerDied("the listener at " + std::string(address) +
                   " closed the connection before accepting this client (it closed or died, or dropped the handshake)");
  }
  if (!bytes) {
    throw Error("the listener at " + std::string(address) + " did not accept this " + kind.describe() + waiting_for);
  }
  const Prefix prefix = decode_prefix(bytes->data());
  if (prefix.version != kEndpointWireVersion) {
    throw Error("the listener at " + std::string(address) + " speaks endpoint wire version " +
                std::to_string(prefix.version) + ", this client version " + std::to_string(kEndpointWireVersion) +
                " (use the same ferry version on both sides)");
  }
  Reply reply = decode_reply(*bytes);
  if (reply.status == ReplyStatus::Unavailable) {
    busy = std::move(reply);
    return std::nullopt;
  }
  if (reply.status != ReplyStatus::Accepted) throw_refusal(reply);
  if (reply.transport != options.transport) throw ProtocolError("the listener accepted over another transport");
  ConnectionEnds ends = make_client_side(kind, reply, std::move(connection), std::move(fds), options);
  ends.peer = listener;
  return ends;
}

}  // namespace

ConnectionEnds SocketScheme::connect(std::string_view address, std::string_view rest, const EndKind& kind,
                                     const EndpointOptions& options) const {
  const Deadline deadline = Deadline::after(options.connect_timeout);
  // A busy listener is asked again, 1 ms doubling to 50 ms apart, until the deadline.
  std::chrono::microseconds pause{1000};
  while (true) {
    Reply busy;
    if (std::optional<ConnectionEnds> ends = try_handshake(*this, address, rest, kind, options, deadline, busy)) {
      return std::move(*ends);
    }
    if (deadline.expired()) {
      throw Error(busy.message + "; this client asked again until its connect_timeout (" +
                  milliseconds_text(options.connect_timeout) + ") passed");
    }
    interruptible_sleep_for(std::min<std::chrono::nanoseconds>(pause, deadline.remaining()));
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace ferry::detail
