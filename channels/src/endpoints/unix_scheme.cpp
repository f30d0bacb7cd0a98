// The unix: scheme: "unix:PATH" (a socket file) and "unix:@NAME" (the abstract namespace).
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "endpoints/scheme_registry.hpp"
#include "ferry/endpoint.hpp"

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
  length =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + (abstract ? 1 : 0) + name.size() + (abstract ? 0 : 1));
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

// A socket file's path split into its directory and its name in it.
struct PathParts {
  std::string directory;
  std::string name;
};

PathParts split_path(std::string_view address, const std::string& path) {
  const std::size_t slash = path.rfind('/');
  PathParts parts{slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash)),
                  slash == std::string::npos ? path : path.substr(slash + 1)};
  if (parts.name.empty() || parts.name == "." || parts.name == "..") {
    throw Error("malformed endpoint address \"" + std::string(address) + "\": the path must end in a file name");
  }
  return parts;
}

// The address of `name` inside the directory open as `directory`, through /proc/self/fd: a
// short path that resolves nothing but that descriptor.
sockaddr_un address_in(int directory, const char* name, socklen_t& length) {
  sockaddr_un where{};
  where.sun_family = AF_UNIX;
  const int size = std::snprintf(where.sun_path, sizeof where.sun_path, "/proc/self/fd/%d/%s", directory, name);
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + static_cast<std::size_t>(size) + 1);
  return where;
}

// A directory of this process's own (mode 0700) next to the socket file's place: the socket
// is bound and given its mode in there, where nobody else can put a symlink, then linked to
// its name (linkat never replaces and never follows the name). Removed when it goes.
class ScratchDirectory {
 public:
  static constexpr const char* kSocket = "socket";

  explicit ScratchDirectory(int parent) : parent_(parent) {
    static std::atomic<unsigned> counter{0};
    for (int attempt = 0; attempt < 100; ++attempt) {
      name_ = ".ferry-listen-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
      if (::mkdirat(parent_, name_.c_str(), 0700) == 0) break;
      if (errno != EEXIST) throw_errno("mkdir of a scratch directory for a socket file");
    }
    fd_ = UniqueFd(::openat(parent_, name_.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd_) {
      const int error = errno;
      (void)::unlinkat(parent_, name_.c_str(), AT_REMOVEDIR);
      throw_system_error("open of a scratch directory for a socket file", error);
    }
    // Still the one made above (not another user's put in its place after a rename).
    struct stat status {};
    if (::fstat(fd_.get(), &status) != 0) throw_errno("stat of a scratch directory for a socket file");
    if (status.st_uid != ::geteuid() || (status.st_mode & 077) != 0) {
      fd_.reset();
      throw Error("the scratch directory " + name_ +
                  " for a socket file was replaced by another user's while it was made; listen in a directory "
                  "that only trusted users can write to");
    }
  }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;
  ~ScratchDirectory() {
    (void)::unlinkat(fd_.get(), kSocket, 0);
    (void)::unlinkat(parent_, name_.c_str(), AT_REMOVEDIR);
  }
  int fd() const noexcept { return fd_.get(); }

 private:
  int parent_;
  std::string name_;
  UniqueFd fd_;
};

class UnixListeningPoint final : public ListeningPoint {
 public:
  UnixListeningPoint(std::string_view address, std::string_view rest, const EndpointOptions& options)
      : socket_(new_socket()) {
    socklen_t length = 0;
    const sockaddr_un where = socket_address(address, rest, length);
    if (rest.front() == '@') {
      if (!bind_to(where, length)) {
        if (errno != EADDRINUSE) throw_errno("bind of endpoint " + std::string(address));
        throw AddressInUse("endpoint address " + std::string(address) +
                           " is in use: another socket holds that abstract name (it is released only when its "
                           "holder closes it or exits); pick another name or stop that process");
      }
    } else {
      // Before listen(): until then nobody can connect, so the mode is in place first.
      place_socket_file(address, std::string(rest), where, length, only_own_user(options.allowed_peers) ? 0600 : 0666);
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
          throw_system_error("cannot accept a connection: this process (or the system) is out of file descriptors",
                             errno);
        default: throw_errno("accept4 on a listening endpoint");
      }
    }
  }

  void abandon() noexcept override {
    name_.clear();
    directory_.reset();
  }

 private:
  bool bind_to(const sockaddr_un& where, socklen_t length) {
    return ::bind(socket_.get(), reinterpret_cast<const sockaddr*>(&where), length) == 0;
  }

  // Binds the socket to a file at `path` of exactly `mode`, through no path a symlink
  // could redirect: bound and chmod'ed inside a scratch directory of this process's own,
  // then hard-linked to its name, which never replaces what is there.
  void place_socket_file(std::string_view address, const std::string& path, const sockaddr_un& where,
                         socklen_t where_length, mode_t mode) {
    const PathParts parts = split_path(address, path);
    UniqueFd directory(::open(parts.directory.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!directory) throw_errno("open of " + parts.directory + ", the directory of endpoint " + std::string(address));
    {
      ScratchDirectory scratch(directory.get());
      socklen_t length = 0;
      const sockaddr_un inside = address_in(scratch.fd(), ScratchDirectory::kSocket, length);
      if (!bind_to(inside, length)) throw_errno("bind of endpoint " + std::string(address));
      if (::fchmodat(scratch.fd(), ScratchDirectory::kSocket, mode, AT_SYMLINK_NOFOLLOW) != 0)
        throw_errno("chmod of socket file " + path);
      struct stat status {};
      if (::fstatat(scratch.fd(), ScratchDirectory::kSocket, &status, AT_SYMLINK_NOFOLLOW) != 0) {
        throw_errno("stat of socket file " + path);
      }
      device_ = status.st_dev;
      inode_ = status.st_ino;
      while (::linkat(scratch.fd(), ScratchDirectory::kSocket, directory.get(), parts.name.c_str(), 0) != 0) {
        if (errno != EEXIST) throw_errno("link of the socket file to " + path);
        if (!replaced_stale_file(address, directory.get(), parts.name, where, where_length)) {
          throw AddressInUse("endpoint address " + std::string(address) +
                             " was taken by another listener while this one replaced the stale socket file");
        }
      }
    }  // the scratch name and directory go; the socket file stays under its name
    directory_ = std::move(directory);
    name_ = parts.name;
  }

  // A file exists at `name`: removes it when it is a socket nothing listens at (a listener
  // killed before it could remove it) and says so; refuses when it is not a socket or
  // something listens. The probe and the unlink are two steps: between them another
  // process that can write to the directory could put a live socket there, which this
  // unlink would remove (docs/design/endpoints.md: use a directory only trusted users can
  // write to). False when this process already replaced a stale file once.
  bool replaced_stale_file(std::string_view address, int directory, const std::string& name, const sockaddr_un& where,
                           socklen_t length) {
    if (replaced_) return false;
    replaced_ = true;
    struct stat status {};
    if (::fstatat(directory, name.c_str(), &status, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) return true;
      throw_errno("stat of " + std::string(address));
    }
    if (!S_ISSOCK(status.st_mode)) {
      throw AddressInUse(
          "endpoint address " + std::string(address) +
          ": the file exists and is not a socket; refusing to replace it (remove it or pick another path)");
    }
    UniqueFd probe = new_socket();
    const int error = connect_once(probe.get(), where, length);
    if (error == 0 || error == EAGAIN) {
      throw AddressInUse("endpoint address " + std::string(address) +
                         " is in use: a live listener accepts connections there; stop it or pick another address");
    }
    if (error != ECONNREFUSED)
      throw_system_error("connect to the existing socket file of " + std::string(address), error);
    if (::unlinkat(directory, name.c_str(), 0) != 0 && errno != ENOENT) {
      throw_errno("unlink of the stale socket file of " + std::string(address));
    }
    return true;
  }

  // Removes the socket file if it is still the one this listener made.
  void remove_file() noexcept {
    if (name_.empty() || !directory_) return;
    struct stat status {};
    if (::fstatat(directory_.get(), name_.c_str(), &status, AT_SYMLINK_NOFOLLOW) == 0 && status.st_dev == device_ &&
        status.st_ino == inode_) {
      (void)::unlinkat(directory_.get(), name_.c_str(), 0);
    }
    name_.clear();
    directory_.reset();
  }

  UniqueFd socket_;
  UniqueFd directory_;  // the socket file's directory (O_PATH), for a path
  std::string name_;    // the socket file's name in it; empty for an abstract name
  dev_t device_ = 0;
  ino_t inode_ = 0;
  bool replaced_ = false;
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
