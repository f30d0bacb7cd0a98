// The C++ loader of bench/peers/python_trainer.py: a new image batch per step, sent as a
// ferry::Value to a Python trainer over the Sender it inherited.
//
// Usage: ferry_python_loader DESCRIPTION_HEX STEPS [PACE_MS]
// DESCRIPTION_HEX: the cereal-binary EndDescription of a Sender<Value> (hex), whose
// descriptors this process inherited (Sender._describe() on the Python side). PACE_MS
// (default 0): how long to wait before making each batch.
// Each step: float32 images [64, 3, 224, 224] (36.75 MiB) allocated anew from shared memory
// and filled with the step number, ten small float32 tensors [64], 64 file names, and the
// CLOCK_MONOTONIC time in ns just before the send ("sent_ns"; after the fill, so the
// trainer's latency is the transfer's).
#include <cereal/archives/binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>

#include "ferry/end_description.hpp"
#include "ferry/value.hpp"

namespace {

std::string from_hex(const std::string& hex) {
  std::string bytes;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return bytes;
}

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
    std::fprintf(stderr, "usage: ferry_python_loader DESCRIPTION_HEX STEPS [PACE_MS]\n");
    return 2;
  }
  try {
    ferry::EndDescription description;
    {
      std::istringstream in(from_hex(argv[1]));
      cereal::BinaryInputArchive archive(in);
      archive(description);
    }
    ferry::Sender<ferry::Value> tx = ferry::sender_from_description<ferry::Value>(description);
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
