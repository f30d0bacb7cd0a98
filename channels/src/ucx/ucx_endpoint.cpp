// ucx:// listeners and connects (ferry/ucx.hpp): UCP's listener hands connection requests
// to this process; each becomes a UcxConnection on a worker of its own, whose handshake
// (ucx_handshake.hpp) proceeds without blocking while accept_*() waits, each with its own
// deadline. Authenticated clients wait, by kind, until an accept of their kind takes them.
#include <netinet/in.h>
#include <poll.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <list>
#include <thread>
#include <utility>
#include <vector>

#include "ferry/error.hpp"
#include "ferry/ucx.hpp"
#include "ucx_address.hpp"
#include "ucx_connection.hpp"
#include "ucx_context.hpp"
#include "ucx_handshake.hpp"
#include "ucx_transport.hpp"

namespace ferry::ucx::detail {
namespace {

KeepaliveSettings keepalive_of(const Options& options) {
  return KeepaliveSettings{options.keepalive.idle, options.keepalive.interval, options.keepalive.count};
}

ClientKind client_kind(const Kind& kind) {
  return ClientKind{kind.role == Role::Receiver ? ClientRole::Receiver : ClientRole::Sender, kind.fingerprint,
                    std::string(kind.type_name)};
}

// This side's ends for a client of `kind` over `connection`.
Connected ends_for(ClientRole client_role, std::shared_ptr<UcxConnection> connection, const ChannelOptions& channel,
                   bool client_side) {
  Connected ends;
  ends.channel = channel;
  // The client that receives meets a listener that sends, and the other way round.
  const bool this_side_sends = (client_role == ClientRole::Receiver) != client_side;
  if (this_side_sends) {
    ends.writer = std::make_unique<UcxFrameWriter>(std::move(connection), channel.close_linger);
  } else {
    ends.reader = std::make_unique<UcxFrameReader>(std::move(connection), channel.limits);
  }
  return ends;
}

std::uint16_t bound_port(ucp_listener_h listener) {
  ucp_listener_attr_t attributes{};
  attributes.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  check_ucs(ucp_listener_query(listener, &attributes), "ucp_listener_query");
  if (attributes.sockaddr.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&attributes.sockaddr)->sin_port);
  }
  return ntohs(reinterpret_cast<const sockaddr_in6*>(&attributes.sockaddr)->sin6_port);
}

class UcxListenerCore final : public ListenerCore {
 public:
  UcxListenerCore(std::string_view address, Options options);
  ~UcxListenerCore() override { close(); }
  std::optional<Connected> accept(const Kind& kind, const Deadline& deadline) override;
  void serve(const Kind& kind) override;
  const std::string& address() const override { return address_; }
  void close() noexcept override;

 private:
  struct Pending {
    std::shared_ptr<UcxConnection> connection;
    std::unique_ptr<ServerHandshake> handshake;
    Deadline deadline;
  };
  struct Waiting {
    std::shared_ptr<UcxConnection> connection;
    ClientKind kind;
  };
  static void on_connection(ucp_conn_request_h request, void* self);
  // Takes new connection requests and moves every handshake on, without blocking.
  void pump();
  void start_handshake(ucp_conn_request_h request);
  void step(std::list<Pending>::iterator pending);
  void drop(std::list<Pending>::iterator pending, const std::string& why, bool flush);
  void report(const std::string& why);
  bool serves(const ClientKind& kind) const;
  std::string served_list() const;
  // Sleeps until the listener or a handshake has news, `deadline`, or a handshake's deadline.
  void wait(const Deadline& deadline);

  Options options_;
  SecretKey key_;
  std::string address_;
  std::shared_ptr<UcxContext> context_;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  int wake_fd_ = -1;
  std::deque<ucp_conn_request_h> requests_;
  std::list<Pending> pending_;
  std::deque<Waiting> waiting_;
  std::vector<ClientKind> served_;
};

UcxListenerCore::UcxListenerCore(std::string_view address, Options options) : options_(std::move(options)) {
  const UcxAddress parsed = parse_ucx_address(address);
  key_ = derive_key(options_.secret);
  if (!key_.configured && !parsed.loopback) {
    throw Error("refusing to listen at \"" + std::string(address) +
                "\" without a shared secret: any host that can reach it could connect. Set ucx::Options::secret "
                "(or FERRY_SECRET) on the listener and its clients, or listen on loopback (127.0.0.1) only");
  }
  context_ = UcxContext::get(keepalive_of(options_));
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  check_ucs(ucp_worker_create(context_->handle(), &worker_params, &worker_), "ucp_worker_create (listener)");
  try {
    check_ucs(ucp_worker_get_efd(worker_, &wake_fd_), "ucp_worker_get_efd (listener)");
    ucp_listener_params_t params{};
    params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&parsed.socket);
    params.sockaddr.addrlen = parsed.length;
    params.conn_handler.cb = &UcxListenerCore::on_connection;
    params.conn_handler.arg = this;
    const ucs_status_t status = ucp_listener_create(worker_, &params, &listener_);
    if (status == UCS_ERR_BUSY) {
      throw Error("cannot listen at \"" + std::string(address) +
                  "\": the address is in use (another listener, or a socket of a listener that just exited: retry)");
    }
    check_ucs(status, "listening at \"" + std::string(address) + "\" (ucp_listener_create)");
    address_ = "ucx://" + parsed.text(bound_port(listener_));
  } catch (...) {
    if (listener_ != nullptr) ucp_listener_destroy(listener_);
    ucp_worker_destroy(worker_);
    throw;
  }
}

void UcxListenerCore::close() noexcept {
  if (worker_ == nullptr || !context_->in_owner()) return;
  waiting_.clear();
  pending_.clear();
  for (ucp_conn_request_h request : requests_) ucp_listener_reject(listener_, request);
  requests_.clear();
  ucp_listener_destroy(listener_);
  ucp_worker_destroy(worker_);
  worker_ = nullptr;
}

void UcxListenerCore::on_connection(ucp_conn_request_h request, void* self) {
  static_cast<UcxListenerCore*>(self)->requests_.push_back(request);
}

void UcxListenerCore::report(const std::string& why) {
  if (options_.on_refusal) {
    options_.on_refusal(why);
  } else {
    std::fprintf(stderr, "ferry: %s: %s\n", address_.c_str(), why.c_str());
  }
}

bool UcxListenerCore::serves(const ClientKind& kind) const {
  return std::find(served_.begin(), served_.end(), kind) != served_.end();
}

std::string UcxListenerCore::served_list() const {
  std::string list;
  for (const ClientKind& kind : served_) list += (list.empty() ? "" : ", ") + kind.describe();
  return list.empty() ? "none yet" : list;
}

void UcxListenerCore::serve(const Kind& kind) {
  const ClientKind client = client_kind(kind);
  if (!serves(client)) served_.push_back(client);
}

void UcxListenerCore::start_handshake(ucp_conn_request_h request) {
  std::shared_ptr<UcxConnection> connection;
  try {
    connection = UcxConnection::accept(context_, request, options_.channel.limits);
  } catch (const std::exception& error) {
    ucp_listener_reject(listener_, request);
    report(std::string("could not accept a client: ") + error.what());
    return;
  }
  connection->set_peer_address("client of " + address_);
  try {
    auto handshake = std::make_unique<ServerHandshake>(*connection, key_);
    pending_.push_back(Pending{std::move(connection), std::move(handshake),
                               Deadline::after(options_.handshake_timeout)});
  } catch (const std::exception& error) {
    report(std::string("a client went away before its handshake: ") + error.what());
  }
}

void UcxListenerCore::drop(std::list<Pending>::iterator pending, const std::string& why, bool flush) {
  report(why);
  pending->connection->close(std::chrono::milliseconds(flush ? 200 : 0), !flush);
  pending_.erase(pending);
}

void UcxListenerCore::step(std::list<Pending>::iterator pending) {
  std::optional<ClientKind> kind;
  try {
    kind = pending->handshake->poll();
  } catch (const ChannelClosed& error) {
    drop(pending, std::string("a client went away during its handshake: ") + error.what(), false);
    return;
  } catch (const std::exception& error) {
    drop(pending, error.what(), true);  // refused: let the verdict reach the client
    return;
  }
  if (!kind) {
    if (pending->deadline.expired()) {
      drop(pending, "dropped a client that sent no handshake within ucx::Options::handshake_timeout", false);
    }
    return;
  }
  if (!serves(*kind)) {
    const std::string reason = "this listener serves " + served_list() + ", not " + kind->describe();
    pending->handshake->refuse(Outcome::TypeMismatch, reason);
    drop(pending, "refused a client: " + reason, true);
    return;
  }
  try {
    pending->handshake->accept();
  } catch (const std::exception& error) {
    drop(pending, std::string("a client went away during its handshake: ") + error.what(), false);
    return;
  }
  waiting_.push_back(Waiting{std::move(pending->connection), std::move(*kind)});
  pending_.erase(pending);
}

void UcxListenerCore::pump() {
  while (ucp_worker_progress(worker_) != 0) {
  }
  while (!requests_.empty()) {
    ucp_conn_request_h request = requests_.front();
    requests_.pop_front();
    start_handshake(request);
  }
  for (auto it = pending_.begin(); it != pending_.end();) step(it++);
}

void UcxListenerCore::wait(const Deadline& deadline) {
  // Arm every worker; one that has news already makes the wait a poll.
  std::vector<pollfd> fds;
  bool busy = false;
  while (ucp_worker_progress(worker_) != 0) {
  }
  const ucs_status_t armed = ucp_worker_arm(worker_);
  if (armed == UCS_ERR_BUSY) busy = true;
  fds.push_back(pollfd{wake_fd_, POLLIN, 0});
  Deadline until = deadline;
  for (Pending& pending : pending_) {
    if (pending.connection->control_ready()) busy = true;
    fds.push_back(pollfd{pending.connection->wake_fd(), POLLIN, 0});
    if (pending.deadline.time_point() < until.time_point()) until = pending.deadline;
  }
  if (busy || !requests_.empty()) return;
  int timeout_ms = -1;
  if (!until.is_never()) {
    timeout_ms = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(until.remaining()).count());
  }
  if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
    throw SystemError("poll on a ucx listener", errno);
  }
}

std::optional<Connected> UcxListenerCore::accept(const Kind& kind, const Deadline& deadline) {
  if (worker_ == nullptr) throw ChannelClosed("this ucx Listener is closed");
  if (!context_->in_owner()) {
    throw Error("accepting: this ucx Listener was carried across fork; listen in the child instead");
  }
  serve(kind);
  const ClientKind wanted = client_kind(kind);
  for (;;) {
    pump();
    const auto found = std::find_if(waiting_.begin(), waiting_.end(),
                                    [&](const Waiting& waiting) { return waiting.kind == wanted; });
    if (found != waiting_.end()) {
      std::shared_ptr<UcxConnection> connection = std::move(found->connection);
      waiting_.erase(found);
      return ends_for(wanted.role, std::move(connection), options_.channel, false);
    }
    if (deadline.expired()) return std::nullopt;
    wait(deadline);
  }
}

}  // namespace

std::unique_ptr<ListenerCore> make_listener(std::string_view address, Options options) {
  return std::make_unique<UcxListenerCore>(address, std::move(options));
}

Connected connect(std::string_view address, const Kind& kind, const Options& options) {
  const UcxAddress parsed = parse_ucx_address(address);
  const SecretKey key = derive_key(options.secret);
  auto context = UcxContext::get(keepalive_of(options));
  const Deadline deadline = Deadline::after(options.connect_timeout);
  const ClientKind client = client_kind(kind);
  std::string last_failure;
  for (;;) {
    auto connection = UcxConnection::connect(context, parsed.socket, parsed.length, options.channel.limits);
    connection->set_peer_address(parsed.text(parsed.port));
    try {
      client_handshake(*connection, client, key, deadline);
      return ends_for(client.role, std::move(connection), options.channel, true);
    } catch (const PeerDied&) {
      throw;
    } catch (const ChannelClosed& error) {
      last_failure = error.what();  // no listener there (yet): try again until the deadline
    }
    connection->close(std::chrono::milliseconds(0), true);
    if (deadline.expired()) {
      throw Error("no ucx:// listener accepted this client at \"" + std::string(address) + "\" within " +
                  std::to_string(options.connect_timeout.count()) + " ms (last: " + last_failure + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace ferry::ucx::detail
