// The process's UCP contexts, one per address family (IPv4, IPv6): created on first use by
// a ucx:// end of that family, shared by its workers, cleaned up when the last one goes.
// UCX 1.13's TCP transport listens on one family per device, and its wire-up works only in
// the family of the address connected to, so each context is made with UCX_TCP_AF_PRIO set
// to its own. Keepalive settings reach UCX only as environment variables read by ucp_init
// (UCX 1.13 accepts UCX_TCP_KEEP* in ucp_config_modify but does not apply them), so the
// first context of a process fixes them.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <ucp/api/ucp.h>

#include "ucx_registrations.hpp"

namespace ferry::ucx::detail {

/// TCP keepalive of UCX's connections (see ferry::Keepalive, EndpointOptions::keepalive).
struct KeepaliveSettings {
  std::chrono::seconds idle{1};
  std::chrono::seconds interval{1};
  int count = 3;
};

class UcxContext {
 public:
  /// The process's context for addresses of `family` (AF_INET or AF_INET6), made with
  /// `keepalive` if none lives yet. Throws Error when called in a process forked from one
  /// that used UCX, or when UCX fails to start.
  static std::shared_ptr<UcxContext> get(const KeepaliveSettings& keepalive, int family);
  ~UcxContext();
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;

  ucp_context_h handle() const noexcept { return context_; }
  /// True in the process that created the context (a forked child must not touch UCX).
  bool in_owner() const noexcept;
  /// The keepalive settings the context was made with.
  const KeepaliveSettings& keepalive() const noexcept { return keepalive_; }
  /// The shared segments registered with this context.
  UcxRegistrations& registrations() noexcept { return *registrations_; }

 private:
  UcxContext() = default;
  ucp_context_h context_ = nullptr;
  std::unique_ptr<UcxRegistrations> registrations_;  // gone before the context
  pid_t owner_ = 0;
  KeepaliveSettings keepalive_;
};

/// How long a host may stay silent before its connections count as gone: the keepalive's
/// idle time plus its probes (idle + interval x count).
std::chrono::milliseconds keepalive_bound(const KeepaliveSettings& keepalive) noexcept;

/// The inodes of this process's sockets now (sorted): taken before UCX makes a connection's
/// sockets, so that new_sockets_to_host() can tell which are that connection's.
std::vector<ino_t> sockets();
/// The inodes of the TCP sockets connected to the host of `peer` that are not in `before`
/// (sorted): the sockets UCX made for a connection since sockets() was taken (and any that
/// another thread, or another handshake, made to that host meanwhile).
std::vector<ino_t> new_sockets_to_host(const sockaddr_storage& peer, std::span<const ino_t> before);

/// Turns TCP keepalive on (`keepalive`) for those of the sockets `among` (inodes, sorted)
/// connected to the host of `peer`: UCX 1.13 as Debian builds it leaves its TCP sockets
/// without keepalive and gives no access to them, so a connection's sockets are found in
/// /proc/self/fd once its handshake is through. Best effort: a failure changes nothing.
void keep_sockets_alive(const sockaddr_storage& peer, std::span<const ino_t> among,
                        const KeepaliveSettings& keepalive) noexcept;

/// Shuts down (SHUT_RDWR) those of the sockets `among` (inodes, sorted) connected to the host
/// of `peer` that hold data the host has not acknowledged, retransmitted at least once,
/// while nothing came from that host for `silence`: the host is gone (link down, power off),
/// which keepalive does not see on such a socket and TCP would retry for many minutes
/// (tcp_retries2). UCX then ends the endpoint's requests. True when it shut one down.
bool shut_down_unanswering_sockets(const sockaddr_storage& peer, std::span<const ino_t> among,
                                   std::chrono::milliseconds silence) noexcept;

/// Throws Error when `status` is not UCS_OK: "<what> failed: <UCX's text>".
void check_ucs(ucs_status_t status, const std::string& what);

/// Throws Error naming `what` when this process is a fork child of one that used UCX.
void refuse_after_fork(pid_t owner, const char* what);

}  // namespace ferry::ucx::detail
