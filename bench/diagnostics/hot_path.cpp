// Diagnostics (not a benchmark): the hot paths of ferry_bench's ring rows, run a fixed number
// of times so that callgrind can count their instructions per message (what noise on a
// shared machine does not move). Run under callgrind, instrumentation off until the measured
// loop starts:
//
//   valgrind --tool=callgrind --instr-atstart=no --trace-children=yes
//       --callgrind-out-file=/tmp/hot.%p build/release/bench/ferry_hot_path MODE [N] [MESSAGES]
//   (one command line)
//   callgrind_annotate /tmp/hot.<pid>     # one file per process: the sender's and the receiver's
//
// Modes (the ring with both ends sleeping at once, so that no spinning is counted):
//   ring64             a 64-byte message sent and received in one thread (BM_RingSendRecvOneThread)
//   ring-frame         the ring alone: the frame of such a message (a header and a 72-byte body)
//                      written and read in place in one thread, no channel (BM_RingFrameRoundTrip)
//   ping               an empty message to a forked receiver and its reply (AllocPingPong/transport:2)
//   tensors N          N new 4 KiB tensors per message, round trip (AllocSmallTensors/transport:2/tensors:N)
//   views N            N views of one new storage per message (AllocSmallTensorsOneStorage/transport:2)
//   send-plain         an 8-byte message sent and received in one thread (fanout/send/plain/shm_ring)
//   send-distributor   the same through a Distributor with that one consumer (fanout/send/distributor)
//   one-thread TRANSPORT PAYLOAD
//                      a message sent and received in one thread over TRANSPORT (in-process,
//                      pipe, socket, ring), PAYLOAD a byte message of that many bytes (a pipe
//                      or a socket holds 64 KiB), tensor (the same 4 KiB shared tensor each
//                      time) or tensor-new (a new one each time): the sends and receives of the
//                      latency table's rows
//                      without their waits; a pipe's or a socket's system calls are counted
//                      up to the kernel (what introspection's cost is compared with,
//                      bench/introspection_overhead.py --instructions)
//   clock              prints the time of one steady_clock reading (median of 9 runs of 100,000),
//                      what a blocking wait pays twice with introspection on
// Each process prints its instruction count per message when run under callgrind's
// CALLGRIND_* client requests (valgrind/callgrind.h); without callgrind the program just runs.
#include <sys/prctl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ferry/detail/frame.hpp"
#include "ferry/detail/transport.hpp"
#include "ferry/ferry.hpp"
#include "support/child_process.hpp"
#include "support/tensor_message.hpp"
#include "support/transport_named.hpp"

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define FERRY_MEASURE_START() CALLGRIND_START_INSTRUMENTATION
#define FERRY_MEASURE_STOP()        \
  do {                              \
    CALLGRIND_STOP_INSTRUMENTATION; \
    CALLGRIND_DUMP_STATS;           \
  } while (false)
#else
#define FERRY_MEASURE_START() ((void)0)
#define FERRY_MEASURE_STOP() ((void)0)
#endif

namespace {

using ferry::Tensor;

constexpr int kWarmup = 20;
constexpr std::int64_t kSmallElements = 1024;  // 4 KiB of float32

struct Message {
  std::vector<Tensor> tensors;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(tensors);
  }
};

ferry::ChannelOptions sleeping() {
  ferry::ChannelOptions options;
  options.ring_spin = std::chrono::nanoseconds::zero();
  return options;
}

Message make(const std::string& mode, std::int64_t count, int step) {
  Message message;
  if (mode == "tensors") {
    message.tensors.reserve(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i) {
      message.tensors.push_back(Tensor::empty({kSmallElements}, ferry::DType::Float32, ferry::Device::SharedCpu));
    }
  } else if (mode == "views") {
    message.tensors = Tensor::empty({count, kSmallElements}, ferry::DType::Float32, ferry::Device::SharedCpu).unbind();
  }
  for (Tensor& tensor : message.tensors) *tensor.data<float>() = static_cast<float>(step);
  return message;
}

void one_thread(int messages) {
  const std::vector<std::uint8_t> bytes(64, 7);
  auto [tx, rx] = ferry::channel<std::vector<std::uint8_t>>(ferry::Transport::ShmRing, sleeping());
  for (int i = 0; i < kWarmup; ++i) {
    tx.send(bytes);
    (void)rx.recv();
  }
  FERRY_MEASURE_START();
  for (int i = 0; i < messages; ++i) {
    tx.send(bytes);
    auto back = rx.recv();
    if (!back || back->size() != 64) std::abort();
  }
  FERRY_MEASURE_STOP();
}

// `make()` gives each message (a reference to the same one, or a new one); the receiver's
// copy is dropped at once.
template <class Message, class Make>
void sent_and_received(ferry::Transport transport, const ferry::ChannelOptions& options, Make make, int messages) {
  auto [tx, rx] = ferry::channel<Message>(transport, options);
  for (int i = 0; i < kWarmup; ++i) {
    tx.send(make());
    (void)rx.recv();
  }
  FERRY_MEASURE_START();
  for (int i = 0; i < messages; ++i) {
    tx.send(make());
    if (!rx.recv()) std::abort();
  }
  FERRY_MEASURE_STOP();
}

// The largest byte message a pipe or a socket holds while its one thread has not read it.
constexpr long long kMostBufferedBytes = 64 << 10;

// One message at a time over `transport`, sent and received in one thread: `payload`
// bytes, the same 4 KiB shared tensor each time (tensor), or a new one (tensor-new).
void one_thread_over(const std::string& transport_name, const std::string& payload, int messages) {
  const ferry::Transport transport = ferry::bench::transport_named(transport_name);
  ferry::ChannelOptions options = sleeping();
  using ferry::bench::TensorMessage;
  if (payload == "tensor") {
    const TensorMessage same{Tensor::empty({4096}, ferry::DType::UInt8, ferry::Device::SharedCpu)};
    sent_and_received<TensorMessage>(
        transport, options, [&]() -> const TensorMessage& { return same; }, messages);
    return;
  }
  if (payload == "tensor-new") {
    sent_and_received<TensorMessage>(
        transport, options,
        [] { return TensorMessage{Tensor::empty({4096}, ferry::DType::UInt8, ferry::Device::SharedCpu)}; }, messages);
    return;
  }
  const long long bytes = std::atoll(payload.c_str());
  if (bytes <= 0 || std::to_string(bytes) != payload) {
    throw std::invalid_argument("unknown payload " + payload + " (a size in bytes, tensor or tensor-new)");
  }
  if (transport == ferry::Transport::ShmRing) {
    options.ring_capacity = std::max(options.ring_capacity, 4 * static_cast<std::size_t>(bytes));
  } else if (transport != ferry::Transport::InProcess && bytes > kMostBufferedBytes) {
    throw std::invalid_argument("a pipe or a socket holds at most " + std::to_string(kMostBufferedBytes) +
                                " bytes for a thread that has not read them yet");
  }
  const std::vector<std::uint8_t> message(static_cast<std::size_t>(bytes), 7);
  sent_and_received<std::vector<std::uint8_t>>(
      transport, options, [&]() -> const std::vector<std::uint8_t>& { return message; }, messages);
}

// The time of one steady_clock reading, in ns: the median of 9 runs of 100,000 readings.
double clock_read_ns() {
  using Clock = std::chrono::steady_clock;
  constexpr int kReads = 100'000;
  std::vector<double> runs;
  for (int run = 0; run < 9; ++run) {
    const Clock::time_point start = Clock::now();
    Clock::time_point last = start;
    for (int i = 0; i < kReads; ++i) last = Clock::now();
    runs.push_back(std::chrono::duration<double, std::nano>(last - start).count() / kReads);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

// The frame of a 64-byte message (a header and a 72-byte body) written with a ring's writer
// and read in place with its reader, what a channel adds left out (as BM_RingFrameRoundTrip).
void ring_frames(int messages) {
  ferry::RingTiming timing;
  timing.spin = std::chrono::nanoseconds::zero();
  // Named ends, not a structured binding: clang 14 cannot capture a binding in a lambda.
  auto ends = ferry::detail::make_transport(ferry::Transport::ShmRing, ferry::FrameLimits{},
                                            ferry::ChannelOptions{}.ring_capacity, timing);
  auto& writer = ends.first;
  auto& reader = ends.second;
  ferry::detail::FrameHeader header;
  std::array<std::byte, 72> body{};
  header.body_bytes = body.size();
  const std::array<iovec, 2> parts{iovec{&header, sizeof header}, iovec{body.data(), body.size()}};
  std::vector<std::byte> buffer;
  std::deque<ferry::detail::UniqueFd> fds;
  const auto round = [&] {
    writer->write(parts, {}, ferry::detail::Deadline::never());
    ferry::detail::FrameHeader read_header;
    std::span<const std::byte> payload;
    if (reader->read_view(read_header, payload, buffer, fds, ferry::detail::Deadline::never()) !=
        ferry::ReadStatus::Frame) {
      std::abort();
    }
    std::memcpy(body.data(), payload.data(), std::min(payload.size(), body.size()));
    reader->release();
  };
  for (int i = 0; i < kWarmup; ++i) round();
  FERRY_MEASURE_START();
  for (int i = 0; i < messages; ++i) round();
  FERRY_MEASURE_STOP();
}

// An 8-byte message sent (through a Distributor of one consumer, or not) and received in one thread.
void one_thread_sends(bool distributed, int messages) {
  auto [tx, rx] = ferry::channel<std::uint64_t>(ferry::Transport::ShmRing, sleeping());
  ferry::Distributor<std::uint64_t> pool;
  if (distributed) pool.add(std::move(tx));
  const auto send = [&, &tx = tx](std::uint64_t value) { distributed ? pool.send(value) : tx.send(value); };
  std::uint64_t value = 0;
  for (; value < kWarmup; ++value) {
    send(value);
    (void)rx.recv();
  }
  FERRY_MEASURE_START();
  for (int i = 0; i < messages; ++i, ++value) {
    send(value);
    if (rx.recv() != value) std::abort();
  }
  FERRY_MEASURE_STOP();
}

void round_trips(const std::string& mode, std::int64_t count, int messages) {
  auto [tx, rx] = ferry::channel<Message>(ferry::Transport::ShmRing, sleeping());
  auto [reply_tx, reply_rx] = ferry::channel<std::int64_t>(ferry::Transport::ShmRing, sleeping());
  {
    ferry::bench::ChildProcess child(
        [&tx = tx, &rx = rx, &reply_tx = reply_tx, &reply_rx = reply_rx] {
          ::prctl(PR_SET_NAME, "hot-receiver");
          tx.detach();
          reply_rx.close();
          reply_tx.adopt();
          int received = 0;
          while (auto message = rx.recv()) {
            std::int64_t sum = 0;
            for (const Tensor& tensor : message->tensors) sum += *static_cast<const unsigned char*>(tensor.data_ptr());
            message.reset();
            reply_tx.send(sum);
            if (++received == kWarmup) FERRY_MEASURE_START();
          }
          FERRY_MEASURE_STOP();
          reply_tx.close();
        },
        ferry::bench::Placement::Anywhere, std::chrono::seconds(600));
    rx.close();
    reply_tx.detach();
    int step = 0;
    for (; step < kWarmup; ++step) {
      tx.send(make(mode, count, step));
      (void)reply_rx.recv();
    }
    FERRY_MEASURE_START();
    for (int i = 0; i < messages; ++i, ++step) {
      tx.send(make(mode, count, step));
      if (!reply_rx.recv()) std::abort();
    }
    FERRY_MEASURE_STOP();
    tx.close();
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s ring64|ring-frame|ping|send-plain|send-distributor|tensors N|views N"
                 "|one-thread TRANSPORT PAYLOAD|clock [MESSAGES]\n",
                 argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const bool counted = mode == "tensors" || mode == "views";
  const std::int64_t count = counted && argc > 2 ? std::atoll(argv[2]) : 0;
  const bool over = mode == "one-thread";
  if (over && argc < 4) {
    std::fprintf(stderr, "usage: %s one-thread in-process|pipe|socket|ring BYTES|tensor|tensor-new [MESSAGES]\n",
                 argv[0]);
    return 2;
  }
  const int messages_at = over ? 4 : counted ? 3 : 2;
  const int messages = argc > messages_at ? std::atoi(argv[messages_at]) : 1000;
  if (messages <= 0) {
    std::fprintf(stderr, "MESSAGES must be a positive number (got %s)\n", argv[messages_at]);
    return 2;
  }
  try {
    if (mode == "ring64") {
      one_thread(messages);
    } else if (mode == "ring-frame") {
      ring_frames(messages);
    } else if (mode == "send-plain" || mode == "send-distributor") {
      one_thread_sends(mode == "send-distributor", messages);
    } else if (mode == "clock") {
      std::printf("clock: %.1f ns per steady_clock reading\n", clock_read_ns());
      return 0;
    } else if (over) {
      one_thread_over(argv[2], argv[3], messages);
    } else if (mode == "ping" || counted) {
      round_trips(mode, count, messages);
    } else {
      std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
      return 2;
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ferry_hot_path: %s\n", error.what());
    return 1;
  }
  std::printf("%s: %d messages\n", mode.c_str(), messages);
  return 0;
}
