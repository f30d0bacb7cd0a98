#include "ucx_connection.hpp"
#include "ferry/wait_interruption.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "ferry/detail/thread_annotations.hpp"
#include "ferry/error.hpp"

namespace ferry::ucx::detail {
namespace {

// Frames (and bytes) a sender may have in flight before send() waits for the receiver.
constexpr std::size_t kMaxFramesInFlight = 64;
constexpr std::size_t kMaxBytesInFlight = std::size_t{256} << 20;
// Progress rounds a waiter spins before it sleeps on the wake-up fd.
constexpr int kSpinRounds = 64;
// Progress rounds that let a failed endpoint's teardown finish before its worker is destroyed.
constexpr int kFailedEndpointRounds = 100;
// How often a wait for frames sent looks at whether the peer's host still answers.
constexpr std::chrono::milliseconds kHostCheck{500};

std::string status_text(ucs_status_t status) { return ucs_status_string(status); }

}  // namespace

UcxConnection::UcxConnection(std::shared_ptr<UcxContext> context, FrameLimits limits)
    : context_(std::move(context)), limits_(limits), owner_(::getpid()) {}

void UcxConnection::create_worker() {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;  // every call is under mutex_
  check_ucs(ucp_worker_create(context_->handle(), &params, &worker_), "ucp_worker_create");
  check_ucs(ucp_worker_get_efd(worker_, &wake_fd_), "ucp_worker_get_efd");
  const std::pair<unsigned, ucp_am_recv_callback_t> handlers[] = {{kControlAm, &UcxConnection::on_control},
                                                                  {kFrameAm, &UcxConnection::on_frame},
                                                                  {kCopyAm, &UcxConnection::on_copy},
                                                                  {kDeliveredAm, &UcxConnection::on_delivered}};
  for (const auto& [id, callback] : handlers) {
    ucp_am_handler_param_t handler{};
    handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                         UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    handler.id = id;
    handler.cb = callback;
    handler.arg = this;
    handler.flags = UCP_AM_FLAG_WHOLE_MSG;
    check_ucs(ucp_worker_set_am_recv_handler(worker_, &handler), "ucp_worker_set_am_recv_handler");
  }
}

void UcxConnection::create_endpoint(const ucp_ep_params_t& base) {
  ucp_ep_params_t params = base;
  params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxConnection::on_error;
  params.err_handler.arg = this;
  check_ucs(ucp_ep_create(worker_, &params, &ep_), "ucp_ep_create");
}

std::shared_ptr<UcxConnection> UcxConnection::connect(std::shared_ptr<UcxContext> context,
                                                      const sockaddr_storage& address, socklen_t length,
                                                      FrameLimits limits) {
  std::shared_ptr<UcxConnection> connection(new UcxConnection(std::move(context), limits));
  connection->create_worker();
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address);
  params.sockaddr.addrlen = length;
  connection->sockets_before_ = sockets();
  connection->create_endpoint(params);
  return connection;
}

std::shared_ptr<UcxConnection> UcxConnection::accept(std::shared_ptr<UcxContext> context, ucp_listener_h listener,
                                                     ucp_conn_request_h request, FrameLimits limits) {
  std::shared_ptr<UcxConnection> connection(new UcxConnection(std::move(context), limits));
  try {
    connection->create_worker();
    connection->sockets_before_ = sockets();
  } catch (...) {
    ucp_listener_reject(listener, request);
    throw;
  }
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
  params.conn_request = request;
  try {
    connection->create_endpoint(params);
  } catch (...) {
    // UCX consumed the request (a reject now would free it twice). The failed endpoint's
    // teardown is still queued on the worker: progress lets it finish, and the destructor
    // then destroys the worker (destroying it at once aborted inside UCX 1.13; leaving it
    // leaked about 6 fds per peer that connected and vanished before it was accepted).
    for (int round = 0; round < kFailedEndpointRounds; ++round) ucp_worker_progress(connection->worker_);
    throw;
  }
  return connection;
}

UcxConnection::~UcxConnection() {
  if (!context_ || !context_->in_owner() || ::getpid() != owner_) return;  // a fork child: hands off
  close(std::chrono::milliseconds(1000));
  if (worker_ != nullptr) {
    {
      // Receives still in flight (the sender died mid-message) end as cancelled.
      const ferry::detail::MutexLock lock(mutex_);
      for (const RendezvousReceive& receive : receives_) ucp_request_cancel(worker_, receive.request);
      for (int round = 0; round < 1000 && !receives_.empty(); ++round) progress_locked();
    }
    ucp_worker_destroy(worker_);
  }
}

void UcxConnection::progress_locked() {
  while (ucp_worker_progress(worker_) != 0) {
  }
}

bool UcxConnection::arm_locked() {
  progress_locked();
  const ucs_status_t status = ucp_worker_arm(worker_);
  if (status == UCS_ERR_BUSY) return false;
  check_ucs(status, "ucp_worker_arm");
  return true;
}

// Gives `lock` up while it sleeps and takes it back, which the analysis cannot follow through
// a lock passed by reference: its callers are checked (FERRY_REQUIRES), its body is not.
template <class Ready>
bool UcxConnection::wait_until(ferry::detail::MutexLock& lock, const ferry::detail::Deadline& deadline, Ready ready,
                               ferry::detail::EndStats* charged) FERRY_NO_THREAD_SAFETY_ANALYSIS {
  // Requests in flight point into the caller's memory: a wait is never abandoned midway.
  const ferry::detail::WaitInterruptionSuspended uninterrupted;
  for (int round = 0;; ++round) {
    progress_locked();
    if (ready()) return true;
    if (deadline.expired()) return false;
    if (round < kSpinRounds) continue;
    if (!arm_locked()) continue;  // events arrived meanwhile
    if (ready()) return true;
    const ferry::detail::Deadline sleep = sleep_until(deadline);
    lock.unlock();
    const bool woke = ferry::detail::wait_for_fd(wake_fd_, POLLIN, sleep, charged);
    lock.lock();
    if (!woke) {
      check_host_locked();
      if (deadline.expired()) {
        progress_locked();
        return ready();
      }
    }
  }
}

ferry::detail::Deadline UcxConnection::sleep_until(const ferry::detail::Deadline& deadline) const {
  const ferry::detail::Deadline longest =
      ferry::detail::Deadline::after(kLongestWakeFdSleep);  // a wake-up UCX failed to give
  const ferry::detail::Deadline until = longest.time_point() < deadline.time_point() ? longest : deadline;
  if (!watched_host_ || outgoing_.empty()) return until;
  const auto now = std::chrono::steady_clock::now();
  if (next_host_check_ <= now) return ferry::detail::Deadline::now();
  const ferry::detail::Deadline check =
      ferry::detail::Deadline::after(std::chrono::duration_cast<std::chrono::nanoseconds>(next_host_check_ - now));
  return check.time_point() < until.time_point() ? check : until;
}

void UcxConnection::keep_alive(const sockaddr_storage& peer) {
  const ferry::detail::MutexLock lock(mutex_);
  try {
    own_sockets_ = new_sockets_to_host(peer, sockets_before_);
    watched_host_ = peer;
  } catch (const std::bad_alloc&) {
    // No memory for the list: no keepalive and no watch (a vanished host is seen at tcp_retries2).
  }
  sockets_before_ = {};
  keep_sockets_alive(peer, own_sockets_, context_->keepalive());
  host_silence_ = keepalive_bound(context_->keepalive());
}

void UcxConnection::check_host_locked() {
  if (!watched_host_ || outgoing_.empty() || failed_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now < next_host_check_) return;
  next_host_check_ = now + kHostCheck;
  if (!shut_down_unanswering_sockets(*watched_host_, own_sockets_, host_silence_)) return;
  if (failure_.empty()) {
    failure_ = "its host acknowledged nothing for " + std::to_string(host_silence_.count()) +
               " ms while data waited for it: link down or host gone; EndpointOptions::keepalive sets the time";
  }
  failed_ = true;
  progress_locked();  // UCX sees its socket shut down and ends the endpoint's requests
}

void UcxConnection::on_error(void* self, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* connection = static_cast<UcxConnection*>(self);
  connection->failed_ = true;
  try {
    if (connection->failure_.empty()) connection->failure_ = status_text(status);
  } catch (...) {
    // No memory for the text: failed_ says it all.
  }
}

bool UcxConnection::failed() {
  const ferry::detail::MutexLock lock(mutex_);
  progress_locked();
  return failed_;
}

std::string UcxConnection::failure() {
  const ferry::detail::MutexLock lock(mutex_);
  return failure_;
}

void UcxConnection::break_protocol(const std::string& reason) noexcept { break_protocol(reason.c_str()); }

void UcxConnection::break_protocol(const char* reason) noexcept {
  if (!broken_.empty()) return;
  try {
    broken_ = reason;
  } catch (...) {
    broken_.assign("out of memory");  // fits the short-string buffer: never allocates
  }
}

template <class Body>
ucs_status_t UcxConnection::guarded(void* self, Body body) noexcept {
  auto* connection = static_cast<UcxConnection*>(self);
  try {
    return body(*connection);
  } catch (const std::exception& error) {
    connection->break_protocol(error.what());
  } catch (...) {
    connection->break_protocol("an unknown exception in a UCX callback");
  }
  return UCS_OK;  // the message is dropped; a rendezvous sender is told it was not taken
}

bool UcxConnection::refuse_unauthenticated(unsigned id) noexcept {
  if (authenticated_ || accepted_before_handshake(id)) return false;
  break_protocol("a message other than the handshake's arrived before the peer proved the shared secret");
  return true;
}

void UcxConnection::authenticate() noexcept {
  const ferry::detail::MutexLock lock(mutex_);
  authenticated_ = true;
}

bool UcxConnection::authenticated() {
  const ferry::detail::MutexLock lock(mutex_);
  return authenticated_;
}

void UcxConnection::authenticate_if(std::function<bool(std::span<const std::byte>)> check) {
  const ferry::detail::MutexLock lock(mutex_);
  authenticator_ = std::move(check);
}

// ---- sending -------------------------------------------------------------------

void UcxConnection::send_am(unsigned id, const void* header, std::size_t header_bytes, const void* data,
                            std::size_t bytes, bool rendezvous, std::vector<void*>& requests, ucp_mem_h memh) {
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = rendezvous ? UCP_AM_SEND_FLAG_RNDV : 0;
  if (memh != nullptr) {
    params.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    params.memh = memh;
  }
  ucs_status_ptr_t request = ucp_am_send_nbx(ep_, id, header, header_bytes, data, bytes, &params);
  if (UCS_PTR_IS_ERR(request)) {
    throw ChannelClosed("cannot send on ucx://" + peer_address() + ": " + status_text(UCS_PTR_STATUS(request)));
  }
  if (request != nullptr) requests.push_back(request);
}

void UcxConnection::send_control(std::span<const std::byte> message) {
  const ferry::detail::MutexLock lock(mutex_);
  if (failed_) throw ChannelClosed("the ucx peer is gone: " + failure_);
  // Queued with the frames sent (its buffer lives until UCX is done with it); it leaves as
  // the worker progresses, in the next wait or at close. Never waits: a listener drives
  // many handshakes, and a peer that does not read must stall none of them.
  Outgoing& control = outgoing_.emplace_back();
  try {
    control.buffer.assign(message.begin(), message.end());
    send_am(kControlAm, nullptr, 0, control.buffer.data(), control.buffer.size(), false, control.requests);
  } catch (...) {
    if (control.requests.empty()) outgoing_.pop_back();
    throw;
  }
  reap_locked();
}

void UcxConnection::reap_locked() {
  for (Outgoing& frame : outgoing_) {
    std::erase_if(frame.requests, [&](void* request) {
      const ucs_status_t status = ucp_request_check_status(request);
      if (status == UCS_INPROGRESS) return false;
      if (status != UCS_OK && send_failure_ == UCS_OK) send_failure_ = status;
      ucp_request_free(request);
      return true;
    });
  }
  while (!outgoing_.empty() && outgoing_.front().requests.empty()) outgoing_.pop_front();
}

std::size_t UcxConnection::outgoing_bytes_locked() const noexcept {
  std::size_t bytes = 0;
  for (const Outgoing& frame : outgoing_) bytes += frame.bytes;
  return bytes;
}

bool UcxConnection::flush(const ferry::detail::Deadline& deadline, ferry::detail::EndStats* charged) {
  ferry::detail::MutexLock lock(mutex_);
  const bool done = wait_until(
      lock, deadline,
      [&]() FERRY_REQUIRES(mutex_) {
        reap_locked();
        return outgoing_.empty() || failed_ || send_failure_ != UCS_OK;
      },
      charged);
  if (send_failure_ != UCS_OK || (failed_ && !outgoing_.empty())) {
    throw ChannelClosed("the receiver at ucx://" + peer_address() + " is gone (" +
                        (failure_.empty() ? status_text(send_failure_) : failure_) +
                        "): messages sent last may not have arrived");
  }
  return done;
}

bool UcxConnection::send_frame(std::span<const iovec> parts, std::span<const iovec> copies,
                               std::span<const std::shared_ptr<Storage>> owners,
                               const ferry::detail::Deadline& deadline, ferry::detail::EndStats* charged) {
  if (copies.size() > kMaxCopies) {
    throw Error("a message over ucx:// carries at most " + std::to_string(kMaxCopies) + " tensor storages, not " +
                std::to_string(copies.size()) + "; send fewer per message");
  }
  ferry::detail::MutexLock lock(mutex_);
  refuse_after_fork(owner_, "sending");
  const auto gone = [&] {
    throw ChannelClosed("cannot send: the receiver at ucx://" + peer_address() + " is gone (" +
                        (failure_.empty() ? status_text(send_failure_) : failure_) + ")");
  };
  // Back-pressure: a receiver that does not read holds the frames sent to it.
  const bool room = wait_until(
      lock, deadline,
      [&]() FERRY_REQUIRES(mutex_) {
        reap_locked();
        return failed_ || send_failure_ != UCS_OK ||
               (outgoing_.size() < kMaxFramesInFlight && outgoing_bytes_locked() < kMaxBytesInFlight);
      },
      charged);
  if (failed_ || send_failure_ != UCS_OK) gone();
  if (!room) return false;

  std::size_t frame_bytes = 0;
  for (const iovec& part : parts) frame_bytes += part.iov_len;
  std::size_t inline_bytes = 0;
  std::size_t total_bytes = frame_bytes;
  for (const iovec& copy : copies) {
    if (copy.iov_len <= kInlineCopyLimit) inline_bytes += copy.iov_len;
    total_bytes += copy.iov_len;
  }
  // The message: the AM header (the frame's size and one descriptor per copy), then the
  // frame, then the small copies.
  Outgoing& frame = outgoing_.emplace_back();
  frame.bytes = total_bytes;
  frame.owners.assign(owners.begin(), owners.end());
  const std::size_t header_bytes = sizeof(FrameAmHeader) + copies.size() * sizeof(CopyDescriptor);
  frame.buffer.resize(header_bytes + frame_bytes + inline_bytes);
  std::byte* out = frame.buffer.data();
  const FrameAmHeader header{frame_bytes, static_cast<std::uint32_t>(copies.size()), 0};
  std::memcpy(out, &header, sizeof header);
  out += sizeof header;
  for (const iovec& copy : copies) {
    const CopyDescriptor descriptor{copy.iov_len, copy.iov_len <= kInlineCopyLimit ? 1u : 0u};
    std::memcpy(out, &descriptor, sizeof descriptor);
    out += sizeof descriptor;
  }
  for (const iovec& part : parts) {
    std::memcpy(out, part.iov_base, part.iov_len);
    out += part.iov_len;
  }
  for (const iovec& copy : copies) {
    if (copy.iov_len > kInlineCopyLimit) continue;
    if (copy.iov_len > 0) std::memcpy(out, copy.iov_base, copy.iov_len);
    out += copy.iov_len;
  }
  // Once the frame message is started the frame is sent whole: a failure after it is the
  // peer's death, reported by the next send.
  send_am(kFrameAm, frame.buffer.data(), header_bytes, frame.buffer.data() + header_bytes,
          frame.buffer.size() - header_bytes, false, frame.requests);
  for (std::size_t i = 0; i < copies.size(); ++i) {
    const iovec& copy = copies[i];
    if (copy.iov_len <= kInlineCopyLimit) continue;
    const ucp_mem_h memh = i < owners.size() ? context_->registrations().handle_for(*owners[i]) : nullptr;
    try {
      send_am(kCopyAm, nullptr, 0, copy.iov_base, copy.iov_len, true, frame.requests, memh);  // the sender's pages
    } catch (const ChannelClosed&) {
      if (send_failure_ == UCS_OK) send_failure_ = UCS_ERR_CONNECTION_RESET;
      break;
    }
  }
  // Until a thread of its own progresses the worker, a rendezvous moves only while the
  // sender progresses too: wait until the frame left (the receiver took its large copies),
  // or until `deadline`. A frame still in flight then stays started (its storages kept by
  // `owners`): later sends and flush() move it on, and a send waits for room first.
  wait_until(
      lock, deadline,
      [&]() FERRY_REQUIRES(mutex_) {
        reap_locked();
        return outgoing_.empty() || failed_ || send_failure_ != UCS_OK;
      },
      charged);
  return true;
}

void UcxConnection::send_delivered(std::uint64_t sequence) noexcept {
  const ferry::detail::MutexLock lock(mutex_);
  if (failed_ || ep_ == nullptr || owner_ != ::getpid()) return;
  try {
    // Queued with the frames sent, so that its buffer lives until UCX is done with it.
    Outgoing& report = outgoing_.emplace_back();
    report.buffer.resize(sizeof sequence);
    std::memcpy(report.buffer.data(), &sequence, sizeof sequence);
    send_am(kDeliveredAm, nullptr, 0, report.buffer.data(), report.buffer.size(), false, report.requests);
    reap_locked();
  } catch (const std::exception&) {
    // The peer is gone (its death is reported at the next operation) or memory ran out:
    // the writer then sees fewer deliveries, never more.
    if (!outgoing_.empty() && outgoing_.back().requests.empty()) outgoing_.pop_back();
  }
}

std::uint64_t UcxConnection::delivered() {
  const ferry::detail::MutexLock lock(mutex_);
  if (worker_ != nullptr && owner_ == ::getpid()) {
    progress_locked();
    reap_locked();
  }
  return delivered_;
}

// ---- receiving -----------------------------------------------------------------

ucs_status_t UcxConnection::on_delivered(void* self, const void* /*header*/, std::size_t /*header_length*/, void* data,
                                         std::size_t length, const ucp_am_recv_param_t* param) {
  return guarded(self, [&](UcxConnection& connection) {
    if (connection.refuse_unauthenticated(kDeliveredAm)) return UCS_OK;
    const bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    const auto sequence = parse_delivered(
        rendezvous ? std::span<const std::byte>() : std::span(static_cast<const std::byte*>(data), length), rendezvous);
    if (!sequence) {
      connection.break_protocol("a delivery report of " + std::to_string(length) + " bytes");
      return UCS_OK;
    }
    connection.delivered_ = std::max(connection.delivered_, *sequence);
    return UCS_OK;
  });
}

ucs_status_t UcxConnection::on_control(void* self, const void* /*header*/, std::size_t /*header_length*/, void* data,
                                       std::size_t length, const ucp_am_recv_param_t* param) {
  return guarded(self, [&](UcxConnection& connection) {
    const bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if (!control_message_fits(length, rendezvous, connection.controls_.size())) {
      connection.break_protocol("a handshake message of " + std::to_string(length) + " bytes, or too many at once");
      return UCS_OK;  // dropped
    }
    const auto* bytes = static_cast<const std::byte*>(data);
    if (!connection.authenticated_ && connection.authenticator_) {
      const auto check = std::move(connection.authenticator_);
      connection.authenticator_ = nullptr;
      if (check(std::span(bytes, length))) connection.authenticated_ = true;
    }
    connection.controls_.emplace_back(bytes, bytes + length);
    return UCS_OK;
  });
}

void UcxConnection::receive_rendezvous(void* descriptor, void* into, std::size_t length, IncomingFrame& frame,
                                       ucp_mem_h memh) {
  RendezvousReceive& receive = receives_.emplace_back(RendezvousReceive{this, &frame});
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  if (memh != nullptr) {
    params.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    params.memh = memh;
  }
  params.user_data = &receive;
  params.cb.recv_am = [](void* request, ucs_status_t status, std::size_t /*length*/, void* user_data) {
    auto* done = static_cast<RendezvousReceive*>(user_data);
    UcxConnection* connection = done->connection;
    --done->frame->in_flight;
    if (status != UCS_OK) connection->break_protocol("a rendezvous receive failed");
    connection->receives_.remove_if([done](const RendezvousReceive& r) { return &r == done; });
    ucp_request_free(request);
  };
  ++frame.in_flight;
  ucs_status_ptr_t request = ucp_am_recv_data_nbx(worker_, descriptor, into, length, &params);
  receive.request = request;
  if (request == nullptr) {  // completed at once: no callback
    --frame.in_flight;
    receives_.pop_back();
  } else if (UCS_PTR_IS_ERR(request)) {
    --frame.in_flight;
    receives_.pop_back();
    break_protocol("ucp_am_recv_data_nbx failed: " + status_text(UCS_PTR_STATUS(request)));
  }
}

ucs_status_t UcxConnection::on_frame(void* self, const void* header, std::size_t header_length, void* data,
                                     std::size_t length, const ucp_am_recv_param_t* param) {
  return guarded(self, [&](UcxConnection& connection) {
    if (connection.refuse_unauthenticated(kFrameAm)) return UCS_OK;
    if (!connection.broken_.empty()) return UCS_OK;  // a broken connection takes nothing more
    const char* why = nullptr;
    const auto plan = parse_frame_am(std::span(static_cast<const std::byte*>(header), header_length), length,
                                     connection.limits_, &why);
    if (!plan) {
      connection.break_protocol(why);
      return UCS_OK;
    }
    IncomingFrame& frame = connection.frames_.emplace_back();
    try {
      frame.descriptors.resize(plan->header.copy_count);
      for (std::size_t i = 0; i < frame.descriptors.size(); ++i) frame.descriptors[i] = descriptor_at(*plan, i);
      frame.remote_expected = plan->remote_count;
      frame.bytes.resize(length);  // the frame, then the inline copies (split by UcxFrameReader)
    } catch (...) {
      connection.frames_.pop_back();
      throw;
    }
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
      connection.receive_rendezvous(data, frame.bytes.data(), length, frame, nullptr);  // a heap buffer
    } else {
      std::memcpy(frame.bytes.data(), data, length);
    }
    return UCS_OK;
  });
}

ucs_status_t UcxConnection::on_copy(void* self, const void* /*header*/, std::size_t /*header_length*/, void* data,
                                    std::size_t length, const ucp_am_recv_param_t* param) {
  return guarded(self, [&](UcxConnection& connection) {
    if (connection.refuse_unauthenticated(kCopyAm)) return UCS_OK;
    if (!connection.broken_.empty()) return UCS_OK;
    // The oldest frame still waiting for copy messages takes it (messages on one endpoint
    // arrive in order).
    const auto waiting = std::find_if(connection.frames_.begin(), connection.frames_.end(),
                                      [](const IncomingFrame& frame) { return frame.remote_expected > 0; });
    if (waiting == connection.frames_.end()) {
      connection.break_protocol("a storage message arrived that no frame announced");
      return UCS_OK;
    }
    IncomingFrame& frame = *waiting;
    // Which descriptor: the first remote one not started yet.
    std::size_t remote_seen = 0;
    std::size_t remote_total = 0;
    for (const CopyDescriptor& descriptor : frame.descriptors) remote_total += descriptor.inline_copy == 0 ? 1 : 0;
    const std::size_t index_among_remote = remote_total - frame.remote_expected;
    std::size_t index = 0;
    for (; index < frame.descriptors.size(); ++index) {
      if (frame.descriptors[index].inline_copy != 0) continue;
      if (remote_seen++ == index_among_remote) break;
    }
    --frame.remote_expected;
    if (frame.descriptors[index].nbytes != length) {
      connection.break_protocol("a storage message of " + std::to_string(length) + " bytes where the frame announced " +
                                std::to_string(frame.descriptors[index].nbytes));
      return UCS_OK;
    }
    std::shared_ptr<Storage> storage;
    try {
      storage = Storage::allocate(length, Device::SharedCpu);
    } catch (const std::exception& error) {
      connection.break_protocol(std::string("no memory for a received storage: ") + error.what());
      return UCS_OK;
    }
    if (frame.copies.size() < frame.descriptors.size()) frame.copies.resize(frame.descriptors.size());
    frame.copies[index] = storage;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
      connection.receive_rendezvous(data, storage->data(), length, frame,
                                    connection.context_->registrations().handle_for(*storage));
    } else if (length > 0) {
      std::memcpy(storage->data(), data, length);
    }
    return UCS_OK;
  });
}

std::optional<std::vector<std::byte>> UcxConnection::poll_control() {
  return receive_control(ferry::detail::Deadline::now());
}

std::optional<std::vector<std::byte>> UcxConnection::receive_control(const ferry::detail::Deadline& deadline) {
  ferry::detail::MutexLock lock(mutex_);
  wait_until(lock, deadline, [&]() FERRY_REQUIRES(mutex_) {
    reap_locked();
    return !controls_.empty() || failed_ || !broken_.empty() || send_failure_ != UCS_OK;
  });
  if (!controls_.empty()) {
    std::vector<std::byte> message = std::move(controls_.front());
    controls_.pop_front();
    return message;
  }
  if (!broken_.empty()) throw ProtocolError("ucx handshake: " + broken_);
  if (failed_) throw ChannelClosed("the ucx peer is gone (" + failure_ + ")");
  if (send_failure_ != UCS_OK) throw ChannelClosed("the ucx peer is gone (" + status_text(send_failure_) + ")");
  return std::nullopt;
}

std::optional<IncomingFrame> UcxConnection::receive_frame(const ferry::detail::Deadline& deadline,
                                                          ferry::detail::EndStats* charged) {
  ferry::detail::MutexLock lock(mutex_);
  refuse_after_fork(owner_, "receiving");
  const auto ready = [&]() FERRY_REQUIRES(mutex_) {
    reap_locked();  // the handshake's last messages, sent without waiting
    return (!frames_.empty() && frames_.front().complete()) || failed_ || !broken_.empty();
  };
  wait_until(lock, deadline, ready, charged);
  if (!frames_.empty() && frames_.front().complete()) {
    IncomingFrame frame = std::move(frames_.front());
    frames_.pop_front();
    return frame;
  }
  if (!broken_.empty()) throw ProtocolError("a ucx peer broke the protocol: " + broken_);
  if (failed_) {
    throw PeerDied("the sender at ucx://" + peer_address() + " vanished without closing its end (" + failure_ +
                   "); a partial message was dropped if one was arriving");
  }
  return std::nullopt;
}

bool UcxConnection::frame_ready() {
  ferry::detail::MutexLock lock(mutex_);
  for (;;) {
    progress_locked();
    if ((!frames_.empty() && frames_.front().complete()) || failed_ || !broken_.empty()) return true;
    if (arm_locked()) return false;
  }
}

bool UcxConnection::control_ready() {
  ferry::detail::MutexLock lock(mutex_);
  for (;;) {
    progress_locked();
    if (!controls_.empty() || failed_ || !broken_.empty()) return true;
    if (arm_locked()) return false;
  }
}

std::string UcxConnection::peer_address() { return peer_name_; }

void UcxConnection::close(std::chrono::milliseconds linger, bool force) noexcept {
  ferry::detail::MutexLock lock(mutex_);
  if (ep_ == nullptr || ::getpid() != owner_) return;
  // Flush what was sent (the end-of-stream frame) onto the wire, then close at once: a
  // flushing close would wait for the peer to progress its worker, that is for a receiver
  // to read, which a closing sender must not depend on.
  ucp_request_param_t params{};
  const ferry::detail::Deadline until = ferry::detail::Deadline::after(linger);
  if (!force && !failed_) {
    try {
      wait_until(lock, until, [&]() FERRY_REQUIRES(mutex_) {
        reap_locked();
        return outgoing_.empty() || failed_;
      });
    } catch (...) {
    }
  }
  if (!force && !failed_) {
    ucs_status_ptr_t flush = ucp_ep_flush_nbx(ep_, &params);
    if (flush != nullptr && !UCS_PTR_IS_ERR(flush)) {
      try {
        wait_until(lock, until,
                   [&]() FERRY_REQUIRES(mutex_) { return ucp_request_check_status(flush) != UCS_INPROGRESS; });
      } catch (...) {
      }
      ucp_request_free(flush);
    }
  }
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t request = ucp_ep_close_nbx(ep_, &params);
  ep_ = nullptr;
  if (request == nullptr || UCS_PTR_IS_ERR(request)) return;
  try {
    wait_until(lock, ferry::detail::Deadline::after(std::chrono::seconds(1)),
               [&]() FERRY_REQUIRES(mutex_) { return ucp_request_check_status(request) != UCS_INPROGRESS; });
  } catch (...) {
  }
  ucp_request_free(request);  // a close still in progress completes inside UCX
  // Sends that did not finish ended with the endpoint: let their storages go.
  reap_locked();
  for (Outgoing& frame : outgoing_) {
    for (void* pending : frame.requests) {
      ucp_request_cancel(worker_, pending);
      ucp_request_free(pending);
    }
  }
  outgoing_.clear();
}

}  // namespace ferry::ucx::detail
