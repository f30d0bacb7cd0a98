// The introspection server: one background thread that answers `snapshot\n` on the
// abstract Unix socket "\0ferry-introspect.<pid>" (docs/design/introspection.md).
//
// What a client can do to the process is bounded: at most kMaxClients connections at once
// (more are closed at once), kMaxRequestBytes of request, kRequestTimeout to send it and
// kReplyTimeout to read the reply; every socket is non-blocking, so a client that sends
// garbage, nothing, or never reads costs one descriptor and a buffer until its deadline.
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ferry/detail/end_stats.hpp"
#include "ferry/detail/live_ends.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/detail/unique_fd.hpp"
#include "ferry/detail/worker_table.hpp"
#include "ferry/error.hpp"
#include "ferry/introspection.hpp"
#include "introspection/server.hpp"

namespace ferry {
namespace detail {
namespace {

constexpr std::size_t kMaxClients = 8;
constexpr std::size_t kMaxRequestBytes = 256;
constexpr std::chrono::milliseconds kRequestTimeout{1000};
constexpr std::chrono::milliseconds kReplyTimeout{5000};
constexpr int kBacklog = 16;

struct Client {
  UniqueFd socket;
  std::string request;
  std::string reply;
  std::size_t written = 0;
  bool replying = false;
  std::chrono::steady_clock::time_point deadline;
};

// Everything the server owns; guarded by the control mutex except while the thread runs
// (then only the thread touches the fds and clients).
struct Server {
  detail::Mutex control;
  UniqueFd listener;
  UniqueFd wake;  // an eventfd: written to stop the thread
  std::unique_ptr<std::thread> thread;
  bool enabled = false;            // on in this process
  bool restart_in_worker = false;  // on in the parent of a freshly forked process
  std::atomic<std::uint64_t> served{0};
  std::atomic<std::uint64_t> refused_other_user{0};
  std::atomic<std::uint64_t> dropped{0};  // over kMaxClients, timed out, or too long a request
};

Server& server();

std::atomic<bool> g_serving{false};  // introspection_enabled(): the server runs in this process

// (The analysis cannot follow a lock taken in one fork handler and released in another.)
void lock_for_fork() FERRY_NO_THREAD_SAFETY_ANALYSIS { server().control.lock(); }
void unlock_after_fork_in_parent() FERRY_NO_THREAD_SAFETY_ANALYSIS { server().control.unlock(); }
// In the child of fork(): the thread did not come along. Its descriptors are closed, so
// that the parent's name goes with the parent (nothing keeps the socket alive after it is
// killed). A worker that ferry forks restarts the server (restart_in_forked_worker()).
void reset_after_fork_in_child() FERRY_NO_THREAD_SAFETY_ANALYSIS {
  Server& s = server();
  if (s.thread) {
    (void)s.thread.release();  // no such thread here: never joined, never destroyed
    add_background_thread(-1);
  }
  s.restart_in_worker = s.enabled;
  s.enabled = false;
  set_introspection_for_workers(false);
  g_serving.store(false, std::memory_order_relaxed);
  // g_introspecting stays as it was: the child goes on measuring (its snapshot() shows it).
  s.listener.reset();
  s.wake.reset();
  s.control.unlock();
}

Server& server() {
  static Server* instance = [] {
    auto* created = new Server();  // never destroyed: the thread may outlive static destruction
    const int rc = ::pthread_atfork(&lock_for_fork, &unlock_after_fork_in_parent, &reset_after_fork_in_child);
    if (rc != 0) throw_system_error("pthread_atfork", rc);
    return created;
  }();
  return *instance;
}

std::string socket_name() { return std::string("ferry-introspect.") + std::to_string(::getpid()); }

UniqueFd make_listener() {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) throw_errno("socket for the introspection server");
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string name = socket_name();
  // Abstract: sun_path[0] is NUL and the name follows, without a terminating NUL.
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0) {
    throw_errno("bind of the introspection socket @" + name +
                " (another process of this pid in this network namespace holds the name)");
  }
  if (::listen(fd.get(), kBacklog) != 0) throw_errno("listen on the introspection socket");
  return fd;
}

// Whether the peer of `fd` may read this process's figures: the same user, or root.
bool peer_allowed(int fd) {
  ucred credentials{};
  socklen_t size = sizeof credentials;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &size) != 0) return false;
  return credentials.uid == 0 || credentials.uid == ::geteuid();
}

std::string error_reply(const std::string& message) {
  return R"({"error":")" + message + "\"}\n";  // messages are ours: no character needs escaping
}

std::string answer(const std::string& request) {
  if (request == "snapshot") {
    try {
      return to_json(snapshot());
    } catch (const std::exception&) {
      return error_reply("the snapshot failed");
    }
  }
  return error_reply(R"(unknown request; send the line \"snapshot\")");
}

// Reads what the client sent; true when it is to be dropped.
bool read_request(Client& client) {
  char buffer[kMaxRequestBytes];
  while (true) {
    const ssize_t got = ::recv(client.socket.get(), buffer, sizeof buffer, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno != EAGAIN && errno != EWOULDBLOCK;
    }
    if (got == 0) return true;  // gone before its request was whole
    client.request.append(buffer, static_cast<std::size_t>(got));
    const std::size_t newline = client.request.find('\n');
    if (newline != std::string::npos) {
      client.request.resize(newline);
      if (!client.request.empty() && client.request.back() == '\r') client.request.pop_back();
      client.reply = answer(client.request);
      client.replying = true;
      client.deadline = std::chrono::steady_clock::now() + kReplyTimeout;
      return false;
    }
    if (client.request.size() > kMaxRequestBytes) {
      client.reply = error_reply(R"(request too long; send the line \"snapshot\")");
      client.replying = true;
      client.deadline = std::chrono::steady_clock::now() + kReplyTimeout;
      return false;
    }
  }
}

// Writes what the socket takes; true when the client is done (all written) or to be dropped.
bool write_reply(Client& client) {
  while (client.written < client.reply.size()) {
    const ssize_t sent = ::send(client.socket.get(), client.reply.data() + client.written,
                                client.reply.size() - client.written, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return errno != EAGAIN && errno != EWOULDBLOCK;
    }
    client.written += static_cast<std::size_t>(sent);
  }
  return true;
}

void accept_clients(Server& s, int listener, std::vector<Client>& clients) {
  while (true) {
    UniqueFd socket(::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!socket) return;  // EAGAIN, or out of descriptors: the backlog waits
    if (!peer_allowed(socket.get())) {
      s.refused_other_user.fetch_add(1, std::memory_order_relaxed);
      continue;  // closed
    }
    if (clients.size() >= kMaxClients) {
      s.dropped.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    Client& client = clients.emplace_back();
    client.socket = std::move(socket);
    client.deadline = std::chrono::steady_clock::now() + kRequestTimeout;
  }
}

void serve(Server& s, int listener, int wake) {
  std::vector<Client> clients;
  std::vector<pollfd> fds;
  auto next_tick = std::chrono::steady_clock::now();
  while (true) {
    if (std::chrono::steady_clock::now() >= next_tick) {
      sample_live_ends_activity(monotonic_ns());  // each end's last activity (end_stats.hpp)
      next_tick = std::chrono::steady_clock::now() + kActivityTick;
    }
    fds.clear();
    fds.push_back(pollfd{wake, POLLIN, 0});
    fds.push_back(pollfd{listener, POLLIN, 0});
    auto now = std::chrono::steady_clock::now();
    auto earliest = next_tick;
    for (const Client& client : clients) {
      fds.push_back(pollfd{client.socket.get(), static_cast<short>(client.replying ? POLLOUT : POLLIN), 0});
      earliest = std::min(earliest, client.deadline);
    }
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(earliest - now).count() + 1;
    const int rc = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(wait, 0)));
    if (rc < 0 && errno != EINTR) return;       // cannot happen with valid descriptors
    if (rc > 0 && fds[0].revents != 0) return;  // disable_introspection()
    now = std::chrono::steady_clock::now();
    std::vector<bool> done(clients.size(), false);
    for (std::size_t i = 0; i < clients.size(); ++i) {
      Client& client = clients[i];
      const short revents = rc > 0 ? fds[2 + i].revents : short{0};
      if (revents != 0) {
        if (!client.replying) {
          done[i] = read_request(client);
          if (done[i]) s.dropped.fetch_add(1, std::memory_order_relaxed);
        }
        if (!done[i] && client.replying) {
          done[i] = write_reply(client);
          if (done[i] && client.written == client.reply.size()) s.served.fetch_add(1, std::memory_order_relaxed);
        }
      }
      if (!done[i] && now >= client.deadline) {
        done[i] = true;
        s.dropped.fetch_add(1, std::memory_order_relaxed);
      }
    }
    std::size_t index = 0;
    std::erase_if(clients, [&](const Client&) { return done[index++]; });
    if (rc > 0 && fds[1].revents != 0) accept_clients(s, listener, clients);
  }
}

// With the control mutex held.
void start_locked(Server& s) FERRY_REQUIRES(s.control) {
  if (s.enabled) return;
  UniqueFd listener = make_listener();
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) throw_errno("eventfd for the introspection server");
  const int listener_fd = listener.get();
  const int wake_fd = wake.get();
  add_background_thread(1);  // before it exists: a fork() meanwhile must not count it
  try {
    s.thread = std::make_unique<std::thread>([&s, listener_fd, wake_fd] { serve(s, listener_fd, wake_fd); });
  } catch (...) {
    add_background_thread(-1);
    throw;
  }
  s.listener = std::move(listener);
  s.wake = std::move(wake);
  s.enabled = true;
  g_introspecting.store(true, std::memory_order_relaxed);
  g_serving.store(true, std::memory_order_relaxed);
  set_introspection_for_workers(true);
}

void stop_locked(Server& s) noexcept FERRY_REQUIRES(s.control) {
  if (!s.enabled) return;
  const std::uint64_t one = 1;
  if (::write(s.wake.get(), &one, sizeof one) < 0) {
    // An eventfd write fails only when the counter would overflow: the thread is woken anyway.
  }
  if (s.thread && s.thread->joinable()) s.thread->join();
  s.thread.reset();
  add_background_thread(-1);
  s.listener.reset();
  s.wake.reset();
  s.enabled = false;
  g_introspecting.store(false, std::memory_order_relaxed);
  g_serving.store(false, std::memory_order_relaxed);
  set_introspection_for_workers(false);
}

void restart_in_forked_worker() noexcept {
  Server& s = server();
  const detail::MutexLock lock(s.control);
  if (!s.restart_in_worker) return;
  s.restart_in_worker = false;
  try {
    start_locked(s);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ferry: introspection stays off in this worker: %s\n", error.what());
  }
}

}  // namespace

bool start_introspection_from_environment() noexcept {
  const char* setting = std::getenv("FERRY_INTROSPECT");
  set_forked_worker_hook(&restart_in_forked_worker);
  if (setting == nullptr || std::strcmp(setting, "1") != 0) return false;
  try {
    enable_introspection();
    return true;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ferry: FERRY_INTROSPECT=1, but introspection could not start: %s\n", error.what());
    return false;
  }
}

IntrospectionServerStats introspection_server_stats() noexcept {
  Server& s = server();
  return IntrospectionServerStats{s.served.load(), s.refused_other_user.load(), s.dropped.load()};
}

}  // namespace detail

void enable_introspection() {
  detail::Server& s = detail::server();
  detail::set_forked_worker_hook(&detail::restart_in_forked_worker);
  const detail::MutexLock lock(s.control);
  detail::start_locked(s);
}

void disable_introspection() noexcept {
  detail::Server& s = detail::server();
  const detail::MutexLock lock(s.control);
  s.restart_in_worker = false;
  detail::stop_locked(s);
}

bool introspection_enabled() noexcept { return detail::g_serving.load(std::memory_order_relaxed); }

}  // namespace ferry
