// A trainer: connects to the loader service, trains on the batches of its own stream and
// reports stats back over the same connection (a DuplexEnd). Started on its own, in any order with the loader (connect
// waits up to EndpointOptions::connect_timeout for the loader to appear). When the loader dies the next recv() raises
// PeerDied and the trainer reconnects: the reconnect pattern. A trainer killed mid-run is simply started again; the
// loader accepts it as a new stream.
//
//   service_trainer --address unix:@ferry-loader --name a --steps 50
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "../sample_flags.hpp"
#include "messages.hpp"

using service::Batch;
using service::Stats;

int main(int argc, char** argv) try {
  const samples::Flags flags(argc, argv,
                             {{"--address", "the loader's address (default unix:@ferry-loader)"},
                              {"--name", "this trainer's name in the loader's log (default trainer)"},
                              {"--steps", "batches to train on before exiting (default 50)"},
                              {"--crash-after", "exit abruptly (no clean close) after this many batches"},
                              {"--step-ms", "time one training step takes (default 10)"},
                              {"--transport", "unix_socket (default) or shm_ring, as the loader"}},
                             "service_trainer: trains on batches from the loader service");
  const std::string address = flags.text("--address", "unix:@ferry-loader");
  const std::string name = flags.text("--name", "trainer");
  const long steps = flags.number("--steps", 50);
  const long crash_after = flags.number("--crash-after", 0, 0);
  const auto step_time = std::chrono::milliseconds(flags.number("--step-ms", 10, 0));
  ferry::EndpointOptions options;
  options.transport = flags.transport();

  long trained = 0;
  while (trained < steps) {
    try {
      ferry::DuplexEnd<Stats, Batch> loader = ferry::connect_duplex<Stats, Batch>(address, options);
      std::printf("%s: connected to %s\n", name.c_str(), address.c_str());
      while (trained < steps) {
        std::optional<Batch> batch = loader.recv();
        if (!batch) {  // the loader closed our stream: it is done
          std::printf("%s: the loader finished after %ld batches\n", name.c_str(), trained);
          return 0;
        }
        // "Training": the mean pixel, read straight from the loader's pages.
        const float* pixels = batch->images.data<float>();
        double sum = 0;
        for (std::int64_t i = 0; i < batch->images.numel(); ++i) sum += pixels[i];
        std::this_thread::sleep_for(step_time);
        loader.send(Stats{name, batch->step, sum / static_cast<double>(batch->images.numel())});
        if (++trained == crash_after) {
          std::printf("%s: crashing after %ld batches (start me again to reconnect)\n", name.c_str(), trained);
          std::fflush(stdout);
          std::_Exit(3);  // no clean close: the loader sees this trainer die
        }
      }
      loader.close();
    } catch (const ferry::PeerDied& error) {
      // The loader died (or restarts): connect again; connect_* waits for it to return.
      std::printf("%s: lost the loader (%s); reconnecting\n", name.c_str(), error.what());
    }
  }
  std::printf("%s: trained on %ld batches\n", name.c_str(), trained);
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "trainer: %s\n", error.what());
  return 1;
}
