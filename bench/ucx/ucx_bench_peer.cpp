#include "ucx/ucx_bench_peer.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace ferry::bench::ucx {
namespace {

std::string self_executable() {
  std::vector<char> path(4096);
  const ssize_t length = ::readlink("/proc/self/exe", path.data(), path.size() - 1);
  check(length > 0, "readlink /proc/self/exe");
  return std::string(path.data(), static_cast<std::size_t>(length));
}

// A line from `fd` within `timeout`, or "" when none came.
std::string read_line(int fd, std::chrono::milliseconds timeout) {
  std::string line;
  const auto until = std::chrono::steady_clock::now() + timeout;
  char c = 0;
  while (std::chrono::steady_clock::now() < until) {
    pollfd ready{fd, POLLIN, 0};
    if (::poll(&ready, 1, 100) <= 0) continue;
    if (::read(fd, &c, 1) != 1) break;
    if (c == '\n') return line;
    line += c;
  }
  return "";
}

}  // namespace

Peer::Peer(const std::string& mode, std::size_t bytes, std::function<void(const Ready&)> serve_here) {
  if (const char* remote = std::getenv("FERRY_UCX_BENCH_PEER")) {
    std::istringstream words(remote);
    std::string netns;
    if (!(words >> netns >> host_)) throw std::runtime_error("FERRY_UCX_BENCH_PEER must be \"NETNS HOST\"");
    start_process(netns, mode, bytes);
    return;
  }
  auto listening = std::make_shared<std::promise<std::uint16_t>>();  // outlives this call: the thread's
  std::future<std::uint16_t> port = listening->get_future();
  thread_ = std::thread([serve = std::move(serve_here), listening] {
    pin_to(last_cpu());
    try {
      serve([&](std::uint16_t bound) { listening->set_value(bound); });
    } catch (...) {
      try {
        listening->set_exception(std::current_exception());
      } catch (const std::future_error&) {  // it had started: the benchmark sees the peer go
      }
    }
  });
  try {
    port_ = port.get();
  } catch (...) {
    thread_.join();
    throw;
  }
}

void Peer::start_process(const std::string& netns, const std::string& mode, std::size_t bytes) {
  int out[2];
  check(::pipe2(out, O_CLOEXEC) == 0, "pipe2");
  const std::string self = self_executable();
  const std::string size = std::to_string(bytes);
  std::fflush(nullptr);
  process_ = ::fork();
  check(process_ >= 0, "fork");
  if (process_ == 0) {
    ::dup2(out[1], STDOUT_FILENO);  // the port comes back on the pipe
    ::execlp("ip", "ip", "netns", "exec", netns.c_str(), self.c_str(), "--peer", mode.c_str(), host_.c_str(),
             size.c_str(), static_cast<char*>(nullptr));
    std::perror("exec ip netns exec");
    ::_exit(127);
  }
  ::close(out[1]);
  const std::string port = read_line(out[0], std::chrono::seconds(30));
  ::close(out[0]);
  if (port.empty()) {
    ::kill(process_, SIGKILL);
    ::waitpid(process_, nullptr, 0);
    throw std::runtime_error("the peer in network namespace " + netns + " did not start (" + mode + ")");
  }
  port_ = static_cast<std::uint16_t>(std::stoi(port));
}

Peer::~Peer() {
  if (thread_.joinable()) thread_.join();
  if (process_ <= 0) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int status = 0;
  while (::waitpid(process_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= until) {
      ::kill(process_, SIGKILL);
      ::waitpid(process_, &status, 0);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace ferry::bench::ucx
