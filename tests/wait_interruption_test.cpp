// ScopedWaitInterruption: every blocking wait of ferry calls the installed check while it
// sleeps and lets its WaitInterrupted out; the end stays usable afterwards; a signal
// handler that ran in the waiting thread makes the check run at once.
#include <gtest/gtest.h>

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.hpp"
#include "ferry/wait_interruption.hpp"
#include "support/transports.hpp"

namespace ferry {
namespace wait_interruption_test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A check that abandons the wait once `at` has passed, counting its calls.
struct InterruptAt {
  Clock::time_point at;
  int calls = 0;
  static void check(void* context) {
    auto* self = static_cast<InterruptAt*>(context);
    ++self->calls;
    if (Clock::now() >= self->at) throw WaitInterrupted();
  }
};

// Runs `wait` with a check that interrupts it after 100 ms; returns how long it took to
// leave with WaitInterrupted (fails the test if it returned or threw something else).
template <class Wait>
Clock::duration interrupted_after_100ms(const Wait& wait) {
  const Clock::time_point start = Clock::now();
  InterruptAt interrupt{start + 100ms};
  const ScopedWaitInterruption scope(&InterruptAt::check, &interrupt);
  try {
    wait();
    ADD_FAILURE() << "the wait returned instead of being interrupted";
  } catch (const WaitInterrupted&) {
  }
  const Clock::duration took = Clock::now() - start;
  EXPECT_GE(interrupt.calls, 1);
  // The check is due every kWaitInterruptionPeriod (50 ms): generous bounds on a shared machine.
  EXPECT_GE(took, 100ms);
  EXPECT_LT(took, 1s);
  return took;
}

std::vector<Transport> every_transport() {
  std::vector<Transport> all = test::interprocess_transports();
  all.push_back(Transport::InProcess);
  return all;
}

class WaitInterruptionTest : public ::testing::TestWithParam<Transport> {};

TEST_P(WaitInterruptionTest, RecvOnAnEmptyChannelIsInterruptedAndTheChannelGoesOn) {
  auto [tx, rx] = channel<std::string>(GetParam());
  interrupted_after_100ms([&rx = rx] { (void)rx.recv(); });
  interrupted_after_100ms([&rx = rx] { (void)rx.recv_for(10s); });
  tx.send("after");
  const auto message = rx.recv();
  ASSERT_TRUE(message.has_value());
  EXPECT_EQ(*message, "after");
}

TEST_P(WaitInterruptionTest, SendOnAFullTransportIsInterruptedAndNothingOfItArrives) {
  ChannelOptions options;
  options.ring_capacity = 4096;
  options.queue_capacity = 4;
  auto [tx, rx] = channel<std::string>(GetParam(), options);
  const std::string message(512, 'x');
  int sent = 0;
  while (tx.send_for(message, 0ms)) ++sent;  // full
  ASSERT_GT(sent, 0);
  interrupted_after_100ms([&tx = tx] { tx.send("interrupted"); });
  interrupted_after_100ms([&tx = tx] { (void)tx.send_for("interrupted too", 10s); });
  EXPECT_FALSE(tx.send_for(std::string("refused"), 0ms));  // still full, the end usable
  // The last send_for() may have left the tail of its frame to the next write: flush it as
  // the receiver makes room.
  int received = 0;
  for (int round = 0; received < sent && round < 10'000; ++round) {
    auto got = rx.recv_for(10ms);
    if (!got.has_value()) {
      (void)tx.flush(0ms);
      continue;
    }
    EXPECT_EQ(*got, message);
    ++received;
  }
  EXPECT_EQ(received, sent);
  tx.send("last");
  tx.close();
  EXPECT_EQ(rx.recv().value_or("(end)"), "last");
  EXPECT_FALSE(rx.recv().has_value());
}

INSTANTIATE_TEST_SUITE_P(Transports, WaitInterruptionTest, ::testing::ValuesIn(every_transport()),
                         test::transport_test_name);

TEST(WaitInterruption, WithoutACheckAWaitSleepsItsFullTime) {
  auto [tx, rx] = channel<int>(Transport::ShmRing);
  const Clock::time_point start = Clock::now();
  EXPECT_FALSE(rx.recv_for(120ms).has_value());
  EXPECT_GE(Clock::now() - start, 120ms);
}

TEST(WaitInterruption, AListenerAcceptIsInterrupted) {
  Listener listener = listen("unix:@ferry-wait-interruption-" + std::to_string(::getpid()));
  interrupted_after_100ms([&] { (void)listener.accept_receiver_for<int>(std::chrono::hours(1)); });
}

TEST(WaitInterruption, AConnectRetryingForAMissingListenerIsInterrupted) {
  EndpointOptions options;
  options.connect_timeout = std::chrono::hours(1);
  interrupted_after_100ms(
      [&] { (void)connect_sender<int>("unix:@ferry-nobody-listens-" + std::to_string(::getpid()), options); });
}

TEST(WaitInterruption, ASelectorWaitIsInterrupted) {
  auto [ring_tx, ring_rx] = channel<int>(Transport::ShmRing);
  auto [unix_tx, unix_rx] = channel<int>(Transport::UnixSocket);
  Selector rings;
  rings.add(ring_rx);
  interrupted_after_100ms([&] { (void)rings.wait(); });
  Selector mixed;
  mixed.add(ring_rx);
  mixed.add(unix_rx);
  interrupted_after_100ms([&] { (void)mixed.wait(); });
}

void wait_for_the_end(WorkerContext&, Receiver<int> input) {
  while (input.recv()) {
  }
}

TEST(WaitInterruption, AJoinIsInterruptedAndTheWorkersRunOn) {
  auto [tx, rx] = channel<int>(Transport::UnixSocket);
  WorkerGroup workers = spawn(1, &wait_for_the_end, std::move(rx));
  interrupted_after_100ms([&] { workers.join(); });
  EXPECT_EQ(workers.running(), 1);
  tx.close();
  workers.join();
  EXPECT_TRUE(workers.exit_status(0)->success());
}

TEST(WaitInterruption, ChecksNestAndASuspendedScopeRunsNone) {
  auto [tx, rx] = channel<int>(Transport::Pipe);
  InterruptAt never{Clock::time_point::max()};
  const ScopedWaitInterruption outer(&InterruptAt::check, &never);
  interrupted_after_100ms([&rx = rx] { (void)rx.recv(); });  // the inner one fires; the outer ran too
  EXPECT_GE(never.calls, 1);
  const int before = never.calls;
  {
    const detail::WaitInterruptionSuspended suspended;
    EXPECT_FALSE(rx.recv_for(120ms).has_value());
  }
  EXPECT_EQ(never.calls, before);
}

std::atomic<bool> g_signalled{false};
void on_signal(int) { g_signalled.store(true); }

void interrupt_when_signalled(void*) {
  if (g_signalled.load()) throw WaitInterrupted();
}

TEST(WaitInterruption, ASignalHandledInTheWaitingThreadRunsTheCheckAtOnce) {
  struct sigaction action {};
  struct sigaction previous {};
  action.sa_handler = &on_signal;  // no SA_RESTART: the wait's system call ends with EINTR
  ASSERT_EQ(::sigaction(SIGUSR1, &action, &previous), 0);
  g_signalled = false;
  auto [tx, rx] = channel<int>(Transport::UnixSocket);
  const pthread_t waiter = ::pthread_self();
  std::thread signaller([waiter] {
    std::this_thread::sleep_for(30ms);
    ::pthread_kill(waiter, SIGUSR1);
  });
  const Clock::time_point start = Clock::now();
  {
    const ScopedWaitInterruption scope(&interrupt_when_signalled, nullptr);
    EXPECT_THROW((void)rx.recv(), WaitInterrupted);
  }
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  signaller.join();
  ::sigaction(SIGUSR1, &previous, nullptr);
  EXPECT_LT(took, 1s);
  std::printf("interrupted %lld ms after the wait began (signal sent at 30 ms)\n",
              static_cast<long long>(took.count()));
}

// A check installed with a longer period is called that much less often during a wait
// that a signal would end; a wait a signal does not end (in-process) still calls it every
// kWaitInterruptionPeriod.
TEST(WaitInterruption, ALongerPeriodChecksLessOftenExceptInWaitsASignalDoesNotEnd) {
  auto [tx, rx] = channel<int>(Transport::UnixSocket);
  InterruptAt never{Clock::time_point::max()};
  {
    const ScopedWaitInterruption scope(&InterruptAt::check, &never, 1s);
    EXPECT_TRUE(rx.recv_for(300ms).timed_out());
  }
  EXPECT_EQ(never.calls, 0);
  {
    const ScopedWaitInterruption scope(&InterruptAt::check, &never);
    EXPECT_TRUE(rx.recv_for(300ms).timed_out());
  }
  EXPECT_GE(never.calls, 3);  // every 50 ms: about 5
  auto [in_tx, in_rx] = channel<int>(Transport::InProcess);
  never.calls = 0;
  {
    const ScopedWaitInterruption scope(&InterruptAt::check, &never, 1s);
    EXPECT_TRUE(in_rx.recv_for(300ms).timed_out());
  }
  EXPECT_GE(never.calls, 3);
}

}  // namespace wait_interruption_test
}  // namespace ferry
