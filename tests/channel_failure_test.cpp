// Peers that die: SIGKILL on either side of a channel, over every transport. The survivor
// must see a closed channel (never a hang, never SIGPIPE), and nothing may leak.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "ferry/detail/frame_channel.hpp"
#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/transports.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::fork_child;
using test::wait_child;

struct IndexedTensor {
  std::int64_t index = 0;
  Tensor data;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(index, data);
  }
};

class PeerDeathTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {};

INSTANTIATE_TEST_SUITE_P(Transports, PeerDeathTest, ::testing::ValuesIn(test::interprocess_transports()),
                         test::transport_test_name);

TEST_P(PeerDeathTest, SenderKilledMidStreamIsPeerDiedForTheReceiver) {
  auto [tx, rx] = channel<IndexedTensor>(GetParam());
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    rx.close();
    tx.adopt();
    Tensor shared = Tensor::zeros({4096}, DType::Float32, Device::SharedCpu);
    for (std::int64_t i = 0;; ++i) {
      tx.send(IndexedTensor{i, i % 3 == 0 ? Tensor::zeros({256}, DType::UInt8, Device::SharedCpu) : shared});
    }
  });
  tx.detach();
  std::int64_t received = 0;
  for (; received < 200; ++received) ASSERT_TRUE(rx.recv().has_value());
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  const auto start = std::chrono::steady_clock::now();
  try {
    while (rx.recv()) ++received;
    FAIL() << "a killed sender must not look like a clean end of stream";
  } catch (const PeerDied& error) {
    EXPECT_NE(std::string(error.what()).find("died"), std::string::npos) << error.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_THROW(rx.recv(), PeerDied);  // stays dead
  EXPECT_EQ(wait_child(child).signal, SIGKILL);
  rx.close();
}

TEST_P(PeerDeathTest, ReceiverKilledMakesABlockedSenderFail) {
  auto [tx, rx] = channel<std::vector<std::uint8_t>>(GetParam());
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    tx.detach();
    for (int i = 0; i < 3; ++i) CHILD_CHECK(rx.recv().has_value());
    ::pause();  // stop reading: the sender fills the transport and blocks
  });
  rx.close();
  const std::vector<std::uint8_t> chunk(64 * 1024, 7);
  std::thread killer([child] {
    std::this_thread::sleep_for(200ms);
    ::kill(child, SIGKILL);
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(
      {
        while (true) tx.send(chunk);
      },
      ChannelClosed);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  killer.join();
  EXPECT_EQ(wait_child(child).signal, SIGKILL);
  EXPECT_FALSE(tx.is_open());
}

TEST_P(PeerDeathTest, SenderToABrokenReceiverFailsInsteadOfBlocking) {
  // The receiver refuses a frame above its limits and is broken for good, but its process
  // lives on (it handles the error and does other work). Nobody will ever read the rest
  // of the stream: a sender that fills the transport must get ChannelClosed, not block.
  // The ends are built with different limits: channel() gives both the same, and a Sender
  // refuses what its own limits forbid before sending it.
  ChannelOptions options;
  options.ring_capacity = 4096;
  options.peer_check_interval = 20ms;
  ChannelOptions strict = options;
  strict.limits.max_body_bytes = 1024;
  auto [writer, reader] =
      detail::make_transport(GetParam(), strict.limits, options.ring_capacity, options.ring_timing());
  auto tx = detail::sender_over<std::vector<std::uint8_t>>(std::move(writer), GetParam(), options);
  auto rx = detail::receiver_over<std::vector<std::uint8_t>>(std::move(reader), GetParam(), strict);
  auto [done_tx, done_rx] = channel<int>(Transport::Pipe);
  const pid_t child = fork_child([&tx = tx, &rx = rx, &done_tx = done_tx, &done_rx = done_rx] {
    tx.detach();
    done_tx.detach();
    try {
      (void)rx.recv();
      CHILD_CHECK(!"a frame above the receiver's limits was accepted");
    } catch (const ProtocolError&) {
      // What the receiver must see; it keeps the broken Receiver and stays alive.
    }
    CHILD_CHECK(done_rx.recv_for(20s).has_value());
    bool still_broken = false;
    try {
      (void)rx.recv();
    } catch (const ProtocolError&) {
      still_broken = true;
    }
    CHILD_CHECK(still_broken);
  });
  rx.close();
  done_rx.close();
  const std::vector<std::uint8_t> chunk(64 * 1024, 7);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(
      {
        for (int i = 0; i < 64; ++i) tx.send(chunk);  // 4 MiB: more than any transport buffers
      },
      ChannelClosed);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  done_tx.send(1);
  EXPECT_TRUE(test::child_succeeded(child));
  EXPECT_FALSE(tx.is_open());
  done_tx.close();
}

TEST_P(PeerDeathTest, CloseOfAFullChannelWhoseReceiverStoppedReadingIsBounded) {
  // The receiver lives but does not read (in a real program: blocked on a send to the
  // sender's process). close() must give up writing the end of the stream after
  // close_linger instead of waiting for room for ever; the receiver, once it reads again,
  // gets the values and then PeerDied (the end was dropped, not closed).
  ChannelOptions options;
  options.ring_capacity = 4096;
  options.peer_check_interval = 20ms;
  options.close_linger = 200ms;
  auto [tx, rx] = channel<int>(GetParam(), options);
  auto [go_tx, go_rx] = channel<int>(Transport::Pipe);
  const pid_t child = fork_child([&tx = tx, &rx = rx, &go_tx = go_tx, &go_rx = go_rx] {
    tx.detach();
    go_tx.detach();
    auto sent = go_rx.recv_for(20s);  // only now start reading
    CHILD_CHECK(sent.has_value());
    int received = 0;
    bool died = false;
    try {
      while (auto value = rx.recv()) {
        CHILD_CHECK(*value == received);
        ++received;
      }
    } catch (const PeerDied& error) {
      died = true;
      // The sender is alive: the message must not only blame a death.
      CHILD_CHECK(std::string(error.what()).find("close_linger") != std::string::npos);
    }
    CHILD_CHECK(died);
    // A value whose send() returned may still be cut off: the transport took its first
    // bytes, and close() gave up on the rest together with the end of the stream.
    CHILD_CHECK(received == *sent || received == *sent - 1);
  });
  rx.close();
  go_rx.close();
  int sent = 0;
  while (tx.send_for(sent, 20ms)) ++sent;  // full: the receiver does not read
  const auto start = std::chrono::steady_clock::now();
  tx.close();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "close() waited for a receiver that does not read";
  EXPECT_FALSE(tx.is_open());
  go_tx.send(sent);
  EXPECT_TRUE(test::child_succeeded(child));
  go_tx.close();
}

TEST_P(PeerDeathTest, ReceiverKilledWhileHoldingTensorsLeaksNothing) {
  auto [tx, rx] = channel<IndexedTensor>(GetParam());
  auto [ready_tx, ready_rx] = channel<int>(GetParam());
  const pid_t child = fork_child([&, &rx = rx, &tx = tx, &ready_tx = ready_tx, &ready_rx = ready_rx] {
    tx.detach();
    ready_rx.close();
    ready_tx.adopt();
    std::vector<IndexedTensor> held;
    for (int i = 0; i < 20; ++i) held.push_back(rx.recv().value());
    ready_tx.send(1);
    ::pause();
  });
  rx.close();
  ready_tx.detach();
  {
    std::vector<Tensor> tensors;
    for (int i = 0; i < 20; ++i) {
      tensors.push_back(Tensor::zeros({1 << 16}, DType::Float32, Device::SharedCpu));
      tx.send(IndexedTensor{i, tensors.back()});
    }
    ASSERT_EQ(ready_rx.recv().value(), 1);
  }
  ::kill(child, SIGKILL);
  EXPECT_EQ(wait_child(child).signal, SIGKILL);
  // Sockets and pipes fail the next send; the ring notices within its peer-check interval
  // (or once it is full): either way within a bounded time.
  const auto give_up = std::chrono::steady_clock::now() + 5s;
  EXPECT_THROW(
      {
        while (std::chrono::steady_clock::now() < give_up) tx.send(IndexedTensor{0, Tensor()});
      },
      ChannelClosed);
  EXPECT_THROW(ready_rx.recv(), PeerDied);
  tx.close();
  ready_rx.close();
  // The fixture checks that every fd this process opened is closed again.
}

TEST_P(PeerDeathTest, SenderKilledAfterSendingKeepsReceivedTensorsValid) {
  auto [tx, rx] = channel<IndexedTensor>(GetParam());
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    rx.close();
    tx.adopt();
    Tensor t = Tensor::zeros({1024}, DType::Int32, Device::SharedCpu);
    t.at<std::int32_t>({1023}) = 99;
    tx.send(IndexedTensor{1, t});
    ::pause();
  });
  tx.detach();
  IndexedTensor got = rx.recv().value();
  ::kill(child, SIGKILL);
  EXPECT_EQ(wait_child(child).signal, SIGKILL);
  // Our mapping keeps the memory alive after the sender's death.
  EXPECT_EQ(got.data.at<std::int32_t>({1023}), 99);
  got.data.at<std::int32_t>({0}) = 5;
  EXPECT_THROW(rx.recv(), PeerDied);
}

TEST_P(PeerDeathTest, SenderDestroyedByAnExceptionIsNotACleanEndOfStream) {
  auto [tx, rx] = channel<int>(GetParam());
  try {
    Sender<int> sender = std::move(tx);
    sender.send(1);
    throw std::runtime_error("stage failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(rx.recv().value(), 1);
  EXPECT_THROW(rx.recv(), PeerDied);
}

// The same in another process that lives on after the failure, with a tensor in the frame
// (pinned: the sender's ledger keeps a liveness probe of the transport): the probe must not
// keep the stream open, or the receiver waits for ever instead of seeing PeerDied. The
// storage reaches the receiver once before the failure, so that the failing frame names it
// by lease (a segment named by fd number dies with the dropped sender over a pipe or ring).
TEST_P(PeerDeathTest, SenderWithPinnedTensorsDroppedByAnExceptionIsPeerDiedWhileItsProcessLives) {
  auto [tx, rx] = channel<IndexedTensor>(GetParam());
  auto [ack_tx, ack_rx] = channel<int>(Transport::Pipe);
  auto [done_tx, done_rx] = channel<int>(Transport::Pipe);
  const pid_t child =
      fork_child([&, &rx = rx, &tx = tx, &ack_tx = ack_tx, &ack_rx = ack_rx, &done_tx = done_tx, &done_rx = done_rx] {
        rx.close();
        ack_tx.detach();
        done_tx.detach();
        tx.adopt();
        const Tensor kept = Tensor::zeros({1024}, DType::Float32, Device::SharedCpu);
        try {
          Sender<IndexedTensor> stage = std::move(tx);
          stage.send(IndexedTensor{1, kept});
          CHILD_CHECK(ack_rx.recv().has_value());  // the receiver holds the storage now
          stage.send(IndexedTensor{2, kept});
          throw std::runtime_error("the stage failed");
        } catch (const std::runtime_error&) {
        }
        (void)done_rx.recv();  // lives on until the parent saw the failure
      });
  tx.detach();
  ack_rx.close();
  done_rx.close();
  auto first = rx.recv();
  ASSERT_TRUE(first.has_value());
  ack_tx.send(1);
  auto second = rx.recv();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->index, 2);
  EXPECT_EQ(second->data.numel(), 1024);
  const auto start = std::chrono::steady_clock::now();
  try {
    const auto next = rx.recv_for(10s);
    ADD_FAILURE() << (next.timed_out() ? "no PeerDied within 10 s: the failed sender's stream stayed open"
                                       : "a failed sender must not look like a clean end of stream");
  } catch (const PeerDied&) {
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  done_tx.send(1);
  EXPECT_TRUE(test::child_succeeded(child));
}

// The same with a new segment in the last frame (a tensor larger than a slab's blocks): over
// a pipe or ring the receiver opens it by the sender's fd number, after the sender dropped
// the channel. The channel's pins keep that fd open until the frame is resolved.
TEST_P(PeerDeathTest, NewSegmentSentJustBeforeAnExceptionDropsTheSenderCanStillBeRead) {
  auto [tx, rx] = channel<IndexedTensor>(GetParam());
  auto [dropped_tx, dropped_rx] = channel<int>(Transport::Pipe);
  auto [done_tx, done_rx] = channel<int>(Transport::Pipe);
  const std::int64_t elements =
      static_cast<std::int64_t>(SharedAllocator::global().settings().segment_bytes / 8 / sizeof(std::int32_t)) + 1024;
  const pid_t child = fork_child([&, &rx = rx, &tx = tx, &dropped_tx = dropped_tx, &dropped_rx = dropped_rx,
                                  &done_tx = done_tx, &done_rx = done_rx] {
    rx.close();
    dropped_rx.detach();
    done_tx.detach();
    tx.adopt();
    dropped_tx.adopt();
    try {
      Sender<IndexedTensor> stage = std::move(tx);
      Tensor big = Tensor::empty({elements}, DType::Int32, Device::SharedCpu);
      big.fill(7);
      stage.send(IndexedTensor{1, big});
      throw std::runtime_error("the stage failed");
    } catch (const std::runtime_error& error) {
      CHILD_CHECK(std::string(error.what()) == "the stage failed");
    }
    dropped_tx.send(1);
    (void)done_rx.recv();  // lives on until the parent read the frame
  });
  tx.detach();
  dropped_tx.detach();
  done_rx.close();
  ASSERT_EQ(dropped_rx.recv().value(), 1);  // the sender has dropped the channel
  auto got = rx.recv();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->data.numel(), elements);
  EXPECT_EQ(got->data.data<std::int32_t>()[elements - 1], 7);
  EXPECT_THROW(rx.recv_for(10s), PeerDied);
  done_tx.send(1);
  EXPECT_TRUE(test::child_succeeded(child));
}

// A sender killed after writing a frame but before the receiver mapped its storages: over a
// pipe the storage is named by /proc/<pid>/fd/<n>, which died with the sender. That is a
// dead peer (PeerDied), never a protocol error that blames the frame. Checked while the
// sender is a zombie and after it was reaped.
void expect_peer_died_after_sender_killed_post_send(Transport transport, bool reap_first) {
  auto [tx, rx] = channel<IndexedTensor>(transport);
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    rx.close();
    tx.adopt();
    tx.send(IndexedTensor{1, Tensor::zeros({1024}, DType::Float32, Device::SharedCpu)});
    ::kill(::getpid(), SIGKILL);
  });
  tx.detach();
  if (reap_first) {
    EXPECT_EQ(wait_child(child).signal, SIGKILL);
  } else {
    siginfo_t info{};
    ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);  // a zombie now
  }
  try {
    auto got = rx.recv();  // the socket carried the fd itself: the message is intact
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->data.numel(), 1024);
  } catch (const PeerDied& error) {
    EXPECT_NE(std::string(error.what()).find("died"), std::string::npos) << error.what();
  }
  EXPECT_THROW(rx.recv(), PeerDied);
  EXPECT_THROW(rx.recv(), PeerDied);  // stays dead
  if (!reap_first) {
    EXPECT_EQ(wait_child(child).signal, SIGKILL);
  }
  rx.close();
}

TEST_P(PeerDeathTest, SenderKilledAfterWritingIsPeerDiedWhileAZombie) {
  expect_peer_died_after_sender_killed_post_send(GetParam(), false);
}

TEST_P(PeerDeathTest, SenderKilledAfterWritingIsPeerDiedOnceReaped) {
  expect_peer_died_after_sender_killed_post_send(GetParam(), true);
}

TEST(PipeTransport, WritingToADeadReaderDoesNotRaiseSigpipe) {
  auto [tx, rx] = channel<int>(Transport::Pipe);
  rx.close();
  EXPECT_THROW(tx.send(1), ChannelClosed);  // the process is still alive to see it
}

volatile sig_atomic_t g_sigpipes = 0;
void count_sigpipe(int) { g_sigpipes = g_sigpipes + 1; }

// A pipe channel leaves SIGPIPE's disposition alone (the process's, which exec'd programs
// inherit): a send into a pipe whose reader is gone is ChannelClosed, the SIGPIPE that the
// write raised is taken back in the writing thread (a handler of the program never runs),
// and the thread's signal mask is what it was. (In children: dispositions are process-wide.)
TEST(PipeTransport, LeavesTheSigpipeDispositionAlone) {
  for (const bool with_handler : {false, true}) {
    const pid_t child = test::fork_child([with_handler] {
      struct sigaction mine {};
      mine.sa_handler = with_handler ? count_sigpipe : SIG_DFL;
      ::sigemptyset(&mine.sa_mask);
      CHILD_CHECK(::sigaction(SIGPIPE, &mine, nullptr) == 0);
      auto [tx, rx] = channel<int>(Transport::Pipe);
      rx.close();
      bool closed = false;
      try {
        tx.send(1);
      } catch (const ChannelClosed&) {
        closed = true;
      }
      CHILD_CHECK(closed);
      struct sigaction now {};
      CHILD_CHECK(::sigaction(SIGPIPE, nullptr, &now) == 0);
      CHILD_CHECK(now.sa_handler == mine.sa_handler);
      CHILD_CHECK(g_sigpipes == 0);
      sigset_t mask;
      sigset_t pending;
      CHILD_CHECK(::pthread_sigmask(SIG_SETMASK, nullptr, &mask) == 0 && ::sigismember(&mask, SIGPIPE) == 0);
      CHILD_CHECK(::sigpending(&pending) == 0 && ::sigismember(&pending, SIGPIPE) == 0);
    });
    EXPECT_TRUE(test::child_succeeded(child)) << (with_handler ? "with a handler" : "with the default action");
  }
}

// A program that made a pipe channel and then runs `sh -c 'yes | head -1'` gets what a
// shell gives: `yes` ends by SIGPIPE (status 141), it does not print "Broken pipe" and
// exit 1 as it does with SIGPIPE ignored.
TEST(PipeTransport, ProgramsExecdAfterAPipeChannelGetTheDefaultSigpipe) {
  int status_pipe[2];
  ASSERT_EQ(::pipe2(status_pipe, O_CLOEXEC), 0);
  detail::UniqueFd status_read(status_pipe[0]);
  detail::UniqueFd status_write(status_pipe[1]);
  const pid_t child = test::fork_child([&] {
    status_read.reset();
    CHILD_CHECK(::signal(SIGPIPE, SIG_DFL) != SIG_ERR);
    auto [tx, rx] = channel<int>(Transport::Pipe);
    rx.close();
    try {
      tx.send(1);
    } catch (const ChannelClosed&) {
    }
    CHILD_CHECK(::dup2(status_write.get(), 3) == 3);  // the shell reports `yes`'s status on fd 3
    ::execl("/bin/sh", "sh", "-c", "{ yes; echo \"$?\" >&3; } | head -n 1 >/dev/null", static_cast<char*>(nullptr));
    CHILD_CHECK(!"execl /bin/sh");
  });
  status_write.reset();
  std::string status;
  char buffer[16];
  for (ssize_t got; (got = ::read(status_read.get(), buffer, sizeof buffer)) > 0;) status.append(buffer, got);
  EXPECT_TRUE(test::child_succeeded(child));
  EXPECT_EQ(status, "141\n") << "`yes` did not end by SIGPIPE: the shell inherited SIGPIPE ignored";
}

// A transport without a return board (UCX) reports deliveries itself; a peer that reports
// more than was sent cannot make a fan-out forget messages in flight.
class OverReportingWriter final : public detail::FrameWriter {
 public:
  OverReportingWriter() : FrameWriter(copying()) {}
  bool write(std::span<const iovec>, std::span<const int>, const detail::Deadline&) override { return true; }
  bool write_copies(std::span<const iovec>, std::span<const iovec>, std::span<const std::shared_ptr<Storage>>,
                    const detail::Deadline&) override {
    return true;
  }
  std::uint64_t delivered_by_reader() override { return 1'000'000; }
  void close() noexcept override {}

 private:
  static detail::TransportCapabilities copying() noexcept {
    detail::TransportCapabilities capabilities;
    capabilities.carries_copies = true;
    return capabilities;
  }
};

TEST(DeliveryReportTest, ReportedDeliveriesNeverExceedWhatWasSent) {
  Sender<int> tx = detail::sender_over<int>(std::make_unique<OverReportingWriter>(), Transport::Ucx, ChannelOptions{});
  tx.track_delivery();
  for (int i = 0; i < 3; ++i) tx.send(i);
  EXPECT_EQ(tx.delivered(), tx.last_sequence());
  EXPECT_LT(tx.delivered(), 1'000'000u);
  tx.detach();
}

TEST(DeliveryReportTest, AnEndWhoseTransportReportsDeliveriesHasNoDeliveryBoard) {
  Sender<int> tx = detail::sender_over<int>(std::make_unique<OverReportingWriter>(), Transport::Ucx, ChannelOptions{});
  tx.track_delivery();
  tx.send(1);
  EXPECT_EQ(detail::EndAccess::delivery_board(tx), nullptr);  // a fan-out asks delivered() instead
  tx.detach();
  auto [local_tx, local_rx] = channel<int>(Transport::InProcess);
  local_tx.track_delivery();
  local_tx.send(1);
  EXPECT_EQ(detail::EndAccess::delivery_board(local_tx), nullptr);
}

TEST(DeliveryReportTest, TheDeliveryBoardCountsWhatRecvReturnedOnceTheFirstMessageWent) {
  for (const Transport transport : {Transport::Pipe, Transport::UnixSocket, Transport::ShmRing}) {
    SCOPED_TRACE(std::string(transport_name(transport)));
    auto [tx, rx] = channel<int>(transport);
    tx.track_delivery();
    EXPECT_EQ(detail::EndAccess::delivery_board(tx), nullptr);  // the board goes with the first message
    for (int i = 0; i < 3; ++i) tx.send(i);
    const std::shared_ptr<const detail::ReturnBoard> board = detail::EndAccess::delivery_board(tx);
    ASSERT_NE(board, nullptr);
    EXPECT_EQ(board->resolved(), 0u);
    EXPECT_EQ(rx.recv(), 0);
    EXPECT_EQ(rx.recv(), 1);
    EXPECT_EQ(board->resolved(), 2u);
    EXPECT_EQ(tx.delivered(), 2u);
    tx.close();
    EXPECT_EQ(rx.recv(), 2);
    EXPECT_EQ(board->resolved(), 3u);  // still readable after the end closed
  }
}

}  // namespace
}  // namespace ferry
