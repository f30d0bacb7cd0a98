// Soak run: a long stream of messages with tensors from this process to a forked receiver,
// sampling both processes' RSS and open fds along the way. Passes (exit 0) when, after a
// warm-up, fds do not change at all and RSS grows by less than --rss-slack-mb.
//
// The stream is what a real producer sends: 1 message in `--new-every` brings a new shared
// tensor (fd passing or /proc open, mmap, later a released lease), 1 in 16 a heap tensor
// moved into shared memory, the others re-send one of 16 live tensors (a lease: no fd, no
// mmap). The producer writes the sequence number into a re-sent tensor before sending it,
// and the receiver checks that it reads at least that number through its mapping.
//
// Usage: ferry_soak [--messages N] [--transport pipe|unix_socket|shm_ring|all] [--new-every K]
//                   [--rss-slack-mb M] [--samples S]
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::int64_t messages = 1'000'000;
  std::vector<ferry::Transport> transports = {ferry::Transport::Pipe, ferry::Transport::UnixSocket,
                                              ferry::Transport::ShmRing};
  std::int64_t new_every = 8;
  double rss_slack_mb = 8;
  int samples = 20;
};

struct Message {
  std::int64_t sequence = 0;
  ferry::Tensor tensor;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(sequence, tensor);
  }
};

struct Sample {
  std::int64_t messages = 0;
  long sender_rss_kb = 0;
  long sender_fds = 0;
  long receiver_rss_kb = 0;
  long receiver_fds = 0;
  double rate = 0;
};

long rss_kb(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

long open_fds(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd";
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return -1;
  long count = 0;
  while (const dirent* entry = ::readdir(dir)) count += entry->d_name[0] != '.';
  ::closedir(dir);
  return pid == ::getpid() ? count - 1 : count;  // our own count includes the opendir fd
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "ferry_soak: %s\nusage: ferry_soak [--messages N] [--transport pipe|unix_socket|shm_ring|all] "
               "[--new-every K] [--rss-slack-mb M] [--samples S]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(("missing value for " + flag).c_str());
    const std::string value = argv[++i];
    if (flag == "--messages") {
      options.messages = std::stoll(value);
    } else if (flag == "--new-every") {
      options.new_every = std::max<std::int64_t>(1, std::stoll(value));
    } else if (flag == "--rss-slack-mb") {
      options.rss_slack_mb = std::stod(value);
    } else if (flag == "--samples") {
      options.samples = std::max(2, std::stoi(value));
    } else if (flag == "--transport") {
      if (value == "pipe")
        options.transports = {ferry::Transport::Pipe};
      else if (value == "unix_socket")
        options.transports = {ferry::Transport::UnixSocket};
      else if (value == "shm_ring")
        options.transports = {ferry::Transport::ShmRing};
      else if (value != "all")
        usage(("unknown transport " + value).c_str());
    } else {
      usage(("unknown option " + flag).c_str());
    }
  }
  if (options.messages < 16 * (options.samples + 1)) usage("--messages must be at least 16 x (--samples + 1)");
  return options;
}

// Messages around which the producer samples: it waits until the receiver has processed
// them, so that samples are taken at quiet points (see soak()).
bool is_sync_point(std::int64_t sequence, std::int64_t every) {
  return sequence > 0 && (sequence % every == 0 || (sequence + 1) % every == 0);
}

// The receiving process: checks order and what it reads through each mapping, and tells
// the producer when it has processed a sync point.
[[noreturn]] void receive_all(ferry::Receiver<Message>& rx, ferry::Sender<std::int64_t>& processed,
                              std::int64_t every) {
  int status = 0;
  try {
    std::int64_t expected = 0;
    while (auto message = rx.recv()) {
      if (message->sequence != expected++) throw ferry::Error("message out of order");
      if (message->tensor.defined() && message->tensor.data<std::int64_t>()[0] < message->sequence) {
        throw ferry::Error("a tensor reads an older value than the one written before its send");
      }
      if (is_sync_point(message->sequence, every)) processed.send(message->sequence);
    }
    processed.close();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "soak receiver: %s\n", error.what());
    status = 1;
  }
  std::fflush(nullptr);
  ::_exit(status);
}

bool soak(ferry::Transport transport, const Options& options) {
  const std::int64_t every = options.messages / (options.samples + 1);
  auto [tx, rx] = ferry::channel<Message>(transport);
  auto [processed_tx, processed_rx] = ferry::channel<std::int64_t>(transport);
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child < 0) throw ferry::SystemError("fork", errno);
  if (child == 0) {
    tx.detach();
    processed_rx.close();
    processed_tx.adopt();
    receive_all(rx, processed_tx, every);
  }
  rx.close();
  processed_tx.detach();
  auto wait_processed = [&processed_rx = processed_rx](std::int64_t sequence) {
    auto done = processed_rx.recv();
    if (!done || *done != sequence)
      throw ferry::Error("the receiver did not report message " + std::to_string(sequence));
  };

  std::printf(
      "\n%s: %lld messages, 1 in %lld with a new 4 KiB shared tensor, 1 in 16 a heap tensor, the rest "
      "re-sent from 16 live ones\n",
      std::string(ferry::transport_name(transport)).c_str(), static_cast<long long>(options.messages),
      static_cast<long long>(options.new_every));
  std::printf("%10s %15s %11s %17s %13s %10s\n", "messages", "sender_rss_kb", "sender_fds", "receiver_rss_kb",
              "receiver_fds", "msg/s");
  std::vector<ferry::Tensor> live;
  for (int i = 0; i < 16; ++i)
    live.push_back(ferry::Tensor::zeros({512}, ferry::DType::Int64, ferry::Device::SharedCpu));
  std::vector<Sample> samples;
  auto window_start = Clock::now();
  const auto start = window_start;
  for (std::int64_t i = 0; i < options.messages; ++i) {
    // Samples are taken at quiet points. The receiver reports when it has processed message
    // i-1 (so every frame before i is resolved and, over a pipe, acknowledged); message i
    // brings no new storage, and its send lets go of everything acknowledged and announces
    // the releases; once the receiver has processed it too, neither side holds anything
    // for frames in flight, and the counts are exact.
    const bool sample_now = i > 0 && i % every == 0;
    ferry::Tensor& slot = live[static_cast<std::size_t>(i % 16)];
    if (!sample_now && i % options.new_every == 0) {
      slot = ferry::Tensor::zeros({512}, ferry::DType::Int64, ferry::Device::SharedCpu);  // the old one dies
    } else if (!sample_now && i % 16 == 3) {
      slot = ferry::Tensor::zeros({512}, ferry::DType::Int64);  // heap: moved to shared memory by send
    }
    slot.data<std::int64_t>()[0] = i;
    if (sample_now) wait_processed(i - 1);
    tx.send(Message{i, slot});
    if (!sample_now) continue;
    wait_processed(i);
    const auto now = Clock::now();
    const double seconds = std::chrono::duration<double>(now - window_start).count();
    window_start = now;
    samples.push_back(Sample{i, rss_kb(::getpid()), open_fds(::getpid()), rss_kb(child), open_fds(child),
                             static_cast<double>(every) / seconds});
    const Sample& s = samples.back();
    std::printf("%10lld %15ld %11ld %17ld %13ld %10.0f\n", static_cast<long long>(s.messages), s.sender_rss_kb,
                s.sender_fds, s.receiver_rss_kb, s.receiver_fds, s.rate);
    std::fflush(stdout);
  }
  const double total_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  tx.close();
  while (processed_rx.recv()) {
  }  // reports of sync points past the last sample
  processed_rx.close();
  int status = 0;
  ::waitpid(child, &status, 0);
  const bool receiver_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;

  // Flat: from the sample after warm-up (10%) to the last one.
  const Sample& warm = samples[static_cast<std::size_t>(samples.size() / 10)];
  const Sample& last = samples.back();
  const long sender_growth = last.sender_rss_kb - warm.sender_rss_kb;
  const long receiver_growth = last.receiver_rss_kb - warm.receiver_rss_kb;
  const long slack_kb = static_cast<long>(options.rss_slack_mb * 1024);
  const bool fds_flat = last.sender_fds == warm.sender_fds && last.receiver_fds == warm.receiver_fds;
  const bool rss_flat = sender_growth < slack_kb && receiver_growth < slack_kb;
  std::printf(
      "%s: %.1f s, %.0f msg/s; after warm-up: RSS %+ld KiB (sender) %+ld KiB (receiver), fds %+ld / %+ld; "
      "receiver %s -> %s\n",
      std::string(ferry::transport_name(transport)).c_str(), total_seconds,
      static_cast<double>(options.messages) / total_seconds, sender_growth, receiver_growth,
      last.sender_fds - warm.sender_fds, last.receiver_fds - warm.receiver_fds, receiver_ok ? "ok" : "FAILED",
      fds_flat && rss_flat && receiver_ok ? "FLAT" : "NOT FLAT");
  return fds_flat && rss_flat && receiver_ok;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  bool all_flat = true;
  try {
    for (const ferry::Transport transport : options.transports) all_flat = soak(transport, options) && all_flat;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ferry_soak: %s\n", error.what());
    return 1;
  }
  return all_flat ? 0 : 1;
}
