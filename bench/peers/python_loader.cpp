// The C++ loader of bench/peers/python_trainer.py: listens at ADDRESS, accepts one trainer
// (ferry.connect_receiver) and sends it a new image batch per step as a ferry::Value.
//
// Usage: ferry_python_loader ADDRESS STEPS [PACE_MS]
// PACE_MS (default 0): how long to wait before making each batch.
// Each step: float32 images [64, 3, 224, 224] (36.75 MiB) allocated anew from shared memory
// and filled with the step number, ten small float32 tensors [64], 64 file names, and the
// CLOCK_MONOTONIC time in ns just before the send ("sent_ns"; after the fill, so the
// trainer's latency is the transfer's).
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "ferry/endpoint.hpp"
#include "ferry/value.hpp"

namespace {

ferry::Value batch(std::int64_t step) {
  ferry::Tensor images = ferry::Tensor::empty({64, 3, 224, 224}, ferry::DType::Float32, ferry::Device::SharedCpu);
  images.fill(static_cast<float>(step));
  ferry::ValueList small;
  for (int i = 0; i < 10; ++i) {
    ferry::Tensor t = ferry::Tensor::empty({64}, ferry::DType::Float32, ferry::Device::SharedCpu);
    t.fill(static_cast<float>(i));
    small.emplace_back(std::move(t));
  }
  ferry::ValueList names;
  for (int i = 0; i < 64; ++i) names.emplace_back("train/" + std::to_string(step) + "/" + std::to_string(i) + ".jpg");
  return ferry::ValueMap{{"step", step}, {"images", images}, {"small", small}, {"names", names}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: ferry_python_loader ADDRESS STEPS [PACE_MS]\n");
    return 2;
  }
  try {
    ferry::Listener listener = ferry::listen(argv[1]);
    ferry::Sender<ferry::Value> tx = listener.accept_sender<ferry::Value>();
    const std::int64_t steps = std::stoll(argv[2]);
    const std::chrono::milliseconds pace(argc == 4 ? std::stoll(argv[3]) : 0);
    for (std::int64_t step = 0; step < steps; ++step) {
      std::this_thread::sleep_for(pace);
      ferry::Value message = batch(step);
      const auto now = std::chrono::steady_clock::now().time_since_epoch();  // CLOCK_MONOTONIC, as time.monotonic_ns()
      message.as_map().insert_or_assign("sent_ns", std::chrono::duration_cast<std::chrono::nanoseconds>(now).count());
      tx.send(std::move(message));
    }
    tx.close();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ferry_python_loader: %s\n", error.what());
    return 1;
  }
  return 0;
}
