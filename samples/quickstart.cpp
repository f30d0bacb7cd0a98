// The README's example: a struct with tensors sent to a spawned worker, zero copy.
#include <cstdio>

#include <cereal/types/string.hpp>  // cereal's support for the standard types Batch holds
#include <cereal/types/vector.hpp>

// One header per part of ferry compiles faster than "ferry/ferry.hpp", which includes all of
// ferry and cereal's support for every standard type.
#include "ferry/channel.hpp"
#include "ferry/init.hpp"
#include "ferry/spawn.hpp"
#include "ferry/tensor.hpp"

struct Batch {
  std::int64_t step = 0;
  std::string tag;
  ferry::Tensor images;  // tensors can sit anywhere inside a message
  std::vector<ferry::Tensor> extra;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(step, tag, images, extra);
  }
};

// A worker: receives batches until the stream ends. Its writes land in the sender's memory.
void train(ferry::WorkerContext& ctx, ferry::Receiver<Batch> in, ferry::Sender<double> out) {
  while (auto batch = in.recv()) {
    batch->images.data<float>()[0] += 1.0f;  // maps the parent's pages: no copy either way
    out.send(static_cast<double>(batch->images.numel()) + ctx.rank());
  }
}
FERRY_WORKER(train);  // lets the exec-based start method find it by name

int main(int argc, char** argv) {
  ferry::init(argc, argv);  // runs the worker when this process is one
  auto images = ferry::Tensor::zeros({64, 3, 224, 224}, ferry::DType::Float32, ferry::Device::SharedCpu);
  auto [tx, rx] = ferry::channel<Batch>(ferry::Transport::ShmRing);
  auto [back_tx, back_rx] = ferry::channel<double>(ferry::Transport::ShmRing);
  auto workers = ferry::spawn(1, train, std::move(rx), std::move(back_tx));
  for (std::int64_t step = 0; step < 3; ++step) {
    tx.send(Batch{step, "train", images, {images.select(0, 1)}});
    std::printf("step %lld: worker saw %.0f elements\n", static_cast<long long>(step), back_rx.recv().value());
  }
  tx.close();
  workers.join();  // rethrows a worker's failure, naming rank, cause and message
  std::printf("images[0] = %.0f (the worker's writes, in our memory)\n", images.data<float>()[0]);
}
