// The peer of one ucx benchmark: a thread of this process over loopback, or, when
// FERRY_UCX_BENCH_PEER="NETNS HOST" is set, `ferry_ucx_bench --peer MODE HOST BYTES` run in
// network namespace NETNS through `ip netns exec` (a fresh process: UCX state is never
// carried across fork). It serves one connection; the destructor waits for it to end.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "ucx/ucx_bench_wire.hpp"

namespace ferry::bench::ucx {

class Peer {
 public:
  static constexpr const char* kLoopback = "127.0.0.1";
  /// Starts the peer and waits until it listens: `serve_here` on a thread pinned to the
  /// last CPU, or MODE and BYTES in the other namespace. Throws std::runtime_error when it
  /// does not start.
  Peer(const std::string& mode, std::size_t bytes, std::function<void(const Ready&)> serve_here);
  ~Peer();
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  const std::string& host() const noexcept { return host_; }
  std::uint16_t port() const noexcept { return port_; }

 private:
  void start_process(const std::string& netns, const std::string& mode, std::size_t bytes);

  std::string host_ = kLoopback;
  std::uint16_t port_ = 0;
  std::thread thread_;
  pid_t process_ = -1;
};

}  // namespace ferry::bench::ucx
