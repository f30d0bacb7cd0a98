// What ferry_ucx_bench and its peer share: the messages, the endpoint options, blocking
// TCP reads and writes, and pinning (bench/ucx/).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "ferry/ferry.hpp"
#include "support/tensor_message.hpp"

namespace ferry::bench::ucx {

using ferry::bench::TensorMessage;

inline constexpr std::size_t kMiB = std::size_t{1} << 20;

struct Bytes64 {
  std::array<std::uint8_t, 64> bytes{};
  template <class Archive>
  void serialize(Archive& ar) {
    ar(bytes);
  }
};

/// Both sides' options: a secret (every listener needs one off loopback) and a long linger.
EndpointOptions bench_options();

/// Throws std::runtime_error naming `what` and errno when `ok` is false.
void check(bool ok, const char* what);
/// Writes or reads exactly `bytes`; false when the peer went away.
bool write_all(int fd, const std::byte* data, std::size_t bytes);
bool read_all(int fd, std::byte* data, std::size_t bytes);
/// A TCP socket with TCP_NODELAY connected to `host`:`port` (IPv4).
detail::UniqueFd tcp_connect(const std::string& host, std::uint16_t port);
/// A listening TCP socket at `host` (IPv4, "127.0.0.1" for loopback) on a free port.
detail::UniqueFd tcp_listen(const std::string& host);
/// The port a socket is bound to.
std::uint16_t bound_port(int fd);
/// Accepts one connection and sets TCP_NODELAY on it.
detail::UniqueFd tcp_accept(int listening);

/// Pins the calling thread to `cpu` (modulo the CPUs), or lets it run anywhere; best effort.
void pin_to(unsigned cpu);
void unpin();
unsigned last_cpu();

/// The peer's side of each benchmark, serving one connection at `host` and then returning
/// (a thread over loopback, or `ferry_ucx_bench --peer` in another network namespace):
/// `ready(port)` is called once it listens.
using Ready = std::function<void(std::uint16_t port)>;
void serve_raw_echo(const std::string& host, std::size_t bytes, const Ready& ready);
void serve_raw_sink(const std::string& host, std::size_t bytes, const Ready& ready);
template <class T>  // Bytes64 or TensorMessage
void serve_ferry_echo(const std::string& host, const Ready& ready);
void serve_ferry_sink(const std::string& host, const Ready& ready);

/// `ferry_ucx_bench --peer MODE HOST [BYTES]`: runs one serve_* (MODE raw-echo, raw-sink,
/// ferry-echo64, ferry-echo, ferry-sink), printing the port on stdout once it listens.
int run_peer(int argc, char** argv);

}  // namespace ferry::bench::ucx
