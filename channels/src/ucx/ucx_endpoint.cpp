// The ucx:// scheme (ferry::listen / ferry::connect_* with "ucx://HOST:PORT"): UCP's
// listener hands connection requests to this process; each becomes a UcxConnection on a
// worker of its own, whose handshake (ucx_handshake.hpp) proceeds without blocking while
// accept_*() or a Selector waits, each with its own deadline. Authenticated clients wait,
// by kind, until an accept of their kind takes them. ferry_channels finds this scheme
// through ferry_ucx_scheme() (endpoints/scheme_registry.cpp).
#include <netinet/in.h>
#include <poll.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <list>
#include <utility>
#include <vector>

#include "endpoints/scheme_registry.hpp"
#include "ferry/endpoint.hpp"
#include "ferry/error.hpp"
#include "ferry/wait_interruption.hpp"
#include "ucx_address.hpp"
#include "ucx_connection.hpp"
#include "ucx_context.hpp"
#include "ucx_handshake.hpp"
#include "ucx_transport.hpp"

namespace ferry::ucx::detail {
namespace {

using ferry::detail::ClientEnd;
using ferry::detail::ConnectionEnds;

constexpr std::string_view kForms =
    "ucx://HOST:PORT (across hosts, in a program that links ferry::ucx; HOST an IPv4 address or a name, e.g. "
    "ucx://10.0.0.5:7000; PORT 0 picks a free port when listening)";

KeepaliveSettings keepalive_of(const EndpointOptions& options) {
  return KeepaliveSettings{options.keepalive.idle, options.keepalive.interval, options.keepalive.count};
}

void check_transport(const EndpointOptions& options, std::string_view address) {
  if (options.transport != Transport::UnixSocket && options.transport != Transport::Ucx) {
    throw Error("endpoint address \"" + std::string(address) + "\" travels over UCX, not " +
                std::string(transport_name(options.transport)) +
                ": leave EndpointOptions::transport at its default (or set Transport::Ucx) for ucx:// addresses");
  }
}

// This side's ends for a client of `kind` over `connection`; `peer_limits`: what the peer
// enforces on what it receives (this side's sender keeps to them).
ConnectionEnds ends_for(const EndKind& kind, const std::shared_ptr<UcxConnection>& connection,
                        const ChannelOptions& channel, const FrameLimits& peer_limits, bool client_side) {
  ConnectionEnds ends;
  ends.transport = Transport::Ucx;
  ends.receiver_options = ferry::detail::per_connection_options(channel);
  ends.sender_options = ends.receiver_options;
  ends.sender_options.limits = peer_limits;
  const bool client_sends = kind.end != ClientEnd::Receiver;
  const bool client_receives = kind.end != ClientEnd::Sender;
  // The listener sends what the client receives, and receives what it sends.
  const bool sends = client_side ? client_sends : client_receives;
  const bool receives = client_side ? client_receives : client_sends;
  if (sends) ends.writer = std::make_unique<UcxFrameWriter>(connection, channel.close_linger);
  if (receives) ends.reader = std::make_unique<UcxFrameReader>(connection, channel.limits);
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

class UcxListenerCore final : public ferry::detail::ListenerCore {
 public:
  UcxListenerCore(std::string_view address, const EndpointOptions& options);
  ~UcxListenerCore() override {
    untrack();
    close();
  }
  const std::string& address() const noexcept override { return address_; }
  void serve(const EndKind& kind) override;
  std::optional<ConnectionEnds> accept(const EndKind& kind, const ferry::detail::Deadline& deadline) override;
  bool pump(const ferry::detail::Deadline& deadline) override;
  bool has_waiting_client() const noexcept override { return !waiting_.empty(); }
  void append_poll_fds(std::vector<pollfd>& fds) const override;
  ferry::detail::Deadline next_deadline() const override;
  void close() noexcept override;
  void abandon_in_child() noexcept override;
  bool is_open() const noexcept override { return worker_ != nullptr; }
  std::size_t pending_count() const noexcept override { return pending_.size(); }

 private:
  struct Pending {
    std::shared_ptr<UcxConnection> connection;
    std::unique_ptr<ServerHandshake> handshake;
    ferry::detail::Deadline deadline;
    sockaddr_storage client{};  // the client's address (family 0: unknown)
  };
  struct Waiting {
    std::shared_ptr<UcxConnection> connection;
    EndKind kind;
    FrameLimits limits;
  };
  static void on_connection(ucp_conn_request_h request, void* self);
  // Takes new connection requests and moves every handshake on, without blocking.
  void progress();
  void start_handshake(ucp_conn_request_h request);
  void step(std::list<Pending>::iterator pending);
  void drop(std::list<Pending>::iterator pending, const std::string& why, bool flush);
  void report(const std::string& why);
  bool serves(const EndKind& kind) const;
  std::string served_list() const;
  // Arms every worker; true when one had news already (then a poll must not sleep).
  bool arm() const;
  // Sleeps until the listener or a handshake has news, `deadline`, or a handshake's deadline.
  void wait(const ferry::detail::Deadline& deadline);
  void refuse_after_fork_here(const char* what) const;

  EndpointOptions options_;
  Salt salt_{};  // drawn at listen: the key of this listener is its own
  SecretKey key_;
  std::string address_;
  std::shared_ptr<UcxContext> context_;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  int wake_fd_ = -1;
  std::deque<ucp_conn_request_h> requests_;
  std::list<Pending> pending_;
  std::deque<Waiting> waiting_;
  std::vector<EndKind> served_;
  mutable bool busy_ = false;  // arm() found news: the next poll must not sleep
  // When progress is due again even without a wake-up (kLongestWakeFdSleep after the last).
  ferry::detail::Deadline progress_due_ = ferry::detail::Deadline::now();
};

UcxListenerCore::UcxListenerCore(std::string_view address, const EndpointOptions& options) : options_(options) {
  check_transport(options_, address);
  const UcxAddress parsed = parse_ucx_address(address);
  salt_ = random_salt();
  key_ = derive_key(shared_secret(options_, address, true), salt_);
  if (options_.max_pending_handshakes == 0) {
    throw Error(
        "EndpointOptions::max_pending_handshakes is 0: no client could ever connect; leave it at its default "
        "(64) or set at least 1");
  }
  context_ = UcxContext::get(keepalive_of(options_), parsed.socket.ss_family);
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
      throw AddressInUse("cannot listen at \"" + std::string(address) +
                         "\": the address is in use (another listener, or a socket of a listener that just exited: "
                         "retry in a moment)");
    }
    check_ucs(status, "listening at \"" + std::string(address) + "\" (ucp_listener_create)");
    address_ = "ucx://" + parsed.text(bound_port(listener_));
  } catch (...) {
    if (listener_ != nullptr) ucp_listener_destroy(listener_);
    ucp_worker_destroy(worker_);
    worker_ = nullptr;
    throw;
  }
  track();
}

void UcxListenerCore::refuse_after_fork_here(const char* what) const {
  if (!context_->in_owner()) {
    throw Error(std::string(what) +
                ": this ucx:// Listener was carried across fork; UCX state must not be used by a forked child: "
                "listen in the child instead");
  }
}

void UcxListenerCore::close() noexcept {
  if (worker_ == nullptr) return;
  if (!context_->in_owner()) {
    abandon_in_child();
    return;
  }
  waiting_.clear();
  pending_.clear();
  for (ucp_conn_request_h request : requests_) ucp_listener_reject(listener_, request);
  requests_.clear();
  ucp_listener_destroy(listener_);
  ucp_worker_destroy(worker_);
  worker_ = nullptr;
  listener_ = nullptr;
}

void UcxListenerCore::abandon_in_child() noexcept {
  // The parent's UCX state: forget it without a UCX call (the connections' and context's
  // destructors see that this is not their process and leave UCX alone too).
  waiting_.clear();
  pending_.clear();
  requests_.clear();
  worker_ = nullptr;
  listener_ = nullptr;
}

void UcxListenerCore::on_connection(ucp_conn_request_h request, void* self) {
  auto* listener = static_cast<UcxListenerCore*>(self);
  try {
    listener->requests_.push_back(request);
  } catch (...) {
    ucp_listener_reject(listener->listener_, request);  // no memory to queue it: nothing unwinds into UCX
  }
}

void UcxListenerCore::report(const std::string& why) {
  const std::string line = "ferry: the listener at " + address_ + " refused a client: " + why;
  if (options_.on_refusal) {
    options_.on_refusal(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

bool UcxListenerCore::serves(const EndKind& kind) const {
  return std::any_of(served_.begin(), served_.end(), [&](const EndKind& served) { return served.matches(kind); });
}

std::string UcxListenerCore::served_list() const {
  std::string list;
  for (const EndKind& kind : served_) list += (list.empty() ? "" : ", ") + kind.describe();
  return list.empty() ? "none yet" : list;
}

void UcxListenerCore::serve(const EndKind& kind) {
  if (!serves(kind)) served_.push_back(kind);
}

void UcxListenerCore::start_handshake(ucp_conn_request_h request) {
  if (pending_.size() >= options_.max_pending_handshakes) {
    // The oldest pending client has had the longest to prove itself: a flood of silent
    // peers cycles through the slots while a prompt client completes in a round trip.
    drop(pending_.begin(),
         "it had not completed its handshake when " + std::to_string(options_.max_pending_handshakes) +
             " newer clients were waiting (EndpointOptions::max_pending_handshakes)",
         false);
  }
  ucp_conn_request_attr_t attributes{};
  attributes.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  if (ucp_conn_request_query(request, &attributes) != UCS_OK) attributes.client_address.ss_family = 0;
  std::shared_ptr<UcxConnection> connection;
  try {
    connection = UcxConnection::accept(context_, listener_, request, options_.channel.limits);
  } catch (const std::exception& error) {
    report(std::string("could not accept it: ") + error.what());
    return;
  }
  connection->set_peer_address("a client of " + address_);
  try {
    auto handshake = std::make_unique<ServerHandshake>(*connection, key_, salt_);
    pending_.push_back(Pending{std::move(connection), std::move(handshake),
                               ferry::detail::Deadline::after(options_.handshake_timeout), attributes.client_address});
  } catch (const std::exception& error) {
    report(std::string("it went away before its handshake: ") + error.what());
  }
}

void UcxListenerCore::drop(std::list<Pending>::iterator pending, const std::string& why, bool flush) {
  report(why);
  // No linger: a refusal's verdict is small and already on its way (a waiting close would
  // stall every other handshake for each refused peer).
  pending->connection->close(std::chrono::milliseconds(0), !flush);
  pending_.erase(pending);
}

void UcxListenerCore::step(std::list<Pending>::iterator pending) {
  std::optional<EndKind> kind;
  try {
    kind = pending->handshake->poll();
  } catch (const ChannelClosed& error) {
    drop(pending, std::string("it went away during its handshake: ") + error.what(), false);
    return;
  } catch (const std::exception& error) {
    drop(pending, error.what(), true);  // refused: let the verdict reach the client
    return;
  }
  if (!kind) {
    if (pending->deadline.expired()) {
      drop(pending,
           "it sent no complete handshake within " + std::to_string(options_.handshake_timeout.count()) +
               " ms (EndpointOptions::handshake_timeout)",
           false);
    }
    return;
  }
  if (!serves(*kind)) {
    const std::string reason = "it connects as " + kind->describe() + ", and this listener serves " + served_list();
    pending->handshake->refuse(Outcome::TypeMismatch, reason);
    drop(pending, reason, true);
    return;
  }
  try {
    pending->handshake->accept(options_.channel.limits);
  } catch (const std::exception& error) {
    drop(pending, std::string("it went away during its handshake: ") + error.what(), false);
    return;
  }
  pending->connection->keep_alive(pending->client);
  waiting_.push_back(Waiting{std::move(pending->connection), std::move(*kind), pending->handshake->client_limits()});
  pending_.erase(pending);
}

void UcxListenerCore::progress() {
  busy_ = false;
  progress_due_ = ferry::detail::Deadline::after(kLongestWakeFdSleep);
  while (ucp_worker_progress(worker_) != 0) {
  }
  while (!requests_.empty()) {
    ucp_conn_request_h request = requests_.front();
    requests_.pop_front();
    if (requests_.size() >= options_.max_pending_handshakes) {
      // More requests at once than may be pending: the older ones would be dropped by the
      // newer ones anyway, so they get no worker at all.
      ucp_listener_reject(listener_, request);
      report("more than " + std::to_string(options_.max_pending_handshakes) +
             " clients connected at once (EndpointOptions::max_pending_handshakes)");
      continue;
    }
    start_handshake(request);
  }
  for (auto it = pending_.begin(); it != pending_.end();) step(it++);
}

bool UcxListenerCore::arm() const {
  bool news = !requests_.empty();
  while (ucp_worker_progress(worker_) != 0) news = true;
  if (!requests_.empty()) news = true;  // the progress above may have brought some
  const ucs_status_t armed = ucp_worker_arm(worker_);
  if (armed == UCS_ERR_BUSY) news = true;
  for (const Pending& pending : pending_) {
    if (pending.connection->control_ready()) news = true;  // it arms the connection's worker
  }
  return news;
}

void UcxListenerCore::append_poll_fds(std::vector<pollfd>& fds) const {
  if (worker_ == nullptr || !context_->in_owner()) return;
  if (arm()) busy_ = true;
  fds.push_back(pollfd{wake_fd_, POLLIN, 0});
  for (const Pending& pending : pending_) fds.push_back(pollfd{pending.connection->wake_fd(), POLLIN, 0});
}

ferry::detail::Deadline UcxListenerCore::next_deadline() const {
  if (busy_) return ferry::detail::Deadline::now();
  ferry::detail::Deadline earliest = progress_due_;  // a wake-up UCX failed to give costs no more
  for (const Pending& pending : pending_) {
    if (pending.deadline.time_point() < earliest.time_point()) earliest = pending.deadline;
  }
  return earliest;
}

void UcxListenerCore::wait(const ferry::detail::Deadline& deadline) {
  std::vector<pollfd> fds;
  if (arm()) return;
  fds.push_back(pollfd{wake_fd_, POLLIN, 0});
  const ferry::detail::Deadline longest =
      ferry::detail::Deadline::after(kLongestWakeFdSleep);  // a wake-up UCX failed to give
  ferry::detail::Deadline until = longest.time_point() < deadline.time_point() ? longest : deadline;
  for (Pending& pending : pending_) {
    fds.push_back(pollfd{pending.connection->wake_fd(), POLLIN, 0});
    if (pending.deadline.time_point() < until.time_point()) until = pending.deadline;
  }
  bool sliced = false;  // cut short for the thread's wait-interruption check
  const std::chrono::nanoseconds limit = ferry::detail::sleep_limit(until, sliced);
  timespec left{};
  const timespec* timeout = nullptr;
  if (limit != std::chrono::nanoseconds::max()) {
    left = ferry::detail::to_timespec(limit);
    timeout = &left;
  }
  const int rc = ::ppoll(fds.data(), fds.size(), timeout, nullptr);
  if (rc < 0 && errno != EINTR) throw SystemError("ppoll on a ucx:// listener", errno);
  if (rc < 0 || (rc == 0 && sliced)) ferry::detail::wait_interruption_point(rc < 0);  // may throw: nothing is lost
}

bool UcxListenerCore::pump(const ferry::detail::Deadline& deadline) {
  if (worker_ == nullptr) return false;
  refuse_after_fork_here("accepting");
  for (;;) {
    progress();
    if (has_waiting_client() || deadline.expired()) return has_waiting_client();
    wait(deadline);
  }
}

std::optional<ConnectionEnds> UcxListenerCore::accept(const EndKind& kind, const ferry::detail::Deadline& deadline) {
  if (worker_ == nullptr) throw ChannelClosed("this ucx:// Listener is closed");
  refuse_after_fork_here("accepting");
  serve(kind);
  for (;;) {
    progress();
    const auto found = std::find_if(waiting_.begin(), waiting_.end(),
                                    [&](const Waiting& waiting) { return waiting.kind.matches(kind); });
    if (found != waiting_.end()) {
      Waiting taken = std::move(*found);
      waiting_.erase(found);
      // Handed out even if the client went away meanwhile: it was told it was accepted when
      // its handshake ended, so it may have sent frames and closed before this call; its
      // ends read those, then see it gone (as a local listener's do with a closed client).
      return ends_for(kind, taken.connection, options_.channel, taken.limits, false);
    }
    if (deadline.expired()) return std::nullopt;
    wait(deadline);
  }
}

class UcxScheme final : public ferry::detail::Scheme {
 public:
  std::string_view name() const noexcept override { return "ucx"; }
  std::string_view forms() const noexcept override { return kForms; }

  std::unique_ptr<ferry::detail::ListenerCore> listen(std::string_view address, std::string_view /*rest*/,
                                                      const EndpointOptions& options) const override {
    return std::make_unique<UcxListenerCore>(address, options);
  }

  ConnectionEnds connect(std::string_view address, std::string_view /*rest*/, const EndKind& kind,
                         const EndpointOptions& options) const override {
    check_transport(options, address);
    const UcxAddress parsed = parse_ucx_address(address);
    const std::string secret = shared_secret(options, address, false);
    auto context = UcxContext::get(keepalive_of(options), parsed.socket.ss_family);
    const ferry::detail::Deadline deadline = ferry::detail::Deadline::after(options.connect_timeout);
    std::string last_failure;
    for (;;) {
      auto connection = UcxConnection::connect(context, parsed.socket, parsed.length, options.channel.limits);
      connection->set_peer_address(parsed.text(parsed.port));
      try {
        const FrameLimits listener_limits =
            client_handshake(*connection, kind, options.channel.limits, secret, deadline);
        connection->keep_alive(parsed.socket);
        return ends_for(kind, connection, options.channel, listener_limits, true);
      } catch (const PeerDied&) {
        throw;
      } catch (const ChannelClosed& error) {
        last_failure = error.what();  // no listener there (yet): try again until the deadline
      }
      connection->close(std::chrono::milliseconds(0), true);
      if (deadline.expired()) {
        throw Error("no listener at " + std::string(address) + ": nothing accepted this client there within " +
                    std::to_string(options.connect_timeout.count()) + " ms (EndpointOptions::connect_timeout; last: " +
                    last_failure + "); start the listening process or check the address");
      }
      ferry::detail::interruptible_sleep_for(
          std::min<std::chrono::nanoseconds>(std::chrono::milliseconds(20), deadline.remaining()));
    }
  }
};

}  // namespace
}  // namespace ferry::ucx::detail

// Found by ferry_channels through a weak reference (endpoints/scheme_registry.cpp); the
// ferry::ucx target keeps this object in every program that links it
// (-Wl,--undefined=ferry_ucx_scheme).
extern "C" const ferry::detail::Scheme* ferry_ucx_scheme();
extern "C" const ferry::detail::Scheme* ferry_ucx_scheme() {
  static const ferry::ucx::detail::UcxScheme scheme;
  return &scheme;
}
