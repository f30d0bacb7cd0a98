// ucx:// endpoints against raw TCP, side by side (ferry_ucx_bench; run it with
// --benchmark_repetitions=5 and compare medians). UCX_TLS defaults to tcp here (as across
// hosts without RDMA). The peer serves one connection per benchmark: a thread of this
// process on the other CPU over loopback (a fork child of a process that used UCX must not
// touch UCX), or, with FERRY_UCX_BENCH_PEER="NETNS HOST", this executable re-run as
// `--peer` in network namespace NETNS and reached at HOST (scripts/ucx-veth-bench: two
// namespaces joined by a veth pair).
// Names:
//   ucx/raw_tcp/round_trip/64B           64 B ping-pong over a TCP socket (TCP_NODELAY), blocking reads
//   ucx/ferry/round_trip/64B             a 64 B message and back over a ucx:// duplex connection
//   ucx/raw_tcp/round_trip/{1MiB,64MiB}  N bytes each way over TCP, each side reading into its buffer
//   ucx/ferry/round_trip/{1MiB,64MiB}    a tensor of N bytes and back (the peer sends back what it got)
//   ucx/raw_tcp/stream/64MiB             64 MiB blocks one way, received straight into a memfd mapping
//   ucx/ferry/stream/64MiB               64 MiB tensors one way (the receiver drops each)
#include <benchmark/benchmark.h>
#include <sys/socket.h>

#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>

#include "ucx/ucx_bench_peer.hpp"
#include "ucx/ucx_bench_wire.hpp"

namespace ferry::bench::ucx {
namespace {

void raw_round_trip(benchmark::State& state, std::size_t bytes) {
  const Peer peer("raw-echo", bytes, [bytes](const Ready& ready) { serve_raw_echo(Peer::kLoopback, bytes, ready); });
  const detail::UniqueFd fd = tcp_connect(peer.host(), peer.port());
  pin_to(0);
  std::vector<std::byte> out(bytes, std::byte{1});
  std::vector<std::byte> in(bytes);
  for (auto _ : state) {
    if (!write_all(fd.get(), out.data(), bytes) || !read_all(fd.get(), in.data(), bytes)) {
      state.SkipWithError("raw TCP peer went away");
      break;
    }
  }
  ::shutdown(fd.get(), SHUT_RDWR);
  unpin();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes * 2));
}

void raw_stream(benchmark::State& state, std::size_t bytes) {
  const Peer peer("raw-sink", bytes, [bytes](const Ready& ready) { serve_raw_sink(Peer::kLoopback, bytes, ready); });
  const detail::UniqueFd fd = tcp_connect(peer.host(), peer.port());
  pin_to(0);
  std::vector<std::byte> block(bytes, std::byte{3});
  std::byte ack{};
  for (auto _ : state) {
    if (!write_all(fd.get(), block.data(), bytes) || !read_all(fd.get(), &ack, 1)) {
      state.SkipWithError("raw TCP reader went away");
      break;
    }
  }
  ::shutdown(fd.get(), SHUT_RDWR);
  unpin();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

std::string ucx_address(const Peer& peer) { return "ucx://" + peer.host() + ":" + std::to_string(peer.port()); }

template <class T>
void ferry_round_trip(benchmark::State& state, const T& message, std::size_t bytes) {
  const Peer peer(std::is_same_v<T, Bytes64> ? "ferry-echo64" : "ferry-echo", 0,
                  [](const Ready& ready) { serve_ferry_echo<T>(Peer::kLoopback, ready); });
  {
    DuplexEnd<T, T> end = connect_duplex<T, T>(ucx_address(peer), bench_options());
    pin_to(0);
    for (auto _ : state) {
      end.send(message);
      auto back = end.recv();
      if (!back) {
        state.SkipWithError("the ucx:// peer went away");
        break;
      }
      benchmark::DoNotOptimize(back);
    }
    end.close();
  }
  unpin();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes * 2));
}

void ferry_stream(benchmark::State& state, std::size_t bytes) {
  const Peer peer("ferry-sink", 0, [](const Ready& ready) { serve_ferry_sink(Peer::kLoopback, ready); });
  {
    auto end = connect_duplex<TensorMessage, TensorMessage>(ucx_address(peer), bench_options());
    pin_to(0);
    const TensorMessage message{Tensor::zeros({static_cast<std::int64_t>(bytes)}, DType::UInt8, Device::SharedCpu)};
    for (auto _ : state) end.send(message);  // returns once the reader took the tensor (rendezvous)
    end.close();
  }
  unpin();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

TensorMessage tensor_of(std::size_t bytes) {
  return TensorMessage{Tensor::zeros({static_cast<std::int64_t>(bytes)}, DType::UInt8, Device::SharedCpu)};
}

void BM_raw_rt_64(benchmark::State& state) { raw_round_trip(state, 64); }
void BM_ferry_rt_64(benchmark::State& state) { ferry_round_trip(state, Bytes64{}, 64); }
void BM_raw_rt_1MiB(benchmark::State& state) { raw_round_trip(state, kMiB); }
void BM_ferry_rt_1MiB(benchmark::State& state) { ferry_round_trip(state, tensor_of(kMiB), kMiB); }
void BM_raw_rt_64MiB(benchmark::State& state) { raw_round_trip(state, 64 * kMiB); }
void BM_ferry_rt_64MiB(benchmark::State& state) { ferry_round_trip(state, tensor_of(64 * kMiB), 64 * kMiB); }
void BM_raw_stream_64MiB(benchmark::State& state) { raw_stream(state, 64 * kMiB); }
void BM_ferry_stream_64MiB(benchmark::State& state) { ferry_stream(state, 64 * kMiB); }

BENCHMARK(BM_raw_rt_64)->Name("ucx/raw_tcp/round_trip/64B")->UseRealTime();
BENCHMARK(BM_ferry_rt_64)->Name("ucx/ferry/round_trip/64B")->UseRealTime();
BENCHMARK(BM_raw_rt_1MiB)->Name("ucx/raw_tcp/round_trip/1MiB")->UseRealTime();
BENCHMARK(BM_ferry_rt_1MiB)->Name("ucx/ferry/round_trip/1MiB")->UseRealTime();
BENCHMARK(BM_raw_rt_64MiB)->Name("ucx/raw_tcp/round_trip/64MiB")->UseRealTime()->Iterations(20);
BENCHMARK(BM_ferry_rt_64MiB)->Name("ucx/ferry/round_trip/64MiB")->UseRealTime()->Iterations(20);
BENCHMARK(BM_raw_stream_64MiB)->Name("ucx/raw_tcp/stream/64MiB")->UseRealTime()->Iterations(20);
BENCHMARK(BM_ferry_stream_64MiB)->Name("ucx/ferry/stream/64MiB")->UseRealTime()->Iterations(20);

}  // namespace
}  // namespace ferry::bench::ucx

int main(int argc, char** argv) {
  // UCX reads its environment when it starts: TCP, unless the user chose.
  if (::setenv("UCX_TLS", "tcp", 0) != 0) return 1;
  if (argc > 1 && std::string_view(argv[1]) == "--peer") return ferry::bench::ucx::run_peer(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
