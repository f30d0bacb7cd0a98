// Sends batches of shared tensors from one process to another and reports what moved and
// how long it took. Usage: pipeline [--transport pipe|unix_socket] [--batches N] [--mib M]
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

namespace {

struct Batch {
  std::int64_t step = 0;
  ferry::Tensor images;
  ferry::Tensor labels;
  template <class Archive>
  void serialize(Archive& ar) { ar(step, images, labels); }
};

struct Options {
  ferry::Transport transport = ferry::Transport::UnixSocket;
  int batches = 200;
  std::int64_t mib = 64;
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : "";
    if (arg == "--transport") {
      const std::string name = value;
      if (name == "pipe") options.transport = ferry::Transport::Pipe;
      else if (name == "unix_socket") options.transport = ferry::Transport::UnixSocket;
      else throw std::runtime_error("unknown transport '" + name + "' (pipe or unix_socket)");
      ++i;
    } else if (arg == "--batches") {
      options.batches = std::stoi(value);
      ++i;
    } else if (arg == "--mib") {
      options.mib = std::stoll(value);
      ++i;
    } else {
      throw std::runtime_error("usage: pipeline [--transport pipe|unix_socket] [--batches N] [--mib M]");
    }
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options options = parse(argc, argv);
  auto [to_sink, from_loader] = ferry::channel<Batch>(options.transport);
  // The sink hands each batch's step back when it is done with the batch's memory, so the
  // loader knows which buffer it may fill again (zero copy: both see the same bytes).
  auto [to_loader, from_sink] = ferry::channel<std::int64_t>(options.transport);

  const pid_t sink = ::fork();
  if (sink == 0) {  // the sink: checks every batch and reports its checksum
    to_sink.detach();
    from_sink.close();
    to_loader.adopt();
    bool all_good = true;
    while (auto batch = from_loader.recv()) {
      const float* pixels = batch->images.data<float>();
      all_good &= pixels[0] == static_cast<float>(batch->step) && pixels[batch->images.numel() - 1] == 1.0f;
      all_good &= batch->labels.at<std::int64_t>({0}) == batch->step;
      to_loader.send(batch->step);
    }
    to_loader.close();
    ::_exit(all_good ? 0 : 3);
  }
  from_loader.close();
  to_loader.detach();

  // A pool of buffers in shared memory from the start: sending copies nothing. A buffer is
  // filled again only after the sink handed its step back.
  constexpr int kInFlight = 4;
  const std::int64_t floats = options.mib * 1024 * 1024 / 4;
  std::vector<ferry::Tensor> images, labels;
  for (int i = 0; i < kInFlight; ++i) {
    images.push_back(ferry::Tensor::zeros({floats}, ferry::DType::Float32, ferry::Device::SharedCpu));
    labels.push_back(ferry::Tensor::zeros({64}, ferry::DType::Int64, ferry::Device::SharedCpu));
  }
  const auto start = std::chrono::steady_clock::now();
  int returned = 0;
  for (int step = 0; step < options.batches; ++step) {
    if (step >= kInFlight) {  // wait until the sink is done with this buffer
      from_sink.recv().value();
      ++returned;
    }
    const int slot = step % kInFlight;
    images[slot].data<float>()[0] = static_cast<float>(step);
    images[slot].data<float>()[floats - 1] = 1.0f;
    labels[slot].at<std::int64_t>({0}) = step;
    to_sink.send(Batch{step, images[slot], labels[slot]});
  }
  to_sink.close();
  while (from_sink.recv()) ++returned;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int status = 0;
  ::waitpid(sink, &status, 0);
  const bool verified = returned == options.batches && WIFEXITED(status) && WEXITSTATUS(status) == 0;

  const double gib = static_cast<double>(options.batches) * static_cast<double>(options.mib) / 1024.0;
  std::printf("pipeline: %d batches of %lld MiB over %s in %.3f s\n", options.batches,
              static_cast<long long>(options.mib), std::string(ferry::transport_name(options.transport)).c_str(),
              seconds);
  std::printf("  %.0f batches/s, %.1f GiB/s of tensor data moved without copying, %.1f us per batch\n",
              options.batches / seconds, gib / seconds, seconds * 1e6 / options.batches);
  std::printf("  sink verified every batch: %s\n", verified ? "yes" : "NO");
  return verified ? 0 : 1;
} catch (const std::exception& error) {
  std::fprintf(stderr, "pipeline: %s\n", error.what());
  return 1;
}
