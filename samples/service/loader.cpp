// The loader service: listens at an address, gives every trainer that connects its own
// stream of batches, and collects the trainers' stats. Trainers come and go: one that dies
// is dropped at the next send, one that (re)connects is accepted while the loader runs.
//
//   service_loader --address unix:@ferry-loader --batches 200
#include <chrono>
#include <cstdio>
#include <list>
#include <map>

#include "../sample_flags.hpp"
#include "messages.hpp"

using namespace std::chrono_literals;
using service::Batch;
using service::Stats;

namespace {

struct Trainer {
  int id = 0;
  ferry::Sender<Batch> batches;
  std::int64_t next_step = 0;
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
  listener.serve_sender<Batch>();    // trainers: connect_receiver<Batch>
  listener.serve_receiver<Stats>();  // their reports: connect_sender<Stats>
  std::printf("loader: listening at %s\n", listener.address().c_str());
  std::fflush(stdout);

  ferry::Selector selector;
  const std::size_t listener_index = selector.add(listener);
  std::list<Trainer> trainers;
  std::map<std::size_t, ferry::Receiver<Stats>> reports;  // by Selector index
  int next_id = 0;
  long handed_out = 0;
  while (handed_out < total) {
    // New clients: trainers and their stats senders.
    while (auto batches = listener.accept_sender_for<Batch>(0ms)) {
      trainers.push_back(Trainer{next_id++, std::move(*batches), 0});
      std::printf("loader: trainer %d connected\n", trainers.back().id);
    }
    while (auto stats = listener.accept_receiver_for<Stats>(0ms)) {
      const std::size_t index = selector.add(*stats);  // the Selector follows the end when it moves
      reports.emplace(index, std::move(*stats));
    }
    // One batch to each trainer; a trainer that died is dropped.
    for (auto it = trainers.begin(); it != trainers.end() && handed_out < total;) {
      try {
        if (it->batches.send_for(make_batch(it->next_step, rows, 1024), 100ms)) {
          ++it->next_step;
          ++handed_out;
        }
        ++it;
      } catch (const ferry::ChannelClosed&) {
        std::printf("loader: trainer %d is gone after %lld batches\n", it->id, static_cast<long long>(it->next_step));
        it = trainers.erase(it);
      }
    }
    // Reports that arrived; without trainers, wait for a client instead of spinning.
    const auto wait = trainers.empty() ? ferry::Timeout(1s) : ferry::Timeout(0ms);
    for (auto ready = selector.wait_for(wait); ready; ready = selector.try_wait()) {
      if (*ready == listener_index) break;  // accepted at the top of the loop
      auto found = reports.find(*ready);
      try {
        if (auto stats = found->second.recv()) {
          std::printf("loader: %s step %lld loss %.4f\n", stats->trainer.c_str(), static_cast<long long>(stats->step),
                      stats->loss);
          continue;
        }
      } catch (const ferry::PeerDied&) {
      }
      selector.remove(found->first);  // that trainer's reports ended
      reports.erase(found);
    }
    std::fflush(stdout);
  }
  std::printf("loader: handed out %ld batches, closing\n", handed_out);
  for (auto& trainer : trainers) trainer.batches.close();
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "loader: %s\n", error.what());
  return 1;
}
