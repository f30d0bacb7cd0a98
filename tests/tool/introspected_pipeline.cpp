// A three-process pipeline for the `ferry` tool's end-to-end tests. This process (the
// source) sends MESSAGES messages to a relay worker, which forwards each to a sink worker;
// the sink acknowledges on a third channel. Run with FERRY_INTROSPECT=1, every process
// serves its introspection socket.
//
//   introspected_pipeline MESSAGES [--stall]
//
// Once the sink has received all MESSAGES (with --stall: received MESSAGES and stopped
// reading, while the source keeps sending until the relay and it block for room), prints
// "ready SOURCE_PID RELAY_PID SINK_PID" and waits for its stdin to close; then it closes
// the pipeline and exits (with --stall it exits at once, its workers dying with it).
#include <unistd.h>

#include <cereal/types/vector.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.hpp"
#include "sample_main.hpp"  // samples/

namespace {

constexpr std::size_t payload_bytes = 200;

struct Message {
  std::int64_t sequence = 0;
  std::int32_t relay_pid = 0;
  std::vector<std::uint8_t> payload;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(sequence, relay_pid, payload);
  }
};

struct Ack {
  std::int64_t received = 0;
  std::int32_t relay_pid = 0;
  std::int32_t sink_pid = 0;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(received, relay_pid, sink_pid);
  }
};

void relay(ferry::WorkerContext&, ferry::Receiver<Message> in, ferry::Sender<Message> out) {
  while (auto message = in.recv()) {
    message->relay_pid = static_cast<std::int32_t>(::getpid());
    out.send(*message);
  }
  out.close();
}
FERRY_WORKER(relay);

// Receives `count` messages, acknowledges, then drains the rest (or, stalling, stops reading).
void sink(ferry::WorkerContext&, std::int64_t count, bool stall, ferry::Receiver<Message> in, ferry::Sender<Ack> acks) {
  Ack ack;
  ack.sink_pid = static_cast<std::int32_t>(::getpid());
  while (ack.received < count) {
    auto message = in.recv();
    if (!message) throw ferry::Error("the relay closed early");
    ack.relay_pid = message->relay_pid;
    ++ack.received;
  }
  acks.send(ack);
  if (stall) {
    for (;;) ::pause();  // dies with the source
  }
  while (in.recv()) {
  }
  acks.close();
}
FERRY_WORKER(sink);

// Blocks until stdin reaches its end.
void wait_for_stdin_to_close() {
  char buffer[256];
  while (::read(STDIN_FILENO, buffer, sizeof buffer) > 0) {
  }
}

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: introspected_pipeline MESSAGES [--stall]\n");
    return 2;
  }
  const std::int64_t count = std::atoll(argv[1]);
  const bool stall = argc > 2 && std::string(argv[2]) == "--stall";
  auto labelled = [](const char* name) {
    ferry::ChannelOptions options;
    options.name = name;
    return options;
  };
  auto [to_relay, relay_in] = ferry::channel<Message>(ferry::Transport::ShmRing, labelled("to relay"));
  auto [relay_out, sink_in] = ferry::channel<Message>(ferry::Transport::UnixSocket, labelled("to sink"));
  auto [ack_out, acks] = ferry::channel<Ack>(ferry::Transport::Pipe, labelled("acks"));
  auto relays = ferry::spawn(1, relay, std::move(relay_in), std::move(relay_out));
  auto sinks = ferry::spawn(1, sink, count, stall, std::move(sink_in), std::move(ack_out));
  Message message;
  message.payload.assign(payload_bytes, 7);
  std::thread endless;
  if (stall) {
    // Sends until the stalled sink makes everything upstream wait for room.
    endless = std::thread([&to_relay = to_relay, message]() mutable {
      for (std::int64_t i = 0;; ++i) {
        message.sequence = i;
        to_relay.send(message);
      }
    });
  } else {
    for (std::int64_t i = 0; i < count; ++i) {
      message.sequence = i;
      to_relay.send(message);
    }
  }
  auto ack = acks.recv();
  if (!ack || ack->received != count) throw ferry::Error("the sink did not acknowledge every message");
  std::printf("ready %d %d %d\n", static_cast<int>(::getpid()), ack->relay_pid, ack->sink_pid);
  std::fflush(stdout);
  wait_for_stdin_to_close();
  if (stall) std::_Exit(0);  // the sender thread is blocked for good; the workers die with us
  to_relay.close();
  while (acks.recv()) {
  }
  relays.join();
  sinks.join();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return samples::main_of("introspected_pipeline", run, argc, argv); }
