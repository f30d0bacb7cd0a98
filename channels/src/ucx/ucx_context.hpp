// The process's UCP context: created on first use by a ucx:// end, shared by every worker,
// cleaned up when the last one goes. Keepalive settings reach UCX only as environment
// variables read by ucp_init (UCX 1.13 accepts UCX_TCP_KEEP* in ucp_config_modify but does
// not apply them), so the first context of a process fixes them.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>

#include <ucp/api/ucp.h>

namespace ferry::ucx::detail {

/// TCP keepalive of UCX's connections (see ferry::Keepalive, EndpointOptions::keepalive).
struct KeepaliveSettings {
  std::chrono::seconds idle{1};
  std::chrono::seconds interval{1};
  int count = 3;
};

class UcxContext {
 public:
  /// The process's context, made with `keepalive` if none lives yet. Throws Error when
  /// called in a process forked from one that used UCX, or when UCX fails to start.
  static std::shared_ptr<UcxContext> get(const KeepaliveSettings& keepalive);
  ~UcxContext();
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;

  ucp_context_h handle() const noexcept { return context_; }
  /// True in the process that created the context (a forked child must not touch UCX).
  bool in_owner() const noexcept;
  /// The keepalive settings the context was made with.
  const KeepaliveSettings& keepalive() const noexcept { return keepalive_; }

 private:
  UcxContext() = default;
  ucp_context_h context_ = nullptr;
  pid_t owner_ = 0;
  KeepaliveSettings keepalive_;
};

/// Turns TCP keepalive on (`keepalive`, and TCP_USER_TIMEOUT of the same total, so that
/// data left unacknowledged fails as soon) for this process's TCP sockets connected to the
/// host of `peer` (its port aside). UCX 1.13 as Debian builds it leaves its TCP sockets
/// without keepalive and gives no access to them: a connection's sockets are found in
/// /proc/self/fd once its handshake is through. Best effort: a failure changes nothing.
void keep_sockets_alive(const sockaddr_storage& peer, const KeepaliveSettings& keepalive) noexcept;

/// Throws Error when `status` is not UCS_OK: "<what> failed: <UCX's text>".
void check_ucs(ucs_status_t status, const std::string& what);

/// Throws Error naming `what` when this process is a fork child of one that used UCX.
void refuse_after_fork(pid_t owner, const char* what);

}  // namespace ferry::ucx::detail
