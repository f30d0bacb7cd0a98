// Introspection on against off, timed in one process: blocks of messages alternate between
// the two (ferry::enable_introspection() / disable_introspection() between blocks, in the
// order off-on, on-off, ...), and each pair of neighbouring blocks gives one ratio on / off.
// A shared VM's drift moves both blocks of a pair alike, so the median of many pairs resolves
// what whole runs alternated cannot (bench/introspection_overhead.py --alternated judges it).
//
//   ferry_introspection_alternated ROW [PAIRS] [BLOCK_MS]
//
// ROW:
//   round-trip BYTES          a BYTES message to an echo thread and back over the ring, both
//                             ends spinning (BM_RingRoundTripBytes/bytes:BYTES/spinning:1,
//                             with the echo a thread of this process so that one switch
//                             turns both ends on or off)
//   one-thread TRANSPORT PAYLOAD
//                             a message sent and received in one thread, as ferry_hot_path's
//                             mode of that name (TRANSPORT ring, pipe, socket, in-process;
//                             PAYLOAD a size in bytes, or tensor: the same 4 KiB tensor)
// PAIRS (default 200, even) pairs of blocks of about BLOCK_MS (default 20) ms each: a block with
// introspection on includes its server thread's wake-ups (every 20 ms), one with it off has
// no such thread.
//
// Prints the medians of each side's ns per message, the median of the pairs' ratios and its
// 95% bootstrap interval, as one line. The interval is this process's alone: it leaves out
// what moves from one process to the next (its CPUs, its addresses), about 1% on a shared
// VM, which only several processes show.
//   ROW: off N ns, on N ns, on/off R [LOW, HIGH] over P pairs
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.hpp"
#include "support/tensor_message.hpp"
#include "support/transport_named.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<std::uint8_t>;
using ferry::bench::TensorMessage;

// One message moved (sent and received, or a round trip).
using Step = std::function<void()>;

constexpr std::chrono::milliseconds kSettle{2};  // after each switch, before the block
constexpr int kRewarm = 100;                     // steps after the pause, untimed

// The median (of an even count, the mean of the two middle values).
double median(std::vector<double> values) {
  const auto upper = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), upper, values.end());
  if (values.size() % 2 != 0) return *upper;
  return (*std::max_element(values.begin(), upper) + *upper) / 2;
}

// ns per step over `steps` steps, with introspection on or off. The switch starts or stops
// the server's thread; the pause after it lets a new thread settle (its socket, its first
// tick) outside the block, as in a program that turned introspection on once, and is taken
// on both sides alike.
double timed_block(const Step& step, std::int64_t steps, bool on) {
  if (on) {
    ferry::enable_introspection();
  } else {
    ferry::disable_introspection();
  }
  std::this_thread::sleep_for(kSettle);
  for (int i = 0; i < kRewarm; ++i) step();
  const Clock::time_point start = Clock::now();
  for (std::int64_t i = 0; i < steps; ++i) step();
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / static_cast<double>(steps);
}

struct Interval {
  double low = 0;
  double high = 0;
};

// The 95% bootstrap interval of the median of `ratios` (a fixed seed: the same data gives
// the same interval).
Interval bootstrap_median(const std::vector<double>& ratios) {
  constexpr int kResamples = 2000;
  std::mt19937_64 random(12345);
  std::uniform_int_distribution<std::size_t> pick(0, ratios.size() - 1);
  std::vector<double> medians;
  medians.reserve(kResamples);
  std::vector<double> sample(ratios.size());
  for (int r = 0; r < kResamples; ++r) {
    for (double& value : sample) value = ratios[pick(random)];
    medians.push_back(median(sample));
  }
  std::sort(medians.begin(), medians.end());
  return {medians[kResamples * 25 / 1000], medians[kResamples * 975 / 1000]};
}

void alternate(const std::string& row, const Step& step, int pairs, double block_ms) {
  // Warm up, then calibrate with introspection off: steps per block of about block_ms.
  (void)timed_block(step, 20000, false);
  const double warm_ns = timed_block(step, 20000, false);
  const auto steps = std::max<std::int64_t>(100, static_cast<std::int64_t>(block_ms * 1e6 / warm_ns));
  std::vector<double> off;
  std::vector<double> on;
  std::vector<double> ratios;
  for (int pair = 0; pair < pairs; ++pair) {
    const bool on_first = pair % 2 == 1;  // off-on, on-off, ...: neither side always goes first
    const double first = timed_block(step, steps, on_first);
    const double second = timed_block(step, steps, !on_first);
    off.push_back(on_first ? second : first);
    on.push_back(on_first ? first : second);
    ratios.push_back(on.back() / off.back());
  }
  ferry::disable_introspection();
  const Interval interval = bootstrap_median(ratios);
  std::printf("%s: off %.1f ns, on %.1f ns, on/off %.4f [%.4f, %.4f] over %d pairs of %lld messages\n", row.c_str(),
              median(off), median(on), median(ratios), interval.low, interval.high, pairs,
              static_cast<long long>(steps));
}

// A positive whole number written as such ("5x", "0", "-3" are not), or invalid_argument.
long long positive_number(const std::string& text, const std::string& what) {
  const long long number = std::atoll(text.c_str());
  if (number <= 0 || std::to_string(number) != text)
    throw std::invalid_argument(what + " must be a positive number, not " + text);
  return number;
}

std::size_t bytes_named(const std::string& text) { return static_cast<std::size_t>(positive_number(text, "BYTES")); }

// BM_RingRoundTripBytes/bytes:BYTES/spinning:1, with the echo a thread of this process.
void round_trip(std::size_t bytes, int pairs, double block_ms) {
  ferry::ChannelOptions options;
  options.ring_spin = std::chrono::seconds(1);
  options.ring_capacity = std::max(options.ring_capacity, 4 * bytes);
  auto [to_echo, echo_in] = ferry::channel<Bytes>(ferry::Transport::ShmRing, options);
  auto [echo_out, from_echo] = ferry::channel<Bytes>(ferry::Transport::ShmRing, options);
  std::thread echo([&echo_in = echo_in, &echo_out = echo_out] {
    while (auto message = echo_in.recv()) echo_out.send(*message);
    echo_out.close();
  });
  const Bytes message(bytes, 7);
  const Step step = [&to_echo = to_echo, &from_echo = from_echo, &message] {
    to_echo.send(message);
    if (!from_echo.recv()) std::abort();
  };
  alternate("round-trip " + std::to_string(bytes), step, pairs, block_ms);
  to_echo.close();
  while (from_echo.recv()) {
  }
  echo.join();
}

template <class Message>
void one_thread_of(const std::string& row, ferry::Transport transport, const ferry::ChannelOptions& options,
                   const Message& message, int pairs, double block_ms) {
  auto [tx, rx] = ferry::channel<Message>(transport, options);
  const Step step = [&tx = tx, &rx = rx, &message] {
    tx.send(message);
    if (!rx.recv()) std::abort();
  };
  alternate(row, step, pairs, block_ms);
}

// ferry_hot_path's one-thread mode (the sends and receives of BM_RingSendRecvOneThread and
// the latency table's other rows, without their waits).
void one_thread(const std::string& transport_name, const std::string& payload, int pairs, double block_ms) {
  const ferry::Transport transport = ferry::bench::transport_named(transport_name);
  ferry::ChannelOptions options;
  options.ring_spin = std::chrono::nanoseconds::zero();
  const std::string row = "one-thread " + transport_name + " " + payload;
  if (payload == "tensor") {
    const TensorMessage same{ferry::Tensor::empty({4096}, ferry::DType::UInt8, ferry::Device::SharedCpu)};
    one_thread_of(row, transport, options, same, pairs, block_ms);
    return;
  }
  const std::size_t bytes = bytes_named(payload);
  const bool kernel_buffered = transport == ferry::Transport::Pipe || transport == ferry::Transport::UnixSocket;
  if (kernel_buffered && bytes > (64u << 10)) {
    throw std::invalid_argument(
        "at most 64 KiB over a pipe or a socket: it holds no more for a thread that has not read");
  }
  options.ring_capacity = std::max(options.ring_capacity, 4 * bytes);
  one_thread_of(row, transport, options, Bytes(bytes, 7), pairs, block_ms);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = std::string("usage: ") + argv[0] +
                            " round-trip BYTES | one-thread ring|pipe|socket|in-process BYTES|tensor"
                            " [PAIRS] [BLOCK_MS]\n";
  const std::string row = argc > 1 ? argv[1] : "";
  const int arguments = row == "round-trip" ? 3 : row == "one-thread" ? 4 : 0;
  if (arguments == 0 || argc < arguments || argc > arguments + 2) {
    std::fputs(usage.c_str(), stderr);
    return 2;
  }
  try {
    const long long pairs = argc > arguments ? positive_number(argv[arguments], "PAIRS") : 200;
    // Even: as many pairs off-first as on-first.
    if (pairs < 2 || pairs % 2 != 0 || pairs > 1'000'000) throw std::invalid_argument("PAIRS must be even, from 2");
    const char* block_text = argc > arguments + 1 ? argv[arguments + 1] : "20";
    char* block_end = nullptr;
    const double block_ms = std::strtod(block_text, &block_end);
    if (*block_end != '\0' || !std::isfinite(block_ms) || block_ms <= 0 || block_ms > 10'000) {
      throw std::invalid_argument("BLOCK_MS must be a number of milliseconds above 0, at most 10000");
    }
    if (row == "round-trip") {
      round_trip(bytes_named(argv[2]), static_cast<int>(pairs), block_ms);
    } else {
      one_thread(argv[2], argv[3], static_cast<int>(pairs), block_ms);
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ferry_introspection_alternated: %s\n", error.what());
    return 1;
  }
  return 0;
}
