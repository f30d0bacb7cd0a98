#include "ucx/ucx_bench_wire.hpp"

#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

namespace ferry::bench::ucx {

using namespace std::chrono_literals;

EndpointOptions bench_options() {
  EndpointOptions options;
  options.secret = "ferry ucx bench";
  options.on_refusal = [](const std::string&) {};
  options.channel.close_linger = 5s;
  return options;
}

void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string(what) + ": " + std::strerror(errno));
}

bool write_all(int fd, const std::byte* data, std::size_t bytes) {
  while (bytes > 0) {
    const ssize_t sent = ::send(fd, data, bytes, MSG_NOSIGNAL);
    if (sent <= 0) {
      if (sent < 0 && errno == EINTR) continue;
      return false;
    }
    data += sent;
    bytes -= static_cast<std::size_t>(sent);
  }
  return true;
}

bool read_all(int fd, std::byte* data, std::size_t bytes) {
  while (bytes > 0) {
    const ssize_t got = ::recv(fd, data, bytes, 0);
    if (got <= 0) {
      if (got < 0 && errno == EINTR) continue;
      return false;
    }
    data += got;
    bytes -= static_cast<std::size_t>(got);
  }
  return true;
}

namespace {

sockaddr_in ipv4(const std::string& host, std::uint16_t port) {
  sockaddr_in where{};
  where.sin_family = AF_INET;
  where.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &where.sin_addr) != 1)
    throw std::runtime_error("not an IPv4 address: " + host);
  return where;
}

void no_delay(int fd) {
  const int on = 1;
  check(::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on) == 0, "TCP_NODELAY");
}

}  // namespace

detail::UniqueFd tcp_connect(const std::string& host, std::uint16_t port) {
  detail::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  check(bool(fd), "socket");
  const sockaddr_in where = ipv4(host, port);
  check(::connect(fd.get(), reinterpret_cast<const sockaddr*>(&where), sizeof where) == 0, "connect");
  no_delay(fd.get());
  return fd;
}

detail::UniqueFd tcp_listen(const std::string& host) {
  detail::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  check(bool(fd), "socket");
  const sockaddr_in where = ipv4(host, 0);
  check(::bind(fd.get(), reinterpret_cast<const sockaddr*>(&where), sizeof where) == 0, "bind");
  check(::listen(fd.get(), 1) == 0, "listen");
  return fd;
}

std::uint16_t bound_port(int fd) {
  sockaddr_in where{};
  socklen_t length = sizeof where;
  check(::getsockname(fd, reinterpret_cast<sockaddr*>(&where), &length) == 0, "getsockname");
  return ntohs(where.sin_port);
}

detail::UniqueFd tcp_accept(int listening) {
  detail::UniqueFd fd(::accept4(listening, nullptr, nullptr, SOCK_CLOEXEC));
  check(bool(fd), "accept");
  no_delay(fd.get());
  return fd;
}

void pin_to(unsigned cpu) {
  const unsigned cpus = std::thread::hardware_concurrency();
  if (cpus < 2) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % cpus, &set);
  (void)::pthread_setaffinity_np(::pthread_self(), sizeof set, &set);
}

void unpin() {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (unsigned cpu = 0; cpu < std::thread::hardware_concurrency(); ++cpu) CPU_SET(cpu, &set);
  (void)::pthread_setaffinity_np(::pthread_self(), sizeof set, &set);
}

unsigned last_cpu() { return std::thread::hardware_concurrency() - 1; }

// ---- the peer's side ------------------------------------------------------------------

void serve_raw_echo(const std::string& host, std::size_t bytes, const Ready& ready) {
  const detail::UniqueFd listening = tcp_listen(host);
  ready(bound_port(listening.get()));
  const detail::UniqueFd fd = tcp_accept(listening.get());
  std::vector<std::byte> buffer(bytes);
  while (read_all(fd.get(), buffer.data(), bytes) && write_all(fd.get(), buffer.data(), bytes)) {
  }
}

// Each block straight into a memfd mapping; one byte back per block, so that the writer's
// iteration ends with its block.
void serve_raw_sink(const std::string& host, std::size_t bytes, const Ready& ready) {
  const detail::UniqueFd listening = tcp_listen(host);
  ready(bound_port(listening.get()));
  const detail::UniqueFd fd = tcp_accept(listening.get());
  const detail::UniqueFd memfd(::memfd_create("ferry-ucx-bench", MFD_CLOEXEC));
  check(bool(memfd) && ::ftruncate(memfd.get(), static_cast<off_t>(bytes)) == 0, "memfd");
  void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0);
  check(mapped != MAP_FAILED, "mmap");
  std::byte one{};
  while (read_all(fd.get(), static_cast<std::byte*>(mapped), bytes) && write_all(fd.get(), &one, 1)) {
  }
  ::munmap(mapped, bytes);
}

template <class T>
void serve_ferry_echo(const std::string& host, const Ready& ready) {
  Listener listener = listen("ucx://" + host + ":0", bench_options());
  const std::string address = listener.address();
  ready(static_cast<std::uint16_t>(std::stoi(address.substr(address.rfind(':') + 1))));
  auto end = listener.accept_duplex_for<T, T>(30s);
  if (!end) throw std::runtime_error("no ucx:// client came");
  try {
    while (auto got = end->recv()) end->send(*got);  // back what it got
  } catch (const Error&) {
  }
}
template void serve_ferry_echo<Bytes64>(const std::string&, const Ready&);
template void serve_ferry_echo<TensorMessage>(const std::string&, const Ready&);

void serve_ferry_sink(const std::string& host, const Ready& ready) {
  Listener listener = listen("ucx://" + host + ":0", bench_options());
  const std::string address = listener.address();
  ready(static_cast<std::uint16_t>(std::stoi(address.substr(address.rfind(':') + 1))));
  auto end = listener.accept_duplex_for<TensorMessage, TensorMessage>(30s);
  if (!end) throw std::runtime_error("no ucx:// client came");
  try {
    while (auto got = end->recv()) benchmark::DoNotOptimize(got->tensor.data_ptr());
  } catch (const Error&) {
  }
}

int run_peer(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: ferry_ucx_bench --peer MODE HOST [BYTES]\n");
    return 2;
  }
  const std::string mode = argv[2];
  const std::string host = argv[3];
  const std::size_t bytes = argc > 4 ? std::stoull(argv[4]) : 0;
  const Ready print_port = [](std::uint16_t port) {
    std::printf("%u\n", static_cast<unsigned>(port));
    std::fflush(stdout);
  };
  pin_to(last_cpu());
  try {
    if (mode == "raw-echo")
      serve_raw_echo(host, bytes, print_port);
    else if (mode == "raw-sink")
      serve_raw_sink(host, bytes, print_port);
    else if (mode == "ferry-echo64")
      serve_ferry_echo<Bytes64>(host, print_port);
    else if (mode == "ferry-echo")
      serve_ferry_echo<TensorMessage>(host, print_port);
    else if (mode == "ferry-sink")
      serve_ferry_sink(host, print_port);
    else {
      std::fprintf(stderr, "ferry_ucx_bench --peer: no mode '%s'\n", mode.c_str());
      return 2;
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ferry_ucx_bench --peer %s: %s\n", mode.c_str(), error.what());
    return 1;
  }
  return 0;
}

}  // namespace ferry::bench::ucx
