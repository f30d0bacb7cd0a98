// workers: a pool of worker processes taking jobs and sending results back.
//
// The dispatcher (this process) keeps one job queue; every worker has its own job
// channel and result channel (a channel end belongs to one process), and the dispatcher
// hands the next job to whichever worker returned a result: one Selector fans in the
// results of all workers without a thread per worker. A job's input is a view of one
// shared tensor, so no input byte is copied.
//
// --fail makes worker 1 fail on its third job, to show how the failure is reported: the
// other workers are terminated and join() names the rank, the exception and its message.
//
//   build/release/samples/workers [--workers 4] [--jobs 40] [--fail] [--start fork|spawn]
//                                 [--transport pipe|unix_socket|...]
#include <cstdio>
#include <deque>
#include <vector>

#include "ferry/ferry.hpp"
#include "sample_flags.hpp"
#include "sample_main.hpp"

namespace {

struct Job {
  std::int64_t id = 0;
  ferry::Tensor input;  // a slice of the dispatcher's shared data
  template <class Archive>
  void serialize(Archive& ar) {
    ar(id, input);
  }
};

struct Result {
  std::int64_t id = 0;
  int rank = 0;
  double sum_of_squares = 0;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(id, rank, sum_of_squares);
  }
};

double sum_of_squares(const ferry::Tensor& input) {
  const auto* values = input.data<float>();
  double sum = 0;
  for (std::int64_t i = 0; i < input.numel(); ++i) sum += static_cast<double>(values[i]) * values[i];
  return sum;
}

void work(ferry::WorkerContext& context, ferry::Receiver<Job> jobs, ferry::Sender<Result> results, bool fail) {
  int done = 0;
  while (auto job = jobs.recv()) {
    if (fail && context.rank() == 1 && ++done == 3) {
      throw std::runtime_error("job " + std::to_string(job->id) + ": input rejected on purpose (--fail)");
    }
    results.send(Result{job->id, context.rank(), sum_of_squares(job->input)});
  }
}
FERRY_WORKER(work);

int run(int argc, char** argv) {
  const samples::Flags flags(argc, argv,
                             {{"--workers", "worker processes (default 4)"},
                              {"--jobs", "jobs to run (default 40)"},
                              {"--fail", "worker 1 fails on its third job!"},
                              {"--start", "worker start method: fork or spawn (default fork)"},
                              {"--transport", "pipe, unix_socket, ... (default unix_socket)"}},
                             "workers: a pool of worker processes taking jobs and returning results");
  const int n = static_cast<int>(flags.number("--workers", 4));
  const std::int64_t job_count = flags.number("--jobs", 40);
  const bool fail = flags.enabled("--fail");
  const ferry::Transport transport = flags.transport();
  ferry::SpawnOptions options;
  options.start_method = flags.start_method();
  options.termination_grace = std::chrono::seconds(2);

  constexpr std::int64_t kJobElements = 1 << 16;
  ferry::Tensor data = ferry::Tensor::empty({job_count, kJobElements}, ferry::DType::Float32, ferry::Device::SharedCpu);
  auto* values = data.data<float>();
  for (std::int64_t i = 0; i < data.numel(); ++i) values[i] = static_cast<float>(i % 7) * 0.5f;

  std::vector<ferry::Sender<Job>> job_senders;
  std::vector<ferry::Receiver<Job>> job_receivers;
  std::vector<ferry::Sender<Result>> result_senders;
  std::vector<ferry::Receiver<Result>> result_receivers;
  for (int i = 0; i < n; ++i) {
    auto [job_tx, job_rx] = ferry::channel<Job>(transport);
    auto [result_tx, result_rx] = ferry::channel<Result>(transport);
    job_senders.push_back(std::move(job_tx));
    job_receivers.push_back(std::move(job_rx));
    result_senders.push_back(std::move(result_tx));
    result_receivers.push_back(std::move(result_rx));
  }
  std::printf("worker pool: %d workers (start method %s, transport %s), %lld jobs%s\n", n,
              std::string(ferry::start_method_name(options.start_method)).c_str(),
              std::string(ferry::transport_name(transport)).c_str(), static_cast<long long>(job_count),
              fail ? ", worker 1 will fail" : "");
  auto workers = ferry::spawn(options, n, work, ferry::per_rank(std::move(job_receivers)),
                              ferry::per_rank(std::move(result_senders)), fail);

  std::deque<std::int64_t> queue;
  for (std::int64_t id = 0; id < job_count; ++id) queue.push_back(id);
  auto dispatch = [&](int rank) {
    if (queue.empty()) {
      job_senders[rank].close();  // no more work: the worker's recv() ends, and it returns
      return;
    }
    const std::int64_t id = queue.front();
    queue.pop_front();
    job_senders[rank].send(Job{id, data.select(0, id)});
  };

  ferry::Selector selector;
  for (auto& receiver : result_receivers) selector.add(receiver);
  for (int rank = 0; rank < n; ++rank) dispatch(rank);
  std::int64_t completed = 0;
  std::int64_t wrong = 0;
  try {
    while (!selector.empty()) {
      const auto rank = static_cast<int>(selector.wait());
      std::optional<Result> result = result_receivers[rank].recv();
      if (!result) {  // this worker finished, or failed while it still had a job
        selector.remove(static_cast<std::size_t>(rank));
        if (job_senders[rank].is_open()) break;  // join() says what happened to it
        continue;
      }
      const double expected = sum_of_squares(data.select(0, result->id));
      wrong += result->sum_of_squares == expected ? 0 : 1;
      std::printf("  job %3lld -> worker %d: sum of squares %.1f%s\n", static_cast<long long>(result->id), result->rank,
                  result->sum_of_squares, result->sum_of_squares == expected ? "" : "  (WRONG)");
      ++completed;
      dispatch(rank);
    }
  } catch (const ferry::ChannelClosed&) {
    // A worker vanished (PeerDied) or stopped reading its jobs: join() says why.
  }
  try {
    workers.join();
  } catch (const ferry::WorkerFailed& failure) {
    std::printf("\nerror: %s\n", failure.what());
    std::printf("       (%lld of %lld jobs completed before the failure)\n", static_cast<long long>(completed),
                static_cast<long long>(job_count));
    return 1;
  }
  std::printf("all %lld jobs done by %d workers%s\n", static_cast<long long>(completed), n,
              wrong == 0 ? "" : ", some results WRONG");
  return completed == job_count && wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return samples::main_of("workers", run, argc, argv); }
