// ferry side of bench/peers/compare: the same round trips as torch_roundtrip.py
// (parent -> child -> parent, the child sends the message back), over one transport.
//
// Usage: ferry_roundtrip TRANSPORT [ITERATIONS_SCALE] [PIN]
// PIN (default 1): 1 pins the parent to the first allowed CPU and the child to the last, as
// torch_roundtrip.py does with the same argument; 0 leaves both to the scheduler.
// Prints one JSON object: {"ferry/<transport>/<case>/<bytes>": [microseconds, ...], ...}
// Cases (float32 tensors; the timed part starts before the tensor is created):
//   same         the same shared tensor sent again and again
//   new_shared   a new tensor (Tensor::empty) allocated in shared memory each time: ferry's way
//   new_private  a new private (heap) tensor (Tensor::empty) each time: send copies it into
//                shared memory, as torch does
//   ten_small    a message of the same 10 shared tensors of 4 KiB each

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"
#include "support/child_process.hpp"

namespace {

using ferry::Device;
using ferry::DType;
using ferry::Tensor;
using Message = std::vector<Tensor>;
using Clock = std::chrono::steady_clock;

// Untimed round trips before each case: the first warms up the connection. In the new-tensor
// cases a block comes back to the caching allocator two round trips after it was sent (the
// next message tells the child that the parent dropped it; the child gives it back once the
// parent returned the echo's lease, which it learns one message later): from the third round
// trip on, every new tensor reuses a block. Same count on torch's side.
constexpr int kWarmUp = 3;

int iterations_for(std::int64_t size, double scale) {
  const int base = size <= (1 << 20) ? 200 : size <= (64 << 20) ? 8 : 4;
  return std::max(2, static_cast<int>(base * scale));
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 2) throw std::runtime_error("usage: ferry_roundtrip TRANSPORT [ITERATIONS_SCALE]");
  const auto transport = ferry::transport_from_name(argv[1]);
  if (!transport) throw std::runtime_error("unknown transport '" + std::string(argv[1]) + "'");
  const double scale = argc > 2 ? std::stod(argv[2]) : 1.0;
  const bool pin = argc > 3 ? std::string(argv[3]) != "0" : true;
  const std::string prefix = "ferry/" + std::string(argv[1]) + "/";

  auto [ping_tx, ping_rx] = ferry::channel<Message>(*transport);
  auto [pong_tx, pong_rx] = ferry::channel<Message>(*transport);
  std::map<std::string, std::vector<double>> results;
  ferry::bench::ChildProcess child(
      [&, &ping_tx = ping_tx, &ping_rx = ping_rx, &pong_tx = pong_tx, &pong_rx = pong_rx] {
        ping_tx.detach();
        pong_rx.close();
        pong_tx.adopt();
        while (auto message = ping_rx.recv()) pong_tx.send(*message);
        pong_tx.close();
      },
      pin ? ferry::bench::Placement::AcrossFromCaller : ferry::bench::Placement::Anywhere, std::chrono::seconds(10));
  ping_rx.close();
  pong_tx.detach();

  auto measure = [&, &ping_tx = ping_tx, &pong_rx = pong_rx](const std::string& name,
                                                             const std::function<Message()>& make, int count) {
    std::vector<double> samples;
    for (int i = 0; i < kWarmUp + count; ++i) {
      const auto start = Clock::now();
      {
        Message message = make();
        ping_tx.send(message);
        Message back = pong_rx.recv().value();
      }
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      if (i >= kWarmUp) samples.push_back(us);
    }
    results[prefix + name] = std::move(samples);
  };

  for (const std::int64_t size :
       {std::int64_t{4096}, std::int64_t{1} << 20, std::int64_t{64} << 20, std::int64_t{256} << 20}) {
    const int count = iterations_for(size, scale);
    const std::string bytes = std::to_string(size);
    Tensor same = Tensor::zeros({size / 4}, DType::Float32, Device::SharedCpu);
    measure(
        "same/" + bytes, [&] { return Message{same}; }, count);
    measure(
        "new_shared/" + bytes, [&] { return Message{Tensor::empty({size / 4}, DType::Float32, Device::SharedCpu)}; },
        count);
    measure(
        "new_private/" + bytes, [&] { return Message{Tensor::empty({size / 4}, DType::Float32, Device::Cpu)}; }, count);
  }
  Message small;
  for (int i = 0; i < 10; ++i) small.push_back(Tensor::zeros({1024}, DType::Float32, Device::SharedCpu));
  measure(
      "ten_small/40960", [&] { return small; }, iterations_for(4096, scale));

  ping_tx.close();  // the child's loop ends; ChildProcess reaps it when main returns

  std::printf("{");
  bool first = true;
  for (const auto& [name, samples] : results) {
    std::printf("%s\"%s\": [", first ? "" : ", ", name.c_str());
    for (std::size_t i = 0; i < samples.size(); ++i) std::printf("%s%.3f", i ? ", " : "", samples[i]);
    std::printf("]");
    first = false;
  }
  std::printf("}\n");
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "ferry_roundtrip: %s\n", error.what());
  return 1;
}
