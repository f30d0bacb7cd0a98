#include "client.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "discovery.hpp"
#include "ferry/detail/unique_fd.hpp"

namespace ferry::cli {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::string_view request = "snapshot\n";

FetchProblem problem(ExitCode code, pid_t pid, const std::string& what) {
  return FetchProblem{code, "pid " + std::to_string(pid) + ": " + what};
}

// A request under way: its socket and what came back so far.
struct Pending {
  FetchResult* result = nullptr;
  detail::UniqueFd socket;
  bool done = false;
};

// Connects to pid's abstract socket; on failure, sets result.problem and returns no socket.
detail::UniqueFd connect_to(pid_t pid, FetchResult& result) {
  detail::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) {
    result.problem = problem(ExitCode::failure, pid, std::string("socket() failed: ") + std::strerror(errno));
    return {};
  }
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::string name = introspection_socket_name(pid);
  std::memcpy(address.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
  auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0) {
    int error = errno;
    if ((error == ECONNREFUSED || error == ENOENT) && ::kill(pid, 0) != 0 && errno == ESRCH) {
      result.problem = problem(ExitCode::no_such_process, pid, "no such process");
    } else if (error == ECONNREFUSED || error == ENOENT) {
      result.problem = problem(ExitCode::no_such_process, pid,
                               "introspection is off in that process (start it with FERRY_INTROSPECT=1, or call "
                               "ferry::enable_introspection())");
    } else if (error == EAGAIN) {
      result.problem = problem(ExitCode::bad_reply, pid, "not accepting connections (its queue is full): is it hung?");
    } else {
      result.problem = problem(ExitCode::failure, pid, std::string("connect() failed: ") + std::strerror(error));
    }
    return {};
  }
  return fd;
}

// Checks that the listener is process `pid` itself and that this user may read it.
bool peer_is_trusted(int fd, pid_t pid, FetchResult& result) {
  ucred credentials{};
  socklen_t size = sizeof credentials;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &size) != 0) {
    result.problem = problem(ExitCode::failure, pid, std::string("SO_PEERCRED failed: ") + std::strerror(errno));
    return false;
  }
  if (credentials.pid != pid) {
    result.problem = problem(ExitCode::bad_reply, pid,
                             "its introspection socket is held by pid " + std::to_string(credentials.pid) +
                                 ", not by " + std::to_string(pid) + " (the name is squatted): ignored");
    return false;
  }
  uid_t me = ::geteuid();
  if (me != 0 && credentials.uid != me) {
    result.problem = problem(ExitCode::permission, pid,
                             "permission refused: it belongs to uid " + std::to_string(credentials.uid) +
                                 " and you are uid " + std::to_string(me) + " (run ferry as that user or as root)");
    return false;
  }
  return true;
}

// Connects, checks and sends the request; a Pending with no socket when that failed.
Pending start(FetchResult& result) {
  Pending pending;
  pending.result = &result;
  pending.socket = connect_to(result.pid, result);
  if (!pending.socket || !peer_is_trusted(pending.socket.get(), result.pid, result)) {
    pending.socket.reset();
    pending.done = true;
    return pending;
  }
  // 9 bytes into an empty socket buffer: a single send never blocks or splits.
  if (::send(pending.socket.get(), request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    result.problem = problem(ExitCode::bad_reply, result.pid,
                             std::string("closed the connection without a reply (") + std::strerror(errno) + ")");
    pending.socket.reset();
    pending.done = true;
  }
  return pending;
}

// Reads what is there; marks the request done at end of file or on error.
void read_some(Pending& pending) {
  char buffer[65536];
  FetchResult& result = *pending.result;
  for (;;) {
    ssize_t got = ::recv(pending.socket.get(), buffer, sizeof buffer, 0);
    if (got > 0) {
      result.reply.append(buffer, static_cast<std::size_t>(got));
      if (result.reply.size() > max_reply_bytes) {
        result.problem = problem(ExitCode::bad_reply, result.pid,
                                 "its reply exceeds " + std::to_string(max_reply_bytes >> 20) + " MiB: refused");
        pending.done = true;
        return;
      }
      continue;
    }
    if (got == 0) {
      if (result.reply.empty()) {
        result.problem = problem(ExitCode::bad_reply, result.pid, "closed the connection without a reply");
      }
      pending.done = true;
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    if (errno == ECONNRESET && result.reply.empty()) {
      result.problem = problem(ExitCode::bad_reply, result.pid, "closed the connection without a reply (reset)");
      pending.done = true;
      return;
    }
    result.problem =
        problem(ExitCode::bad_reply, result.pid, std::string("reading its reply failed: ") + std::strerror(errno));
    pending.done = true;
    return;
  }
}

// Polls the requests still under way until all are done or the deadline passes.
void drain(std::vector<Pending>& pendings, Clock::time_point deadline, std::chrono::milliseconds timeout) {
  for (;;) {
    std::vector<pollfd> polled;
    std::vector<Pending*> owners;
    for (Pending& pending : pendings) {
      if (pending.done) continue;
      polled.push_back(pollfd{pending.socket.get(), POLLIN, 0});
      owners.push_back(&pending);
    }
    if (polled.empty()) return;
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    int ready = ::poll(polled.data(), polled.size(), static_cast<int>(left.count()));
    if (ready < 0 && errno != EINTR) break;
    for (std::size_t i = 0; ready > 0 && i < polled.size(); ++i) {
      if (polled[i].revents != 0) read_some(*owners[i]);
    }
  }
  for (Pending& pending : pendings) {
    if (pending.done) continue;
    pending.result->problem =
        problem(ExitCode::bad_reply, pending.result->pid,
                "no complete reply within " + std::to_string(timeout.count()) + " ms (is it hung or stopped?)");
    pending.result->reply.clear();
  }
}

}  // namespace

std::vector<FetchResult> fetch_snapshots(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  std::vector<FetchResult> results(pids.size());
  std::vector<Pending> pendings;
  pendings.reserve(pids.size());
  for (std::size_t i = 0; i < pids.size(); ++i) {
    results[i].pid = pids[i];
    pendings.push_back(start(results[i]));
  }
  drain(pendings, deadline, timeout);
  for (FetchResult& result : results) {
    if (result.problem) result.reply.clear();
  }
  return results;
}

}  // namespace ferry::cli
