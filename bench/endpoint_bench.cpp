// Endpoints: what a connection made by address costs next to channel() ends of the same
// transport, and what making connections costs. Names:
//   endpoint/channel/<transport>/bytes/64         64 B round trip over duplex() ends (baseline)
//   endpoint/connected/<transport>/bytes/64       the same over listen() / connect_duplex() ends
//   endpoint/channel/<transport>/tensor_same/1MiB the same 1 MiB shared tensor each time, 1 B reply
//   endpoint/connected/<transport>/tensor_same/1MiB
//   endpoint/raw/connect_to_first_byte            a plain Unix socket connect, accept, 1 byte
//   endpoint/connected/<transport>/connect_to_first_message   connect_receiver() to its first recv()
//   endpoint/raw/accepts/64_clients               64 threads of another process connect at once
//   endpoint/connected/<transport>/accepts/64_clients   the same with connect_receiver/accept_sender
// The child process connects by address (it is forked, but nothing of the listener's is
// inherited by the connection: it goes through the listening socket).
#include <benchmark/benchmark.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "ferry/ferry.hpp"
#include "support/child_process.hpp"
#include "support/round_trip_times.hpp"

namespace ferry::bench::endpoints {
namespace {

using namespace std::chrono_literals;

std::string bench_address(const std::string& tag) {
  return "unix:@ferry-endpoint-bench-" + std::to_string(::getpid()) + "-" + tag;
}

std::string transport_label(Transport transport) { return std::string(transport_name(transport)); }

EndpointOptions endpoint_options(Transport transport) {
  EndpointOptions options;
  options.transport = transport;
  return options;
}

// The parent's and the child's duplex ends: by duplex(), or by address.
template <class Out, class In>
void round_trips(benchmark::State& state, Transport transport, bool connected, const Out& message, const In& reply) {
  const std::string address = bench_address("rt");
  DuplexEnd<Out, In> parent;
  DuplexEnd<In, Out> child_end;
  Listener listener;
  if (connected) {
    listener = listen(address, endpoint_options(transport));
  } else {
    std::tie(parent, child_end) = duplex<Out, In>(transport);
  }
  {
    bench::RoundTripTimes times(state);
    bench::ChildProcess child([&] {
      parent.detach();
      if (connected) {
        listener.close();
        child_end = connect_duplex<In, Out>(address, endpoint_options(transport));
      }
      while (auto got = child_end.recv()) child_end.send(reply);
    });
    child_end.detach();
    if (connected) parent = listener.accept_duplex<Out, In>();
    for (auto _ : state) {
      const auto sample = times.sample();
      parent.send(message);
      benchmark::DoNotOptimize(parent.recv());
    }
    parent.close();
    times.report(state);
  }
}

void bytes_round_trip(benchmark::State& state, Transport transport, bool connected) {
  const std::vector<std::uint8_t> bytes(64, 7);
  round_trips<std::vector<std::uint8_t>, std::vector<std::uint8_t>>(state, transport, connected, bytes, bytes);
}

void tensor_round_trip(benchmark::State& state, Transport transport, bool connected) {
  const Tensor tensor = Tensor::zeros({1 << 20}, DType::UInt8, Device::SharedCpu);
  round_trips<Tensor, std::uint8_t>(state, transport, connected, tensor, std::uint8_t{1});
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * (1 << 20));
}

// ---- making connections -------------------------------------------------------------

sockaddr_un abstract_socket_address(const std::string& address, socklen_t& length) {
  sockaddr_un where{};
  where.sun_family = AF_UNIX;
  const std::string name = address.substr(std::string("unix:@").size());
  std::memcpy(where.sun_path + 1, name.data(), name.size());
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return where;
}

detail::UniqueFd raw_listen(const std::string& address) {
  socklen_t length = 0;
  const sockaddr_un where = abstract_socket_address(address, length);
  detail::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&where), length) != 0 || ::listen(fd.get(), SOMAXCONN) != 0) {
    throw std::runtime_error("raw listen failed");
  }
  return fd;
}

// Connects to `address` (retrying while the listener is not there yet) and reads 1 byte.
bool raw_connect_and_read(const std::string& address) {
  socklen_t length = 0;
  const sockaddr_un where = abstract_socket_address(address, length);
  detail::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  while (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&where), length) != 0) {
    if (errno != ECONNREFUSED && errno != EAGAIN) return false;
    std::this_thread::sleep_for(100us);
  }
  char byte = 0;
  return ::read(fd.get(), &byte, 1) == 1;
}

void raw_accept_and_write(int listening) {
  detail::UniqueFd connection(::accept4(listening, nullptr, nullptr, SOCK_CLOEXEC));
  const char byte = 1;
  if (!connection || ::write(connection.get(), &byte, 1) != 1) throw std::runtime_error("raw accept failed");
}

// One connection per iteration: the child connects `state.iterations()` times in a row.
void connect_to_first_message(benchmark::State& state, std::optional<Transport> transport) {
  const std::string address = bench_address("first");
  const auto iterations = static_cast<std::int64_t>(state.max_iterations);
  if (!transport) {
    detail::UniqueFd listening = raw_listen(address);
    bench::ChildProcess child([&] {
      listening.reset();
      for (std::int64_t i = 0; i < iterations; ++i) {
        if (!raw_connect_and_read(address)) throw std::runtime_error("raw client failed");
      }
    });
    for (auto _ : state) raw_accept_and_write(listening.get());
    return;
  }
  Listener listener = listen(address, endpoint_options(*transport));
  bench::ChildProcess child([&] {
    listener.close();
    for (std::int64_t i = 0; i < iterations; ++i) {
      Receiver<int> rx = connect_receiver<int>(address, endpoint_options(*transport));
      if (!rx.recv()) throw std::runtime_error("no first message");
    }
  });
  for (auto _ : state) {
    Sender<int> tx = listener.accept_sender<int>();
    tx.send(1);
  }
}

// Per iteration, 64 threads of a new child process connect at once and read one message.
void accepts(benchmark::State& state, std::optional<Transport> transport) {
  constexpr int kClients = 64;
  const std::string address = bench_address("accepts");
  detail::UniqueFd raw_listening;
  Listener listener;
  if (transport) {
    listener = listen(address, endpoint_options(*transport));
  } else {
    raw_listening = raw_listen(address);
  }
  for (auto _ : state) {
    state.PauseTiming();
    {
      bench::ChildProcess child(
          [&] {
            listener.close();
            raw_listening.reset();
            std::vector<std::thread> threads;
            std::atomic<int> failed{0};
            for (int i = 0; i < kClients; ++i) {
              threads.emplace_back([&] {
                try {
                  if (transport) {
                    if (!connect_receiver<int>(address, endpoint_options(*transport)).recv()) ++failed;
                  } else if (!raw_connect_and_read(address)) {
                    ++failed;
                  }
                } catch (const std::exception&) {
                  ++failed;
                }
              });
            }
            for (auto& thread : threads) thread.join();
            if (failed != 0) throw std::runtime_error("a client failed");
          },
          bench::Placement::Anywhere, 10s);
      state.ResumeTiming();
      for (int i = 0; i < kClients; ++i) {
        if (transport) {
          Sender<int> tx = listener.accept_sender<int>();
          tx.send(1);
        } else {
          raw_accept_and_write(raw_listening.get());
        }
      }
      state.PauseTiming();
    }  // the child is reaped here
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * kClients);
}

[[maybe_unused]] const bool registered = [] {
  for (const Transport transport : {Transport::UnixSocket, Transport::ShmRing}) {
    const std::string name = transport_label(transport);
    for (const bool connected : {false, true}) {
      const std::string kind = connected ? "connected" : "channel";
      benchmark::RegisterBenchmark(("endpoint/" + kind + "/" + name + "/bytes/64").c_str(), bytes_round_trip, transport,
                                   connected);
      benchmark::RegisterBenchmark(("endpoint/" + kind + "/" + name + "/tensor_same/1MiB").c_str(), tensor_round_trip,
                                   transport, connected);
    }
    benchmark::RegisterBenchmark(("endpoint/connected/" + name + "/connect_to_first_message").c_str(),
                                 connect_to_first_message, std::optional<Transport>(transport))
        ->Iterations(2000);
    benchmark::RegisterBenchmark(("endpoint/connected/" + name + "/accepts/64_clients").c_str(), accepts,
                                 std::optional<Transport>(transport))
        ->Iterations(20)
        ->UseRealTime();
  }
  benchmark::RegisterBenchmark("endpoint/raw/connect_to_first_byte", connect_to_first_message,
                               std::optional<Transport>())
      ->Iterations(2000);
  benchmark::RegisterBenchmark("endpoint/raw/accepts/64_clients", accepts, std::optional<Transport>())
      ->Iterations(20)
      ->UseRealTime();
  return true;
}();

}  // namespace
}  // namespace ferry::bench::endpoints
