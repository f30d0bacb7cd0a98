// The unix: scheme: "unix:PATH" (a socket file) and "unix:@NAME" (the abstract namespace).
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ferry/endpoint.hpp"
#include "endpoints/scheme_registry.hpp"

namespace ferry::detail {
namespace {

constexpr std::string_view kForms =
    "unix:PATH (a socket file, e.g. unix:/run/app/loader.sock) or unix:@NAME (Linux's abstract namespace, e.g. "
    "unix:@loader)";

// The socket address of `rest`; its length in `length`.
sockaddr_un socket_address(std::string_view address, std::string_view rest, socklen_t& length) {
  sockaddr_un where{};
  where.sun_family = AF_UNIX;
  const bool abstract = rest.front() == '@';
  const std::string_view name = abstract ? rest.substr(1) : rest;
  if (name.empty() || name.find('\0') != std::string_view::npos) {
    throw Error("malformed endpoint address \"" + std::string(address) + "\": accepted forms: " + std::string(kForms));
  }
  // An abstract name takes sun_path[0] (a NUL); a path needs its terminating NUL.
  const std::size_t room = sizeof where.sun_path - 1;
  if (name.size() > room) {
    throw Error("endpoint address \"" + std::string(address) + "\" is too long: a Unix socket " +
                (abstract ? "name" : "path") + " holds at most " + std::to_string(room) + " bytes, this one " +
                std::to_string(name.size()));
  }
  std::memcpy(where.sun_path + (abstract ? 1 : 0), name.data(), name.size());
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + (abstract ? 1 : 0) + name.size() +
                                  (abstract ? 0 : 1));
  return where;
}

UniqueFd new_socket() {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) throw_errno("socket(AF_UNIX) for an endpoint");
  return fd;
}

// One connect attempt on a non-blocking socket: 0, or the errno.
int connect_once(int fd, const sockaddr_un& where, socklen_t length) {
  while (::connect(fd, reinterpret_cast<const sockaddr*>(&where), length) != 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}

bool only_own_user(const AllowedPeers& peers) {
  return peers.gids.empty() && peers.uids.size() == 1 && peers.uids.front() == ::geteuid();
}

class UnixListeningPoint final : public ListeningPoint {
 public:
  UnixListeningPoint(std::string_view address, std::string_view rest, const EndpointOptions& options)
      : socket_(new_socket()) {
    socklen_t length = 0;
    const sockaddr_un where = socket_address(address, rest, length);
    const bool abstract = rest.front() == '@';
    if (!bind_to(where, length)) {
      if (errno != EADDRINUSE) throw_errno("bind of endpoint " + std::string(address));
      if (abstract) {
        throw AddressInUse("endpoint address " + std::string(address) +
                           " is in use: another socket holds that abstract name (it is released only when its "
                           "holder closes it or exits); pick another name or stop that process");
      }
      replace_stale_file(address, std::string(rest), where, length);
    }
    if (!abstract) {
      path_ = std::string(rest);
      // Before listen(): until then nobody can connect, so the mode is in place first.
      const mode_t mode = only_own_user(options.allowed_peers) ? 0600 : 0666;
      if (::chmod(path_.c_str(), mode) != 0) throw_errno("chmod of socket file " + path_);
      struct stat status {};
      if (::stat(path_.c_str(), &status) != 0) throw_errno("stat of socket file " + path_);
      device_ = status.st_dev;
      inode_ = status.st_ino;
    }
    if (::listen(socket_.get(), SOMAXCONN) != 0) {
      const int error = errno;
      remove_file();
      throw_system_error("listen on endpoint " + std::string(address), error);
    }
  }

  ~UnixListeningPoint() override { remove_file(); }

  int fd() const noexcept override { return socket_.get(); }

  std::optional<AcceptedSocket> accept() override {
    while (true) {
      UniqueFd connection(::accept4(socket_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (connection) {
        const PeerCredentials peer = peer_credentials(connection.get());
        return AcceptedSocket{std::move(connection), peer};
      }
      switch (errno) {
        case EAGAIN: return std::nullopt;
        case EINTR:
        case ECONNABORTED: continue;
        case EMFILE:
        case ENFILE:
          throw_system_error(
              "cannot accept a connection: this process (or the system) is out of file descriptors; the listener "
              "goes on and the client keeps waiting: close ends you no longer need or raise RLIMIT_NOFILE (ulimit -n)",
              errno);
        default: throw_errno("accept4 on a listening endpoint");
      }
    }
  }

  void abandon() noexcept override { path_.clear(); }

 private:
  bool bind_to(const sockaddr_un& where, socklen_t length) {
    return ::bind(socket_.get(), reinterpret_cast<const sockaddr*>(&where), length) == 0;
  }

  // A socket file exists at the path: replace it when nothing listens there (a listener
  // killed before it could remove it), refuse when something does.
  void replace_stale_file(std::string_view address, const std::string& path, const sockaddr_un& where,
                          socklen_t length) {
    struct stat status {};
    if (::lstat(path.c_str(), &status) != 0) throw_errno("lstat of " + path);
    if (!S_ISSOCK(status.st_mode)) {
      throw AddressInUse("endpoint address " + std::string(address) + ": " + path +
                         " exists and is not a socket; refusing to replace it (remove it or pick another path)");
    }
    UniqueFd probe = new_socket();
    const int error = connect_once(probe.get(), where, length);
    if (error == 0 || error == EAGAIN) {
      throw AddressInUse("endpoint address " + std::string(address) +
                         " is in use: a live listener accepts connections there; stop it or pick another address");
    }
    if (error != ECONNREFUSED) throw_system_error("connect to the existing socket file " + path, error);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw_errno("unlink of the stale socket file " + path);
    if (!bind_to(where, length)) {
      if (errno == EADDRINUSE) {
        throw AddressInUse("endpoint address " + std::string(address) +
                           " was taken by another listener while this one replaced the stale socket file");
      }
      throw_errno("bind of endpoint " + std::string(address));
    }
  }

  // Removes the socket file if it is still the one this listener made.
  void remove_file() noexcept {
    if (path_.empty()) return;
    struct stat status {};
    if (::lstat(path_.c_str(), &status) == 0 && status.st_dev == device_ && status.st_ino == inode_) {
      (void)::unlink(path_.c_str());
    }
    path_.clear();
  }

  UniqueFd socket_;
  std::string path_;  // empty for an abstract name
  dev_t device_ = 0;
  ino_t inode_ = 0;
};

class UnixScheme final : public SocketScheme {
 public:
  std::string_view name() const noexcept override { return "unix"; }
  std::string_view forms() const noexcept override { return kForms; }

  std::unique_ptr<ListeningPoint> listen_point(std::string_view address, std::string_view rest,
                                               const EndpointOptions& options) const override {
    return std::make_unique<UnixListeningPoint>(address, rest, options);
  }

  UniqueFd try_connect(std::string_view address, std::string_view rest) const override {
    socklen_t length = 0;
    const sockaddr_un where = socket_address(address, rest, length);
    UniqueFd fd = new_socket();
    const int error = connect_once(fd.get(), where, length);
    switch (error) {
      case 0: break;
      case ENOENT:        // no socket file yet
      case ECONNREFUSED:  // nobody listens (yet, or a stale file)
      case EAGAIN:        // the listener's backlog is full
        return UniqueFd();
      case EACCES:
        throw UntrustedPeer("cannot connect to endpoint " + std::string(address) +
                            ": permission denied on its socket file (it is owner-only unless the listener's "
                            "EndpointOptions::allowed_peers admits other users)");
      default: throw_system_error("connect to endpoint " + std::string(address), error);
    }
    const int flags = ::fcntl(fd.get(), F_GETFL);
    if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) throw_errno("fcntl on an endpoint socket");
    return fd;
  }
};

}  // namespace

std::unique_ptr<Scheme> make_unix_scheme() { return std::make_unique<UnixScheme>(); }

}  // namespace ferry::detail
