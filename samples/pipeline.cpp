// pipeline: loader -> transform -> sink, three processes passing shared tensor batches.
//
// The loader owns a small pool of batches in shared memory and fills them; the transform
// stage adds 1 to every element in place; the sink (this process) checks every element,
// measures latency per stage, and hands the batch back to the loader for reuse. No byte
// of tensor data is ever copied: each batch is mapped once per process, and every later
// send of it travels as a slot number.
//
//   build/release/samples/pipeline [--transport pipe|unix_socket|...] [--batch-mib 8]
//                                  [--batches 300] [--pool 4] [--start fork|spawn]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <set>
#include <vector>

#include "ferry/ferry.hpp"
#include "sample_flags.hpp"
#include "sample_main.hpp"

namespace {

using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC: one clock for every process

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

struct Config {
  std::int64_t elements = 0;  // int32 elements per batch
  std::int64_t batches = 0;
  std::int64_t pool = 0;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(elements, batches, pool);
  }
};

struct Batch {
  std::int64_t step = 0;
  ferry::Tensor data;  // int32[elements], element i of step s holds s + i (before the transform)
  std::int64_t fill_start_ns = 0;
  std::int64_t sent_ns = 0;          // loader sent it
  std::int64_t transform_in_ns = 0;  // transform received it
  std::int64_t transformed_ns = 0;   // transform sent it on
  template <class Archive>
  void serialize(Archive& ar) {
    ar(step, data, fill_start_ns, sent_ns, transform_in_ns, transformed_ns);
  }
};

std::int32_t expected(std::int64_t step, std::int64_t i) { return static_cast<std::int32_t>((step + i) & 0x3fffffff); }

// Stage 1: fills batches from a pool of shared tensors; reuses a batch when the sink hands it back.
void loader(ferry::WorkerContext&, Config config, ferry::Sender<Batch> out, ferry::Receiver<Batch> recycled) {
  std::vector<ferry::Tensor> pool;
  for (std::int64_t step = 0; step < config.batches; ++step) {
    ferry::Tensor data;
    if (static_cast<std::int64_t>(pool.size()) < config.pool) {
      data = ferry::Tensor::empty({config.elements}, ferry::DType::Int32, ferry::Device::SharedCpu);
      pool.push_back(data);
    } else {
      auto back = recycled.recv();
      if (!back) throw ferry::Error("the sink stopped handing batches back");
      data = std::move(back->data);
    }
    Batch batch;
    batch.step = step;
    batch.fill_start_ns = now_ns();
    auto* values = data.data<std::int32_t>();
    for (std::int64_t i = 0; i < config.elements; ++i) values[i] = expected(step, i);
    batch.data = std::move(data);
    batch.sent_ns = now_ns();
    out.send(batch);
  }
  out.close();
  while (recycled.recv()) {
  }  // the sink's last hand-backs, until it closes
}
FERRY_WORKER(loader);

// Keeps the pool's batches alive in a stage. A receiver keeps a batch mapped only while its
// sender holds it (the lease protocol), so a stage that let each batch go would map it
// again the next time round; holding the pool (a few tensors) makes every later send of a
// batch a slot number: no fd passing, no mmap, no page faults.
class PoolMirror {
 public:
  explicit PoolMirror(std::int64_t pool) : limit_(static_cast<std::size_t>(pool)) {}
  void hold(const ferry::Tensor& tensor) {
    for (const auto& held : held_) {
      if (held.shares_storage_with(tensor)) return;
    }
    if (held_.size() < limit_) held_.push_back(tensor);
  }
  std::size_t size() const { return held_.size(); }

 private:
  std::size_t limit_;
  std::vector<ferry::Tensor> held_;
};

// Stage 2: modifies each batch in place (the memory the loader filled) and passes it on.
void transform(ferry::WorkerContext&, Config config, ferry::Receiver<Batch> in, ferry::Sender<Batch> out) {
  PoolMirror pool(config.pool);
  while (auto batch = in.recv()) {
    pool.hold(batch->data);
    batch->transform_in_ns = now_ns();
    auto* values = batch->data.data<std::int32_t>();
    const std::int64_t n = batch->data.numel();
    for (std::int64_t i = 0; i < n; ++i) values[i] += 1;
    batch->transformed_ns = now_ns();
    out.send(*batch);
  }
}
FERRY_WORKER(transform);

struct Samples {
  std::vector<double> us;
  void add(std::int64_t ns) { us.push_back(static_cast<double>(ns) / 1000.0); }
  void print(const char* name) {
    std::sort(us.begin(), us.end());
    const double mean = std::accumulate(us.begin(), us.end(), 0.0) / static_cast<double>(us.size());
    auto at = [&](double q) {
      return us[std::min(us.size() - 1, static_cast<std::size_t>(q * static_cast<double>(us.size())))];
    };
    std::printf("    %-24s %10.1f %10.1f %10.1f\n", name, mean, at(0.5), at(0.99));
  }
};

int run(int argc, char** argv) {
  const samples::Flags flags(argc, argv,
                             {{"--transport", "pipe, unix_socket, ... (default unix_socket)"},
                              {"--batch-mib", "MiB of tensor data per batch (default 8)"},
                              {"--batches", "batches to push through (default 300)"},
                              {"--pool", "shared batches the loader cycles through (default 4)"},
                              {"--start", "worker start method: fork or spawn (default fork)"}},
                             "pipeline: loader -> transform -> sink over ferry channels");
  const ferry::Transport transport = flags.transport();
  Config config;
  config.elements = flags.number("--batch-mib", 8) * (1 << 20) / 4;
  config.batches = flags.number("--batches", 300);
  config.pool = flags.number("--pool", 4);
  ferry::SpawnOptions options;
  options.start_method = flags.start_method();
  const double batch_bytes = static_cast<double>(config.elements) * 4.0;

  auto [to_transform, transform_in] = ferry::channel<Batch>(transport);
  auto [transform_out, sink_in] = ferry::channel<Batch>(transport);
  auto [recycle, loader_recycled] = ferry::channel<Batch>(transport);
  std::printf("ferry pipeline: loader -> transform -> sink, transport %s, start method %s\n",
              std::string(ferry::transport_name(transport)).c_str(),
              std::string(ferry::start_method_name(options.start_method)).c_str());
  std::printf("  %lld batches of %.1f MiB (int32[%lld]), pool of %lld shared batches\n\n",
              static_cast<long long>(config.batches), batch_bytes / (1 << 20), static_cast<long long>(config.elements),
              static_cast<long long>(config.pool));

  auto loaders = ferry::spawn(options, 1, loader, config, std::move(to_transform), std::move(loader_recycled));
  auto transforms = ferry::spawn(options, 1, transform, config, std::move(transform_in), std::move(transform_out));

  Samples fill, to_transform_hop, transform_work, to_sink_hop, check, end_to_end;
  PoolMirror pool(config.pool);
  std::set<const void*> mapped;  // distinct memory the sink saw: one per pool batch
  std::int64_t received = 0;
  std::int64_t bad = 0;
  Clock::time_point first{};
  while (auto batch = sink_in.recv()) {
    const std::int64_t arrived = now_ns();
    if (received == 0) first = Clock::now();
    const auto* values = batch->data.data<std::int32_t>();
    for (std::int64_t i = 0; i < config.elements; ++i) {
      if (values[i] != expected(batch->step, i) + 1) {
        ++bad;
        break;
      }
    }
    const std::int64_t checked = now_ns();
    pool.hold(batch->data);
    mapped.insert(batch->data.data_ptr());
    fill.add(batch->sent_ns - batch->fill_start_ns);
    to_transform_hop.add(batch->transform_in_ns - batch->sent_ns);
    transform_work.add(batch->transformed_ns - batch->transform_in_ns);
    to_sink_hop.add(arrived - batch->transformed_ns);
    check.add(checked - arrived);
    end_to_end.add(checked - batch->fill_start_ns);
    ++received;
    recycle.send(*batch);  // back to the loader: the same memory, no copy
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - first).count();
  recycle.close();
  loaders.join();
  transforms.join();

  const double rate = static_cast<double>(received - 1) / seconds;  // intervals after the first batch
  std::printf("  throughput   %10.1f batches/s   %8.2f GB/s of tensor data, 0 bytes of it copied\n", rate,
              rate * batch_bytes / 1e9);
  std::printf("  sink mapped  %10zu storages (one per pool batch; every later send was a slot number)\n\n",
              mapped.size());
  std::printf("  latency per stage (us)          mean        p50        p99\n");
  fill.print("loader fill");
  to_transform_hop.print("loader -> transform");
  transform_work.print("transform (in place)");
  to_sink_hop.print("transform -> sink");
  check.print("sink check");
  end_to_end.print("end to end");
  if (received != config.batches || bad != 0) {
    std::printf("\nFAILED: %lld of %lld batches arrived, %lld with wrong contents\n", static_cast<long long>(received),
                static_cast<long long>(config.batches), static_cast<long long>(bad));
    return 1;
  }
  std::printf("\n  contents: all %lld batches verified\n", static_cast<long long>(received));
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return samples::main_of("pipeline", run, argc, argv); }
