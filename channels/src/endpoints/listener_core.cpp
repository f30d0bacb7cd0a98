// The listener's accept queue: new connections, their handshakes side by side (each with
// its own deadline), and the clients that completed theirs, oldest first; both bounded.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "endpoints/connection_ends.hpp"
#include "endpoints/handshake.hpp"
#include "endpoints/refusal_log.hpp"
#include "endpoints/scheme_registry.hpp"
#include "ferry/endpoint.hpp"
#include "ferry/wait_interruption.hpp"

namespace ferry::detail {

struct StreamListenerCore::Pending {
  AcceptedSocket connection;
  Deadline deadline = Deadline::never();
  std::vector<std::byte> bytes;  // the Hello so far
  std::size_t wanted = kHandshakePrefixBytes;
};

struct StreamListenerCore::Waiting {
  AcceptedSocket connection;
  Hello hello;
};

namespace {

std::string who(const PeerCredentials& peer) {
  return "process " + std::to_string(peer.pid) + ", user " + std::to_string(peer.uid);
}

// Out of descriptors with no reserve to refuse with: how long the backlog is left alone.
constexpr std::chrono::milliseconds kAcceptPause{20};

// The descriptor kept free for refusing connections when the process runs out; empty
// when even that one cannot be had now.
UniqueFd open_reserve() noexcept { return UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC)); }

constexpr std::uint8_t status_byte(ReplyStatus status) { return static_cast<std::uint8_t>(status); }

}  // namespace

StreamListenerCore::StreamListenerCore(std::unique_ptr<ListeningPoint> point, std::string address,
                                       const EndpointOptions& options)
    : point_(std::move(point)),
      address_(std::move(address)),
      options_(std::make_unique<EndpointOptions>(options)),
      owner_(::getpid()),
      log_(std::make_unique<RefusalLog>()),
      reserve_(open_reserve()) {
  track();
}

StreamListenerCore::~StreamListenerCore() {
  untrack();
  close();
}

void StreamListenerCore::abandon_in_child() noexcept {
  if (point_) point_->abandon();
  point_.reset();
  pending_.clear();
  ready_.clear();
  reserve_.reset();
}

void StreamListenerCore::serve(const EndKind& kind) {
  for (const EndKind& served : served_) {
    if (served.matches(kind)) return;
  }
  served_.push_back(kind);
}

std::string StreamListenerCore::served_kinds() const {
  if (served_.empty()) return "none yet";
  std::string text;
  for (std::size_t i = 0; i < served_.size(); ++i) {
    if (i > 0) text += ", ";
    text += served_[i].describe();
  }
  return text;
}

void StreamListenerCore::report(const PeerCredentials& peer, const std::string& reason) {
  const std::string line = "ferry: the listener at " + address_ + " refused a client (" + who(peer) + "): " + reason;
  if (options_->on_refusal) {
    options_->on_refusal(line);
  } else {
    log_->write(line);
  }
}

namespace {

ListenerCore::Refusal refusal_of(ReplyStatus status) noexcept {
  switch (status) {
    case ReplyStatus::VersionMismatch: return ListenerCore::Refusal::VersionMismatch;
    case ReplyStatus::TypeMismatch: return ListenerCore::Refusal::TypeMismatch;
    case ReplyStatus::NotAllowed: return ListenerCore::Refusal::NotAllowed;
    case ReplyStatus::TransportMismatch: return ListenerCore::Refusal::TransportMismatch;
    case ReplyStatus::Unavailable: return ListenerCore::Refusal::Unavailable;
    case ReplyStatus::Accepted:
    case ReplyStatus::Malformed: break;
  }
  return ListenerCore::Refusal::Malformed;
}

}  // namespace

void StreamListenerCore::refuse(AcceptedSocket& connection, std::uint8_t status, const std::string& reason,
                                const std::string& told, std::optional<Refusal> counted_as) {
  count_refusal(counted_as.value_or(refusal_of(static_cast<ReplyStatus>(status))));
  Reply reply;
  reply.status = static_cast<ReplyStatus>(status);
  reply.transport = options_->transport;
  if (reply.status != ReplyStatus::NotAllowed) reply.limits = options_->channel.limits;
  reply.message = "the listener at " + address_ + " refused this client: " + (told.empty() ? reason : told);
  (void)send_now(connection.socket.get(), encode_reply(reply));  // it may be gone already
  report(connection.peer, reason);
  connection.socket.reset();
}

void StreamListenerCore::accept_new_connections() {
  if (!accept_paused_until_.is_never()) {
    if (!accept_paused_until_.expired()) return;
    accept_paused_until_ = Deadline::never();
  }
  if (!reserve_) reserve_ = open_reserve();
  while (point_) {
    std::optional<AcceptedSocket> accepted;
    try {
      accepted = point_->accept();
    } catch (const SystemError& error) {
      if (error.code() != EMFILE && error.code() != ENFILE) throw;
      if (!reserve_) {
        accept_paused_until_ = Deadline::after(kAcceptPause);  // the backlog waits
        return;
      }
      if (!shed_one()) return;
      continue;
    }
    if (!accepted) return;
    admit(std::move(*accepted));
  }
}

bool StreamListenerCore::shed_one() {
  reserve_.reset();
  std::optional<AcceptedSocket> accepted;
  try {
    accepted = point_->accept();
  } catch (const SystemError&) {
    // Another thread (or, for ENFILE, process) took the descriptor first: wait a little.
    accept_paused_until_ = Deadline::after(kAcceptPause);
  }
  if (accepted) {
    refuse(*accepted, status_byte(ReplyStatus::Unavailable),
           "this process is out of file descriptors, so the listener refused this client to keep going: close ends "
           "you no longer need or raise RLIMIT_NOFILE (ulimit -n)",
           "the listener is out of file descriptors (the client tries again until its connect_timeout)");
  }
  reserve_ = open_reserve();
  return accepted.has_value();
}

void StreamListenerCore::admit(AcceptedSocket accepted) {
  auto pending = std::make_unique<Pending>();
  pending->connection = std::move(accepted);
  pending->deadline = Deadline::after(options_->handshake_timeout);
  const PeerCredentials& peer = pending->connection.peer;
  if (!options_->allowed_peers.allows(peer)) {
    // The client learns nothing of whom the listener admits.
    refuse(pending->connection, status_byte(ReplyStatus::NotAllowed),
           "its user (" + std::to_string(peer.uid) + ", group " + std::to_string(peer.gid) +
               ") is not allowed; the listener admits " + options_->allowed_peers.describe() +
               " (EndpointOptions::allowed_peers)",
           "its user is not allowed (EndpointOptions::allowed_peers)");
    return;
  }
  // Its hello has usually arrived with the connection already.
  if (advance(*pending)) return;
  if (pending_.size() >= options_->max_pending_handshakes) {
    refuse(pending->connection, status_byte(ReplyStatus::Unavailable),
           "already " + std::to_string(pending_.size()) +
               " clients are in their handshake (EndpointOptions::max_pending_handshakes)",
           "too many clients are in their handshake (the client tries again until its connect_timeout)");
    return;
  }
  pending_.push_back(std::move(pending));
  publish_pending(pending_.size());
}

bool StreamListenerCore::advance(Pending& pending) {
  const PeerCredentials& peer = pending.connection.peer;
  const int fd = pending.connection.socket.get();
  std::vector<UniqueFd> fds;
  while (pending.bytes.size() < pending.wanted) {
    long got = 0;
    try {
      got = receive_some(fd, pending.wanted - pending.bytes.size(), pending.bytes, fds);
    } catch (const Error& error) {
      refuse(pending.connection, static_cast<std::uint8_t>(ReplyStatus::Malformed), error.what());
      return true;
    }
    if (!fds.empty()) {
      refuse(pending.connection, static_cast<std::uint8_t>(ReplyStatus::Malformed),
             "it sent descriptors during its handshake");
      return true;
    }
    if (got < 0) return false;  // more later
    if (got == 0) {
      count_refusal(Refusal::ClientLeft);
      report(peer, "it closed the connection during its handshake (it exited or was killed)");
      pending.connection.socket.reset();
      return true;
    }
    if (pending.wanted == kHandshakePrefixBytes && pending.bytes.size() == kHandshakePrefixBytes) {
      const Prefix prefix = decode_prefix(pending.bytes.data());
      if (!prefix.magic_ok) {
        refuse(pending.connection, static_cast<std::uint8_t>(ReplyStatus::Malformed),
               "it does not speak ferry's endpoint handshake (its first bytes are not a ferry hello)");
        return true;
      }
      if (prefix.version != kEndpointWireVersion) {
        refuse(pending.connection, static_cast<std::uint8_t>(ReplyStatus::VersionMismatch),
               "it speaks endpoint wire version " + std::to_string(prefix.version) + ", this listener version " +
                   std::to_string(kEndpointWireVersion) + " (use the same ferry version on both sides)");
        return true;
      }
      if (prefix.total_bytes < kHelloFixedBytes || prefix.total_bytes > kMaxHelloBytes) {
        refuse(pending.connection, static_cast<std::uint8_t>(ReplyStatus::Malformed),
               "its hello claims " + std::to_string(prefix.total_bytes) + " bytes (a hello has " +
                   std::to_string(kHelloFixedBytes) + " to " + std::to_string(kMaxHelloBytes) + ")");
        return true;
      }
      pending.wanted = prefix.total_bytes;
    }
  }
  Hello hello;
  try {
    hello = decode_hello(pending.bytes);
  } catch (const ProtocolError& error) {
    refuse(pending.connection, static_cast<std::uint8_t>(ReplyStatus::Malformed), error.what());
    return true;
  }
  if (hello.transport != options_->transport) {
    refuse(pending.connection, static_cast<std::uint8_t>(ReplyStatus::TransportMismatch),
           "it asked for transport " + std::string(transport_name(hello.transport)) + ", this listener serves " +
               std::string(transport_name(options_->transport)) +
               " (set the same EndpointOptions::transport on both sides)");
    return true;
  }
  const bool served =
      std::any_of(served_.begin(), served_.end(), [&](const EndKind& kind) { return kind.matches(hello.kind); });
  if (!served) {
    refuse(pending.connection, static_cast<std::uint8_t>(ReplyStatus::TypeMismatch),
           "it connects as " + hello.kind.describe() + ", and this listener serves " + served_kinds());
    return true;
  }
  // Counted per kind: clients of one kind the program is not accepting now cannot keep
  // out those of the kind it is.
  const auto waiting_alike =
      static_cast<std::size_t>(std::count_if(ready_.begin(), ready_.end(), [&](const std::unique_ptr<Waiting>& other) {
        return other->hello.kind.matches(hello.kind);
      }));
  if (waiting_alike >= options_->max_waiting_connections) {
    refuse(pending.connection, status_byte(ReplyStatus::Unavailable),
           "already " + std::to_string(waiting_alike) + " clients connected as " + hello.kind.describe() +
               " wait to be accepted (EndpointOptions::max_waiting_connections)",
           "too many clients wait to be accepted (the client tries again until its connect_timeout)");
    return true;
  }
  auto waiting = std::make_unique<Waiting>();
  waiting->connection = std::move(pending.connection);
  waiting->hello = std::move(hello);
  ready_.push_back(std::move(waiting));
  return true;
}

void StreamListenerCore::drop_expired() {
  std::erase_if(pending_, [&](const std::unique_ptr<Pending>& pending) {
    if (!pending->deadline.expired()) return false;
    refuse(pending->connection, static_cast<std::uint8_t>(ReplyStatus::Malformed),
           "it sent no complete handshake within " + std::to_string(options_->handshake_timeout.count()) +
               " ms (EndpointOptions::handshake_timeout)",
           {}, Refusal::HandshakeTimeout);
    return true;
  });
  publish_pending(pending_.size());
}

void StreamListenerCore::append_poll_fds(std::vector<pollfd>& fds) const {
  if (!point_) return;
  // Left out (-1: ignored by poll) while out of descriptors without a reserve.
  fds.push_back(pollfd{accept_paused_until_.is_never() ? point_->fd() : -1, POLLIN, 0});
  for (const auto& pending : pending_) fds.push_back(pollfd{pending->connection.socket.get(), POLLIN, 0});
  // A waiting client sends nothing until it is accepted: readable means it hung up.
  for (const auto& waiting : ready_) fds.push_back(pollfd{waiting->connection.socket.get(), POLLIN, 0});
}

Deadline StreamListenerCore::next_deadline() const {
  Deadline earliest = accept_paused_until_;
  for (const auto& pending : pending_) {
    if (pending->deadline.time_point() < earliest.time_point()) earliest = pending->deadline;
  }
  return earliest;
}

bool StreamListenerCore::pump(const Deadline& deadline) {
  if (!point_) return false;
  std::vector<pollfd> fds;
  append_poll_fds(fds);
  const Deadline handshakes = next_deadline();
  const Deadline& until = handshakes.time_point() < deadline.time_point() ? handshakes : deadline;
  bool sliced = false;  // cut short for the thread's wait-interruption check
  const std::chrono::nanoseconds limit = sleep_limit(until, sliced);
  timespec left{};
  const timespec* timeout = nullptr;
  if (limit != std::chrono::nanoseconds::max()) {
    left = to_timespec(limit);
    timeout = &left;
  }
  const int rc = ::ppoll(fds.data(), fds.size(), timeout, nullptr);
  if (rc < 0 && errno != EINTR) throw_errno("ppoll on a listening endpoint");
  if (rc < 0 || (rc == 0 && sliced)) wait_interruption_point(rc < 0);  // may throw: nothing is lost
  if (rc > 0) {
    // fds: the listening socket, pending_, then ready_ (advance() appends to ready_ only).
    std::vector<bool> readable(pending_.size());
    for (std::size_t i = 0; i < pending_.size(); ++i) readable[i] = fds[1 + i].revents != 0;
    std::vector<bool> hung_up(ready_.size());
    for (std::size_t i = 0; i < ready_.size(); ++i) hung_up[i] = fds[1 + pending_.size() + i].revents != 0;
    std::size_t index = 0;
    std::erase_if(ready_, [&](std::unique_ptr<Waiting>& waiting) {
      if (index >= hung_up.size() || !hung_up[index++]) return false;
      count_refusal(Refusal::ClientLeft);
      report(waiting->connection.peer, "it went away (or sent bytes out of turn) while it waited to be accepted");
      return true;
    });
    index = 0;
    std::erase_if(pending_, [&](std::unique_ptr<Pending>& pending) { return readable[index++] && advance(*pending); });
    publish_pending(pending_.size());
  }
  // Expiry first: nothing accept meets (out of descriptors, say) keeps it from running.
  drop_expired();
  accept_new_connections();
  return has_waiting_client();
}

std::optional<ConnectionEnds> StreamListenerCore::complete(Waiting& waiting) {
  ListenerSide side;
  const PeerCredentials peer = waiting.connection.peer;
  UniqueFd connection = waiting.connection.socket.duplicate();
  try {
    side =
        make_listener_side(waiting.hello.kind, waiting.hello.limits, std::move(waiting.connection.socket), *options_);
  } catch (const Error& error) {
    AcceptedSocket failed{std::move(connection), peer};
    refuse(failed, status_byte(ReplyStatus::Unavailable),
           std::string("the listener could not make its connection: ") + error.what());
    throw;
  }
  Reply reply;
  reply.transport = options_->transport;
  reply.limits = options_->channel.limits;
  const std::vector<int> fds = side.descriptors_to_pass(reply.writer_fds, reply.reader_fds);
  if (!send_now(connection.get(), encode_reply(reply), fds)) {
    count_refusal(Refusal::ClientLeft);
    report(peer, "it went away before it was accepted");
    return std::nullopt;
  }
  count_accepted();
  side.mine.peer = peer;
  return std::move(side.mine);
}

std::optional<ConnectionEnds> StreamListenerCore::accept(const EndKind& kind, const Deadline& deadline) {
  serve(kind);
  for (bool first = true;; first = false) {
    if (first) {
      drop_expired();
      accept_new_connections();
    }
    for (auto it = ready_.begin(); it != ready_.end();) {
      if (!(*it)->hello.kind.matches(kind)) {
        ++it;
        continue;
      }
      std::unique_ptr<Waiting> waiting = std::move(*it);
      it = ready_.erase(it);
      if (auto ends = complete(*waiting)) return ends;
    }
    if (!first && deadline.expired()) return std::nullopt;
    pump(deadline);
  }
}

void StreamListenerCore::close() noexcept {
  if (!point_) return;
  if (::getpid() != owner_) point_->abandon();  // a forked copy leaves the socket file alone
  point_.reset();
  pending_.clear();
  ready_.clear();
  reserve_.reset();
}

}  // namespace ferry::detail
