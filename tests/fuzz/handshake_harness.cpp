#include "handshake_harness.hpp"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "endpoints/handshake.hpp"
#include "endpoints/scheme_registry.hpp"
#include "ferry/endpoint.hpp"

namespace ferry::fuzz {
namespace {

using detail::Hello;
using detail::Reply;

[[noreturn]] void handshake_failure(const char* what) {
  std::fprintf(stderr, "fuzz harness: %s\n", what);
  std::abort();
}

bool same_limits(const FrameLimits& a, const FrameLimits& b) {
  return a.max_body_bytes == b.max_body_bytes && a.max_handles == b.max_handles && a.max_segments == b.max_segments &&
         a.max_fds == b.max_fds && a.max_releases == b.max_releases && a.max_type_name_bytes == b.max_type_name_bytes;
}

void check_hello_round_trip(const Hello& hello) {
  const Hello again = detail::decode_hello(detail::encode_hello(hello));
  if (!again.kind.matches(hello.kind) || again.kind.sends_name != hello.kind.sends_name ||
      again.kind.receives_name != hello.kind.receives_name || again.transport != hello.transport ||
      !same_limits(again.limits, hello.limits)) {
    handshake_failure("a decoded Hello changed when encoded and decoded again");
  }
}

void check_reply_round_trip(const Reply& reply) {
  const Reply again = detail::decode_reply(detail::encode_reply(reply));
  if (again.status != reply.status || again.transport != reply.transport || again.writer_fds != reply.writer_fds ||
      again.reader_fds != reply.reader_fds || !same_limits(again.limits, reply.limits) ||
      again.message != reply.message) {
    handshake_failure("a decoded Reply changed when encoded and decoded again");
  }
}

// The lowest free descriptor number: any fd leaked during a run takes it.
int lowest_free() {
  const int probe = ::fcntl(0, F_DUPFD_CLOEXEC, 0);
  if (probe < 0) handshake_failure("cannot probe the lowest free fd");
  ::close(probe);
  return probe;
}

// A listening point whose backlog the script fills with socket pairs' listener ends.
class ScriptedPoint final : public detail::ListeningPoint {
 public:
  ScriptedPoint() : never_ready_(::eventfd(0, EFD_CLOEXEC)) {
    if (!never_ready_) handshake_failure("eventfd");
  }
  int fd() const noexcept override { return never_ready_.get(); }
  std::optional<detail::AcceptedSocket> accept() override {
    if (backlog_.empty()) return std::nullopt;
    detail::AcceptedSocket next = std::move(backlog_.front());
    backlog_.pop_front();
    return next;
  }
  void abandon() noexcept override {}
  void queue(detail::UniqueFd listener_end) {
    backlog_.push_back(
        detail::AcceptedSocket{std::move(listener_end), PeerCredentials{::getpid(), ::geteuid(), ::getegid()}});
  }

 private:
  detail::UniqueFd never_ready_;
  std::deque<detail::AcceptedSocket> backlog_;
};

struct Client {
  detail::UniqueFd fd;
  bool accepted = false;  // an Accepted reply arrived
  bool answered = false;  // a reply arrived
};

// Reads what the listener answered `client`, if anything, and checks it.
void read_reply(Client& client) {
  if (!client.fd || client.answered) return;
  std::vector<detail::UniqueFd> fds;
  std::optional<std::vector<std::byte>> bytes;
  try {
    bytes = detail::receive_message(client.fd.get(), detail::kMaxReplyBytes, fds, detail::Deadline::now());
  } catch (const PeerDied&) {
    client.fd.reset();  // dropped without a reply (it closed first, or sent descriptors)
    return;
  } catch (const ProtocolError&) {
    handshake_failure("the listener answered with bytes that are not a Reply");
  }
  if (!bytes) return;
  Reply reply;
  try {
    reply = detail::decode_reply(*bytes);
  } catch (const ProtocolError&) {
    handshake_failure("the listener's Reply does not decode");
  }
  check_reply_round_trip(reply);
  client.answered = true;
  client.accepted = reply.status == detail::ReplyStatus::Accepted;
  if (client.accepted && (reply.writer_fds != 0 || reply.reader_fds != 0 || !fds.empty())) {
    handshake_failure("an Accepted Reply over UnixSocket passed descriptors");
  }
}

}  // namespace

int run_handshake(std::span<const std::uint8_t> input) {
  const std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(input.data()),
                                     reinterpret_cast<const std::byte*>(input.data()) + input.size());
  if (bytes.size() >= detail::kHandshakePrefixBytes) {
    const detail::Prefix prefix = detail::decode_prefix(bytes.data());
    if (prefix.magic_ok != (std::memcmp(bytes.data(), detail::kEndpointMagic, sizeof detail::kEndpointMagic) == 0)) {
      handshake_failure("decode_prefix misread the magic");
    }
  }
  int decoded = 0;
  try {
    check_hello_round_trip(detail::decode_hello(bytes));
    ++decoded;
  } catch (const ProtocolError&) {
  }
  try {
    check_reply_round_trip(detail::decode_reply(bytes));
    ++decoded;
  } catch (const ProtocolError&) {
  }
  return decoded;
}

int run_listener(std::span<const std::uint8_t> input) {
  const int lowest_before = lowest_free();
  int accepted = 0;
  {
    EndpointOptions options;
    options.handshake_timeout = std::chrono::hours(1);  // expiry is time, not input
    options.on_refusal = [](const std::string&) {};
    options.max_pending_handshakes = 4;
    options.max_waiting_connections = 2;
    auto point = std::make_unique<ScriptedPoint>();
    ScriptedPoint& backlog = *point;
    detail::StreamListenerCore listener(std::move(point), "unix:@fuzz", options);
    const detail::EndKind receiver = detail::client_receiver_kind<int>();
    const detail::EndKind sender = detail::client_sender_kind<double>();
    listener.serve(receiver);
    listener.serve(sender);
    std::vector<Client> clients;
    std::vector<detail::ConnectionEnds> ends;
    std::size_t at = 0;
    auto next = [&]() -> std::optional<std::uint8_t> {
      if (at >= input.size()) return std::nullopt;
      return input[at++];
    };
    while (auto op = next()) {
      switch (static_cast<ListenerOp>(*op % 6)) {
        case ListenerOp::Connect: {
          if (clients.size() >= kMaxListenerClients) break;
          int pair[2];
          if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) handshake_failure("socketpair");
          backlog.queue(detail::UniqueFd(pair[0]));
          const int flags = ::fcntl(pair[1], F_GETFL);
          (void)::fcntl(pair[1], F_SETFL, flags | O_NONBLOCK);
          clients.push_back(Client{detail::UniqueFd(pair[1])});
          break;
        }
        case ListenerOp::Send: {
          const auto index = next();
          const auto length = next();
          if (!index || !length) break;
          const std::size_t count = std::min<std::size_t>(*length, input.size() - at);
          if (!clients.empty() && clients[*index % clients.size()].fd) {
            (void)::send(clients[*index % clients.size()].fd.get(), input.data() + at, count,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
          }
          at += count;
          break;
        }
        case ListenerOp::Close: {
          const auto index = next();
          if (index && !clients.empty()) clients[*index % clients.size()].fd.reset();
          break;
        }
        case ListenerOp::Pump: listener.pump(detail::Deadline::now()); break;
        case ListenerOp::Accept: {
          const auto which = next();
          const detail::EndKind& kind = which && *which % 2 == 1 ? sender : receiver;
          if (std::optional<detail::ConnectionEnds> taken = listener.accept(kind, detail::Deadline::now())) {
            ends.push_back(std::move(*taken));
            ++accepted;
          }
          break;
        }
        case ListenerOp::Read:
          for (Client& client : clients) read_reply(client);
          break;
      }
      if (listener.pending_count() > options.max_pending_handshakes)
        handshake_failure("more pending handshakes than the cap");
    }
    for (Client& client : clients) read_reply(client);
    int accepted_replies = 0;
    for (const Client& client : clients) accepted_replies += client.accepted ? 1 : 0;
    if (accepted_replies > accepted) handshake_failure("a client was told Accepted that accept() never returned");
  }
  if (lowest_free() != lowest_before) handshake_failure("the listener leaked a file descriptor");
  return accepted;
}

}  // namespace ferry::fuzz
