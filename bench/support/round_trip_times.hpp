// The median single round trip of a ping-pong benchmark, reported as the counter rtt_p50_ns
// (or the median of any other timed step, under a counter name of its own).
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace ferry::bench {

/// Times one round trip in every `period` (two clock reads each) and reports their median
/// as the counter rtt_p50_ns. The median is robust to the rare long stalls (a peer
/// preempted for milliseconds) that dominate the mean time per iteration on a machine
/// shared with other work; Google Benchmark's own figure stays that mean. Rows that run
/// few iterations (tens) time every one (period 1). Use: `const auto sample =
/// times.sample();` first thing in the loop body, and `times.report(state)` after the loop.
/// `counter` names the reported median (a step of the round trip, such as the send alone,
/// is timed the same way: `{ const auto sample = send_times.sample(); send(...); }`).
class RoundTripTimes {
 public:
  explicit RoundTripTimes(const benchmark::State& state, std::uint64_t period = 16, const char* counter = "rtt_p50_ns")
      : period_(period), counter_(counter) {
    times_.reserve(static_cast<std::size_t>(state.max_iterations / static_cast<std::int64_t>(period) + 1));
  }
  class Sample {
   public:
    explicit Sample(RoundTripTimes* owner)
        : owner_(owner), start_(owner ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point()) {}
    ~Sample() {
      if (owner_) owner_->times_.push_back(static_cast<double>((std::chrono::steady_clock::now() - start_).count()));
    }
    Sample(const Sample&) = delete;
    Sample& operator=(const Sample&) = delete;

   private:
    RoundTripTimes* owner_;
    std::chrono::steady_clock::time_point start_;
  };
  Sample sample() { return Sample(++count_ % period_ == 0 ? this : nullptr); }
  void report(benchmark::State& state) {
    if (times_.empty()) return;
    const auto middle = times_.begin() + static_cast<std::ptrdiff_t>(times_.size() / 2);
    std::nth_element(times_.begin(), middle, times_.end());
    state.counters[counter_] = *middle;
  }

 private:
  std::uint64_t period_;
  const char* counter_;
  std::vector<double> times_;
  std::uint64_t count_ = 0;
};

}  // namespace ferry::bench
