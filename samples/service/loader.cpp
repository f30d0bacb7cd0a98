// The loader service: listens at an address and gives every trainer that connects its own
// stream of batches, at most two ahead of what the trainer reported back (its stats are
// the credits). Trainers come and go: one that dies is dropped (its batches in flight are
// lost), one that (re)connects is accepted while the loader runs.
//
//   service_loader --address unix:@ferry-loader --batches 200
#include <chrono>
#include <cstdio>
#include <map>

#include "../sample_flags.hpp"
#include "messages.hpp"

using namespace std::chrono_literals;
using service::Batch;
using service::Stats;

namespace {

constexpr int kAhead = 2;  // batches a trainer may hold before it reports

struct Trainer {
  int id = 0;
  ferry::DuplexEnd<Batch, Stats> end;  // sends batches, receives stats
  int in_flight = 0;
  std::int64_t sent = 0;
};

Batch make_batch(std::int64_t step, std::int64_t rows, std::int64_t pixels) {
  Batch batch{step, ferry::Tensor::empty({rows, pixels}, ferry::DType::Float32, ferry::Device::SharedCpu),
              ferry::Tensor::empty({rows}, ferry::DType::Int64, ferry::Device::SharedCpu)};
  auto* images = batch.images.data<float>();
  for (std::int64_t i = 0; i < rows * pixels; ++i) images[i] = static_cast<float>((i + step) % 251) / 251.0f;
  auto* labels = batch.labels.data<std::int64_t>();
  for (std::int64_t i = 0; i < rows; ++i) labels[i] = (i + step) % 10;
  return batch;
}

}  // namespace

int main(int argc, char** argv) try {
  const samples::Flags flags(argc, argv,
                             {{"--address", "where to listen (default unix:@ferry-loader)"},
                              {"--batches", "batches to hand out in all before stopping (default 200)"},
                              {"--rows", "rows per batch (default 64)"},
                              {"--transport", "unix_socket (default) or shm_ring; trainers must use the same"}},
                             "service_loader: hands batches to trainers that connect to its address");
  const std::string address = flags.text("--address", "unix:@ferry-loader");
  const long total = flags.number("--batches", 200);
  const std::int64_t rows = flags.number("--rows", 64);
  ferry::EndpointOptions options;
  options.transport = flags.transport();

  ferry::Listener listener = ferry::listen(address, options);
  listener.serve_duplex<Batch, Stats>();  // trainers: connect_duplex<Stats, Batch>
  std::printf("loader: listening at %s\n", listener.address().c_str());
  std::fflush(stdout);

  ferry::Selector selector;
  const std::size_t listener_index = selector.add(listener);
  std::map<std::size_t, Trainer> trainers;  // by the Selector index of their stats
  int next_id = 0;
  long handed_out = 0;
  long reported = 0;
  const auto drop = [&](std::map<std::size_t, Trainer>::iterator it, const char* why) {
    std::printf("loader: trainer %d %s after %lld batches\n", it->second.id, why,
                static_cast<long long>(it->second.sent));
    selector.remove(it->first);
    return trainers.erase(it);
  };
  while (reported < total) {
    while (auto end = listener.accept_duplex_for<Batch, Stats>(0ms)) {
      const std::size_t index = selector.add(end->receiver);  // the Selector follows the end when it moves
      trainers.emplace(index, Trainer{next_id++, std::move(*end), 0, 0});
      std::printf("loader: trainer %d connected\n", next_id - 1);
    }
    // Hand out batches while trainers have room; a trainer that died is dropped.
    for (auto it = trainers.begin(); it != trainers.end();) {
      Trainer& trainer = it->second;
      try {
        while (trainer.in_flight < kAhead && handed_out < total) {
          trainer.end.send(make_batch(handed_out, rows, 1024));
          ++trainer.in_flight;
          ++trainer.sent;
          ++handed_out;
        }
        ++it;
      } catch (const ferry::ChannelClosed&) {
        handed_out -= trainer.in_flight;  // lost with it: hand them out again
        it = drop(it, "is gone");
      }
    }
    // Wait for a report or a new trainer.
    const auto ready = selector.wait_for(1s);
    if (!ready || *ready == listener_index) continue;
    auto it = trainers.find(*ready);
    try {
      if (auto stats = it->second.end.recv()) {
        --it->second.in_flight;
        ++reported;
        std::printf("loader: %s step %lld loss %.4f\n", stats->trainer.c_str(), static_cast<long long>(stats->step),
                    stats->loss);
        std::fflush(stdout);
        continue;
      }
      handed_out -= it->second.in_flight;
      drop(it, "left");
    } catch (const ferry::PeerDied&) {
      handed_out -= it->second.in_flight;
      drop(it, "died");
    }
  }
  std::printf("loader: %ld batches trained on, closing\n", reported);
  for (auto& [index, trainer] : trainers) trainer.end.close();
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "loader: %s\n", error.what());
  return 1;
}
