#include "ucx_context.hpp"

#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <ucs/config/global_opts.h>

#include "ferry/detail/thread_annotations.hpp"
#include "ferry/error.hpp"

namespace ferry::ucx::detail {
namespace {

ferry::detail::Mutex context_mutex;
std::array<std::weak_ptr<UcxContext>, 2> live_contexts;  // [0]: IPv4, [1]: IPv6

// Sets `name` unless the user already did (their setting wins).
void default_env(const char* name, const std::string& value) {
  // NOLINTNEXTLINE(concurrency-mt-unsafe): UCX reads its configuration only from the environment
  if (::setenv(name, value.c_str(), 0) != 0) throw Error(std::string("setenv(") + name + ") failed");
}

// Sets an environment variable for its lifetime unless the user set it (their setting
// wins), then removes it again.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name), set_(std::getenv(name) == nullptr) {
    // NOLINTNEXTLINE(concurrency-mt-unsafe): UCX reads its configuration only from the environment
    if (set_ && ::setenv(name, value, 0) != 0) throw Error(std::string("setenv(") + name + ") failed");
  }
  ~ScopedEnv() {
    // NOLINTNEXTLINE(concurrency-mt-unsafe): UCX reads its configuration only from the environment
    if (set_) (void)::unsetenv(name_);  // cannot fail for a valid name
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool set_;
};

}  // namespace

void check_ucs(ucs_status_t status, const std::string& what) {
  if (status != UCS_OK) throw Error(what + " failed: " + ucs_status_string(status));
}

void refuse_after_fork(pid_t owner, const char* what) {
  if (owner != 0 && owner != ::getpid()) {
    throw Error(std::string(what) +
                ": this ucx end was created in another process and carried across fork; UCX state must not be "
                "used by a forked child: connect to the ucx:// address from the child instead");
  }
}

namespace {

// The peer's IP address as 16 bytes (IPv4 mapped into IPv6), or false for another family.
bool ip_of(const sockaddr_storage& address, in6_addr& ip) {
  if (address.ss_family == AF_INET6) {
    ip = reinterpret_cast<const sockaddr_in6*>(&address)->sin6_addr;
    return true;
  }
  if (address.ss_family != AF_INET) return false;
  ip = in6_addr{};
  ip.s6_addr[10] = 0xff;
  ip.s6_addr[11] = 0xff;
  std::memcpy(&ip.s6_addr[12], &reinterpret_cast<const sockaddr_in*>(&address)->sin_addr, 4);
  return true;
}

// Calls `each(fd)` for every open descriptor of this process, found in /proc/self/fd;
// nothing when /proc cannot be read.
template <class Each>
void for_each_fd(Each each) {
  const std::unique_ptr<DIR, int (*)(DIR*)> fds(::opendir("/proc/self/fd"), &::closedir);
  if (!fds) return;
  const int self = ::dirfd(fds.get());
  while (const dirent* entry = ::readdir(fds.get())) {
    char* end = nullptr;
    const long number = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || number == self) continue;
    each(static_cast<int>(number));
  }
}

// Calls `each(fd, peer)` for every connected TCP stream socket of this process. A
// descriptor that is not a socket is passed over by getsockopt, which touches no file.
template <class Each>
void for_each_tcp_socket(Each each) {
  for_each_fd([&](int fd) {
    int type = 0;  // getsockopt fails (ENOTSOCK) for what is not a socket, without touching files
    socklen_t length = sizeof type;
    if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0 || type != SOCK_STREAM) return;
    sockaddr_storage other{};
    socklen_t other_length = sizeof other;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&other), &other_length) != 0) return;
    each(fd, other);
  });
}

// Calls `each(fd)` for every TCP socket of this process connected to the host of `peer`
// (its port aside); nothing for another family.
template <class Each>
void for_each_socket_to_host(const sockaddr_storage& peer, Each each) {
  in6_addr wanted{};
  if (!ip_of(peer, wanted)) return;
  for_each_tcp_socket([&](int fd, const sockaddr_storage& other) {
    in6_addr ip{};
    if (ip_of(other, ip) && std::memcmp(&ip, &wanted, sizeof ip) == 0) each(fd);
  });
}

ino_t inode_of(int fd) noexcept {
  struct stat status {};
  return ::fstat(fd, &status) == 0 ? status.st_ino : 0;
}

// Calls `each(fd)` for the sockets `among` (inodes, sorted) that are connected to the host of `peer`.
template <class Each>
void for_each_own_socket(const sockaddr_storage& peer, std::span<const ino_t> among, Each each) {
  for_each_socket_to_host(peer, [&](int fd) {
    if (std::binary_search(among.begin(), among.end(), inode_of(fd))) each(fd);
  });
}

}  // namespace

void keep_sockets_alive(const sockaddr_storage& peer, std::span<const ino_t> among,
                        const KeepaliveSettings& keepalive) noexcept {
  const int idle = static_cast<int>(keepalive.idle.count());
  const int interval = static_cast<int>(keepalive.interval.count());
  const int count = keepalive.count;
  for_each_own_socket(peer, among, [&](int fd) {
    const int on = 1;
    (void)::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
  });
}

std::chrono::milliseconds keepalive_bound(const KeepaliveSettings& keepalive) noexcept {
  return std::chrono::duration_cast<std::chrono::milliseconds>(keepalive.idle + keepalive.interval * keepalive.count);
}

std::vector<ino_t> sockets() {
  std::vector<ino_t> inodes;
  for_each_fd([&](int fd) {
    struct stat status {};
    if (::fstat(fd, &status) == 0 && S_ISSOCK(status.st_mode)) inodes.push_back(status.st_ino);
  });
  std::sort(inodes.begin(), inodes.end());
  return inodes;
}

std::vector<ino_t> new_sockets_to_host(const sockaddr_storage& peer, std::span<const ino_t> before) {
  std::vector<ino_t> inodes;
  for_each_socket_to_host(peer, [&](int fd) {
    const ino_t inode = inode_of(fd);
    if (!std::binary_search(before.begin(), before.end(), inode)) inodes.push_back(inode);
  });
  std::sort(inodes.begin(), inodes.end());
  return inodes;
}

bool shut_down_unanswering_sockets(const sockaddr_storage& peer, std::span<const ino_t> among,
                                   std::chrono::milliseconds silence) noexcept {
  bool shut = false;
  for_each_own_socket(peer, among, [&](int fd) {
    tcp_info info{};
    socklen_t length = sizeof info;
    if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) return;
    // Data out, retransmitted (the retransmission timer expired), and nothing at all from
    // that host (no acknowledgement, no window probe answered, no keepalive reply) for
    // `silence`; a peer that is alive but does not read answers window probes, so its
    // connection stays.
    if (info.tcpi_unacked > 0 && info.tcpi_backoff > 0 &&
        std::chrono::milliseconds(info.tcpi_last_ack_recv) >= silence && ::shutdown(fd, SHUT_RDWR) == 0) {
      shut = true;
    }
  });
  return shut;
}

bool UcxContext::in_owner() const noexcept { return owner_ == ::getpid(); }

std::shared_ptr<UcxContext> UcxContext::get(const KeepaliveSettings& keepalive, int family) {
  const ferry::detail::MutexLock lock(context_mutex);
  std::weak_ptr<UcxContext>& live_context = live_contexts[family == AF_INET6 ? 1 : 0];
  if (auto context = live_context.lock()) {
    // A context alive in the parent when this process was forked is the parent's: a fresh
    // one is made only once the parent's last ucx end is gone.
    refuse_after_fork(context->owner_, "starting UCX");
    return context;
  }
  default_env("UCX_TCP_KEEPIDLE", std::to_string(keepalive.idle.count()) + "s");
  default_env("UCX_TCP_KEEPINTVL", std::to_string(keepalive.interval.count()) + "s");
  default_env("UCX_TCP_KEEPCNT", std::to_string(keepalive.count));
  // UCX's own warnings about peers that vanished are ferry's errors to report. UCX read its
  // log level when it was loaded (an environment variable set now would only draw a warning
  // that it is unused): lower it in place unless the user chose one.
  if (std::getenv("UCX_LOG_LEVEL") == nullptr && ucs_global_opts.log_component.log_level > UCS_LOG_LEVEL_ERROR) {
    ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_ERROR;
  }

  // One family per context (see the header); UCX reads the variable when the context
  // starts, and ucp_config_modify does not apply it.
  const ScopedEnv address_family("UCX_TCP_AF_PRIO", family == AF_INET6 ? "inet6" : "inet");
  ucp_config_t* config = nullptr;
  check_ucs(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  auto context = std::shared_ptr<UcxContext>(new UcxContext());
  const ucs_status_t status = ucp_init(&params, config, &context->context_);
  ucp_config_release(config);
  check_ucs(status, "ucp_init (starting UCX)");
  context->registrations_ = std::make_unique<UcxRegistrations>(context->context_);
  context->owner_ = ::getpid();
  context->keepalive_ = keepalive;
  live_context = context;
  return context;
}

UcxContext::~UcxContext() {
  // A forked child leaves the parent's UCX alone (its memory is a copy; cleaning up would
  // touch the parent's connections).
  if (context_ == nullptr || !in_owner()) {
    (void)registrations_.release();  // the parent's registrations: not this process's to undo
    return;
  }
  registrations_.reset();
  ucp_cleanup(context_);
}

}  // namespace ferry::ucx::detail
