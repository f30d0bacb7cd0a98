// A pool of uneven workers fed a burst: four worker processes, one ten times slower (5 ms a
// job against 0.5 ms), take 400 jobs; the time is the makespan, from the first send until
// every job is done (each worker writes a byte per job finished to a pipe the producer reads).
//   fanout/uneven/distributor/shm_ring/default      Distributor, default FanoutOptions
//                                                   (each consumer's window follows its pace)
//   fanout/uneven/distributor/shm_ring/fixed_bound  the same with work_ahead 0: max_in_flight
//                                                   (128) alone, "fewest in flight"
//   fanout/uneven/raw_queue                         baseline: one pipe of 8-byte job ids shared
//                                                   by the workers, each takes a job when free
//                                                   (as torch.multiprocessing.Queue does)
// Counter slow_jobs: the jobs the slow worker did, per burst (its share by speed is about 13).
// Workers are started for each burst (not timed). Read the makespans as ratios to raw_queue.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ferry/detail/live_ends.hpp"
#include "ferry/detail/unique_fd.hpp"
#include "ferry/ferry.hpp"
#include "support/child_process.hpp"

namespace ferry::bench::uneven_pool {
namespace {

using namespace std::chrono_literals;

constexpr int kWorkers = 4;
constexpr std::uint64_t kJobs = 400;
constexpr std::uint64_t kStop = ~std::uint64_t{0};

std::chrono::microseconds work_of(int worker) { return worker == 0 ? 5000us : 500us; }

struct Pipe {
  detail::UniqueFd read;
  detail::UniqueFd write;
  Pipe() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    read = detail::UniqueFd(fds[0]);
    write = detail::UniqueFd(fds[1]);
  }
};

void write_all(int fd, const void* data, std::size_t size) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, bytes, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error("write failed");
    bytes += n;
    size -= static_cast<std::size_t>(n);
  }
}

// Reads the `kJobs` bytes the workers write as they finish jobs; returns the slow worker's.
std::uint64_t await_done(int fd) {
  std::uint64_t done = 0;
  std::uint64_t slow = 0;
  std::array<unsigned char, 512> bytes{};
  while (done < kJobs) {
    const ssize_t n = ::read(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error("a worker died");
    for (ssize_t i = 0; i < n; ++i) slow += bytes[static_cast<std::size_t>(i)] == 0 ? 1 : 0;
    done += static_cast<std::uint64_t>(n);
  }
  return slow;
}

void finished(int done_fd, int worker) {
  const auto byte = static_cast<unsigned char>(worker);
  write_all(done_fd, &byte, 1);
}

void distributor(benchmark::State& state, bool paced) {
  std::uint64_t slow_jobs = 0;
  for (auto _ : state) {
    Pipe done;
    std::vector<Sender<std::uint64_t>> ends;
    std::vector<std::unique_ptr<ChildProcess>> children;
    for (int w = 0; w < kWorkers; ++w) {
      auto [tx, rx] = channel<std::uint64_t>(Transport::ShmRing);
      children.push_back(std::make_unique<ChildProcess>(
          [&rx = rx, w, done_fd = done.write.get()] {
            const detail::LiveEnd* keep[] = {&detail::EndAccess::core(rx)};
            detail::abandon_live_ends_except(keep);
            while (rx.recv()) {
              std::this_thread::sleep_for(work_of(w));
              finished(done_fd, w);
            }
          },
          Placement::Anywhere, std::chrono::seconds(10)));
      rx.detach();
      ends.push_back(std::move(tx));
    }
    FanoutOptions options;
    if (!paced) options.work_ahead = {};
    Distributor<std::uint64_t> pool(options);
    for (auto& end : ends) pool.add(std::move(end));
    const auto start = std::chrono::steady_clock::now();
    for (std::uint64_t id = 0; id < kJobs; ++id) pool.send(id);
    slow_jobs += await_done(done.read.get());
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    pool.close();
    children.clear();
  }
  state.counters["slow_jobs"] =
      benchmark::Counter(static_cast<double>(slow_jobs) / static_cast<double>(state.iterations()));
}

void raw_queue(benchmark::State& state) {
  std::uint64_t slow_jobs = 0;
  for (auto _ : state) {
    Pipe done;
    Pipe jobs;
    std::vector<std::unique_ptr<ChildProcess>> children;
    for (int w = 0; w < kWorkers; ++w) {
      children.push_back(std::make_unique<ChildProcess>(
          [w, jobs_fd = jobs.read.get(), done_fd = done.write.get()] {
            while (true) {
              std::uint64_t id = 0;
              // Every write is one 8-byte id, so a read of 8 bytes takes one whole id.
              const ssize_t n = ::read(jobs_fd, &id, sizeof id);
              if (n < 0 && errno == EINTR) continue;
              if (n != sizeof id || id == kStop) return;
              std::this_thread::sleep_for(work_of(w));
              finished(done_fd, w);
            }
          },
          Placement::Anywhere, std::chrono::seconds(10)));
    }
    const auto start = std::chrono::steady_clock::now();
    for (std::uint64_t id = 0; id < kJobs; ++id) write_all(jobs.write.get(), &id, sizeof id);
    slow_jobs += await_done(done.read.get());
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    for (int w = 0; w < kWorkers; ++w) write_all(jobs.write.get(), &kStop, sizeof kStop);
    children.clear();
  }
  state.counters["slow_jobs"] =
      benchmark::Counter(static_cast<double>(slow_jobs) / static_cast<double>(state.iterations()));
}

[[maybe_unused]] const bool registered = [] {
  benchmark::RegisterBenchmark("fanout/uneven/distributor/shm_ring/default", distributor, true)
      ->UseManualTime()
      ->Iterations(5)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("fanout/uneven/distributor/shm_ring/fixed_bound", distributor, false)
      ->UseManualTime()
      ->Iterations(5)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("fanout/uneven/raw_queue", raw_queue)
      ->UseManualTime()
      ->Iterations(5)
      ->Unit(benchmark::kMillisecond);
  return true;
}();

}  // namespace
}  // namespace ferry::bench::uneven_pool
