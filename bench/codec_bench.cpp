// The CPU cost of turning a message into a frame and back, without any transport: what
// ferry adds to a round trip on top of the system calls of its transport.
#include <benchmark/benchmark.h>
#include <fcntl.h>

#include <cstring>
#include <deque>
#include <type_traits>
#include <vector>

#include "ferry/detail/message_decoder.hpp"
#include "ferry/detail/message_encoder.hpp"
#include "ferry/ferry.hpp"
#include "support/tensor_message.hpp"

namespace ferry::bench {
namespace {

// Encodes the message `make()` returns, flattens the frame as a transport would, decodes and
// reads it back, and drops both sides' copies (the receiver's drop gives its blocks back
// through the return board, which the next encode collects).
template <class Make>
void encode_decode_made(benchmark::State& state, Make make) {
  using T = std::decay_t<decltype(make())>;
  detail::MessageEncoder encoder(detail::HandlePassing::FdPassing);
  detail::MessageDecoder decoder(detail::type_fingerprint<T>(), detail::type_name<T>());
  std::deque<detail::UniqueFd> fds;
  std::vector<std::byte> bytes;
  for (auto _ : state) {
    const T message = make();
    const detail::EncodedFrame& frame = encoder.encode(message);
    bytes.clear();
    for (const iovec& part : frame.iovecs()) {
      const auto* begin = static_cast<const std::byte*>(part.iov_base);
      bytes.insert(bytes.end(), begin, begin + part.iov_len);
    }
    for (const int fd : frame.fds) fds.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    encoder.commit();
    detail::FrameHeader header;
    std::memcpy(&header, bytes.data(), sizeof header);
    detail::validate_header(header, FrameLimits{});
    decoder.decode(header, std::span<const std::byte>(bytes).subspan(sizeof header), fds);
    benchmark::DoNotOptimize(decoder.read<T>());
  }
}

// The same message every time.
template <class T>
void encode_decode(benchmark::State& state, const T& message) {
  encode_decode_made(state, [&message]() -> const T& { return message; });
}

void codec_bytes(benchmark::State& state) {
  encode_decode(state, std::vector<std::uint8_t>(static_cast<std::size_t>(state.range(0)), 1));
}

void codec_tensor_leased(benchmark::State& state) {
  encode_decode(state, TensorMessage{Tensor::zeros({1024}, DType::Float32, Device::SharedCpu)});
}

void codec_ten_tensors_leased(benchmark::State& state) {
  std::vector<Tensor> tensors;
  for (int i = 0; i < 10; ++i) tensors.push_back(Tensor::zeros({1024}, DType::Float32, Device::SharedCpu));
  encode_decode(state, tensors);
}

// N new 4 KiB shared tensors in every message: what issue 8's "100 small tensors" row costs
// in CPU on both sides together, without a transport (compare N = 100 with N = 1). In one
// process the decoder finds the storages the encoder remembered in their segment (the path
// of a block that comes back to its sender), so the receiving half costs a little less than
// in another process; AllocSmallTensors measures the real thing.
void codec_new_tensors(benchmark::State& state) {
  const auto count = static_cast<std::size_t>(state.range(0));
  encode_decode_made(state, [count] {
    std::vector<Tensor> tensors;
    tensors.reserve(count);
    for (std::size_t i = 0; i < count; ++i) tensors.push_back(Tensor::empty({1024}, DType::Float32, Device::SharedCpu));
    return tensors;
  });
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

// N views of one new 4 KiB-per-view shared storage (Tensor::unbind) in every message: the
// per-tensor cost that remains when the storage is shared (compare with new_tensors/N).
void codec_views_of_one_new_storage(benchmark::State& state) {
  const std::int64_t count = state.range(0);
  encode_decode_made(state, [count] {
    return Tensor::empty({count, 1024}, DType::Float32, Device::SharedCpu).unbind();
  });
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

BENCHMARK(codec_bytes)->Name("codec/bytes")->Arg(64)->Arg(4096);
BENCHMARK(codec_tensor_leased)->Name("codec/tensor_leased");
BENCHMARK(codec_ten_tensors_leased)->Name("codec/ten_tensors_leased");
BENCHMARK(codec_new_tensors)->Name("codec/new_tensors")->Arg(1)->Arg(10)->Arg(100);
BENCHMARK(codec_views_of_one_new_storage)->Name("codec/views_of_one_new_storage")->Arg(1)->Arg(100);

}  // namespace
}  // namespace ferry::bench
