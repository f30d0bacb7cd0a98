// An end belongs to one process: copies that cross fork() without a handover are refused
// in the second process that uses them (EndOwnedElsewhere), never a corrupt stream, a lost
// message or a hang; the handovers (detach/adopt) keep working; and a child that took an
// end and was killed is seen dead by the parent, although the parent holds a copy.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <thread>
#include <vector>

#include "ferry/detail/live_ends.hpp"
#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/transports.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::fork_child;
using test::wait_child;

// Exit status of a child whose use of an end was refused with EndOwnedElsewhere.
constexpr int kRefused = 3;

// A pipe for one process to tell another that a step is done.
class Signal {
 public:
  Signal() {
    if (::pipe(fds_.data()) != 0) throw std::runtime_error("pipe");
  }
  ~Signal() {
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  void post() const {
    const char byte = 1;
    if (::write(fds_[1], &byte, 1) != 1) throw std::runtime_error("write");
  }
  void wait() const {
    char byte = 0;
    if (::read(fds_[0], &byte, 1) != 1) throw std::runtime_error("read");
  }

 private:
  std::array<int, 2> fds_{};
};

class EndOwnershipTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {};

INSTANTIATE_TEST_SUITE_P(Transports, EndOwnershipTest, ::testing::ValuesIn(test::interprocess_transports()),
                         test::transport_test_name);

// Two children send on one inherited Sender that nobody used: the first takes it, the
// other is refused at its first send; the stream holds exactly the winner's messages.
TEST_P(EndOwnershipTest, TwoForkedSendersOnOneFreshSenderOneIsRefusedNothingIsMixed) {
  auto [tx, rx] = channel<int>(GetParam());
  constexpr int kCount = 200;
  const auto sender = [&tx = tx](int base) {
    return fork_child([&tx, base] {
      try {
        for (int i = 0; i < kCount; ++i) tx.send(base + i);
      } catch (const EndOwnedElsewhere& refused) {
        CHILD_CHECK(refused.role() == "Sender");
        ::_exit(kRefused);
      }
      tx.close();
    });
  };
  const pid_t first = sender(0);
  const pid_t second = sender(100000);
  std::vector<int> got;
  while (true) {
    auto value = rx.recv_for(20s);
    ASSERT_FALSE(value.timed_out());
    if (value.closed()) break;
    got.push_back(*value);
  }
  const test::ChildExit a = wait_child(first);
  const test::ChildExit b = wait_child(second);
  ASSERT_TRUE(a.exited && b.exited) << a.describe() << " / " << b.describe();
  EXPECT_EQ(std::min(a.code, b.code), 0);
  EXPECT_EQ(std::max(a.code, b.code), kRefused);
  ASSERT_EQ(got.size(), static_cast<std::size_t>(kCount));
  const int base = a.code == 0 ? 0 : 100000;
  for (int i = 0; i < kCount; ++i) EXPECT_EQ(got[i], base + i);
}

// A Sender the parent used is the parent's: the child's send is refused, and the child's
// close() of its copy does not end the parent's stream.
TEST_P(EndOwnershipTest, ASenderUsedBeforeForkIsRefusedInTheChildAndItsCloseEndsNothing) {
  auto [tx, rx] = channel<int>(GetParam());
  tx.send(1);
  const pid_t child = fork_child([&tx = tx] {
    bool refused = false;
    try {
      tx.send(2);
    } catch (const EndOwnedElsewhere& error) {
      refused = error.owner() == ::getppid() && error.owner_alive() &&
                error.reason() == EndOwnedElsewhere::Reason::UsedElsewhere &&
                std::string(error.what()).find("adopt()") != std::string::npos;
    }
    CHILD_CHECK(refused);
    tx.close();  // lets go of the copy only
  });
  ASSERT_TRUE(test::child_succeeded(child));
  tx.send(3);
  tx.close();
  EXPECT_EQ(rx.recv(), 1);
  EXPECT_EQ(rx.recv(), 3);
  EXPECT_FALSE(rx.recv().has_value());
}

// Two children receive on one inherited Receiver: one takes it and gets every message.
TEST_P(EndOwnershipTest, TwoForkedReceiversOnOneFreshReceiverOneGetsEverything) {
  auto [tx, rx] = channel<int>(GetParam());
  constexpr int kCount = 100;
  const auto receiver = [&rx = rx] {
    return fork_child([&rx] {
      try {
        for (int i = 0; i < kCount; ++i) CHILD_CHECK(rx.recv() == i);
        CHILD_CHECK(!rx.recv().has_value());
      } catch (const EndOwnedElsewhere& refused) {
        CHILD_CHECK(refused.role() == "Receiver");
        ::_exit(kRefused);
      }
    });
  };
  const pid_t first = receiver();
  const pid_t second = receiver();
  for (int i = 0; i < kCount; ++i) tx.send(i);
  tx.close();
  const test::ChildExit a = wait_child(first);
  const test::ChildExit b = wait_child(second);
  ASSERT_TRUE(a.exited && b.exited) << a.describe() << " / " << b.describe();
  EXPECT_EQ(std::min(a.code, b.code), 0);
  EXPECT_EQ(std::max(a.code, b.code), kRefused);
}

// The documented handover: the child adopts, the parent detaches. Once the child adopted,
// the parent's own send is refused instead of interleaving with the child's.
TEST_P(EndOwnershipTest, DetachAndAdoptHandTheEndOverAndTheGiverIsRefused) {
  auto [tx, rx] = channel<int>(GetParam());
  tx.send(1);
  Signal adopted;
  Signal go;
  const pid_t child = fork_child([&tx = tx, &rx = rx, &adopted, &go] {
    rx.detach();
    tx.adopt();
    adopted.post();
    go.wait();
    tx.send(2);
    tx.close();
  });
  adopted.wait();
  bool refused = false;
  try {
    tx.send(3);
  } catch (const EndOwnedElsewhere& error) {
    refused = error.owner() == child;
  }
  EXPECT_TRUE(refused);
  tx.detach();
  go.post();
  EXPECT_EQ(rx.recv(), 1);
  EXPECT_EQ(rx.recv(), 2);
  EXPECT_FALSE(rx.recv().has_value());
  EXPECT_TRUE(test::child_succeeded(child));
}

// A child took the Receiver and was killed: the parent's sender gets ChannelClosed instead
// of blocking for ever on a transport that only the parent's unused copy keeps open.
TEST_P(EndOwnershipTest, AKilledChildThatTookTheReceiverIsSeenByTheParentsSender) {
  auto [tx, rx] = channel<int>(GetParam());
  Signal took;
  const pid_t child = fork_child([&rx = rx, &tx = tx, &took] {
    tx.detach();
    CHILD_CHECK(rx.recv() == 0);
    took.post();
    ::pause();
  });
  tx.send(0);
  took.wait();
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  const test::ChildExit exit = wait_child(child);
  ASSERT_EQ(exit.signal, SIGKILL) << exit.describe();
  // Untimed sends: the ones that would wait in the kernel without the fix (ctest's
  // timeout stops a hang).
  bool closed = false;
  for (int i = 0; i < 1'000'000 && !closed; ++i) {
    try {
      tx.send(i);
    } catch (const ChannelClosed&) {
      closed = true;
    }
  }
  EXPECT_TRUE(closed);
  EXPECT_FALSE(rx.is_open());  // the parent's copy was let go of
}

// A child took the Sender and was killed: the parent's receiver gets PeerDied, although
// the parent holds a copy of the Sender.
TEST_P(EndOwnershipTest, AKilledChildThatTookTheSenderIsSeenByTheParentsReceiver) {
  auto [tx, rx] = channel<int>(GetParam());
  const pid_t child = fork_child([&tx = tx] {
    tx.send(7);
    ::pause();
  });
  EXPECT_EQ(rx.recv(), 7);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  ASSERT_EQ(wait_child(child).signal, SIGKILL);
  EXPECT_THROW(rx.recv(), PeerDied);  // untimed: ctest's timeout stops a hang
}

// The same through a Selector's untimed wait.
TEST_P(EndOwnershipTest, AKilledChildThatTookTheSenderIsSeenByTheParentsSelector) {
  auto [tx, rx] = channel<int>(GetParam());
  auto [other_tx, other_rx] = channel<int>(GetParam());
  const pid_t child = fork_child([&tx = tx, &other_rx = other_rx] {
    other_rx.detach();
    tx.send(7);
    ::pause();
  });
  EXPECT_EQ(rx.recv(), 7);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  ASSERT_EQ(wait_child(child).signal, SIGKILL);
  Selector selector;
  selector.add(other_rx);
  const std::size_t index = selector.add(rx);
  EXPECT_EQ(selector.wait(), index);  // untimed: ctest's timeout stops a hang
  EXPECT_THROW(rx.recv(), PeerDied);
}

// A copy whose end another process owns is never used by this one, closed or not: recv()
// on a closed copy raises, instead of reporting an end of stream that did not happen.
TEST_P(EndOwnershipTest, AReleasedCopyRaisesInsteadOfReportingTheEndOfTheStream) {
  auto [tx, rx] = channel<int>(GetParam());
  Signal took;
  Signal done;
  const pid_t child = fork_child([&rx = rx, &tx = tx, &took, &done] {
    tx.detach();
    CHILD_CHECK(rx.recv() == 5);
    took.post();
    done.wait();
  });
  tx.send(5);
  took.wait();
  rx.close();
  EXPECT_THROW(rx.recv(), EndOwnedElsewhere);
  done.post();
  EXPECT_TRUE(test::child_succeeded(child));
}

TEST(EndOwnership, AnInProcessEndIsRefusedInAForkedChild) {
  auto [tx, rx] = channel<int>(Transport::InProcess);
  const pid_t child = fork_child([&tx = tx, &rx = rx] {
    bool send_refused = false;
    bool recv_refused = false;
    try {
      tx.send(1);
    } catch (const EndOwnedElsewhere&) {
      send_refused = true;
    }
    try {
      rx.try_recv();
    } catch (const EndOwnedElsewhere&) {
      recv_refused = true;
    }
    CHILD_CHECK(send_refused && recv_refused);
  });
  EXPECT_TRUE(test::child_succeeded(child));
  tx.send(2);
  EXPECT_EQ(rx.recv(), 2);
}

TEST(EndOwnership, ADuplexEndUsedBeforeForkIsRefusedInTheChild) {
  auto [a, b] = duplex<int, int>(Transport::UnixSocket);
  a.send(1);
  EXPECT_EQ(b.recv(), 1);
  const pid_t child = fork_child([&a = a] {
    bool refused = false;
    try {
      a.send(2);
    } catch (const EndOwnedElsewhere&) {
      refused = true;
    }
    CHILD_CHECK(refused);
  });
  EXPECT_TRUE(test::child_succeeded(child));
}

// ThreadSanitizer: a thread waiting long on one channel lets go of the parent's copy of an
// end a child took, while the main thread makes and drops channels.
TEST(EndOwnership, AWaitingThreadLetsGoOfCopiesOwnedElsewhere) {
  auto [tx, rx] = channel<int>(Transport::UnixSocket);
  auto [idle_tx, idle_rx] = channel<int>(Transport::Pipe);
  Signal took;
  Signal done;
  const pid_t child = fork_child([&rx = rx, &tx = tx, &took, &done] {
    tx.detach();
    CHILD_CHECK(rx.recv() == 1);
    took.post();
    done.wait();
  });
  tx.send(1);
  took.wait();
  std::thread waiter([&idle_rx = idle_rx] { EXPECT_TRUE(idle_rx.recv_for(400ms).timed_out()); });
  for (int i = 0; i < 50; ++i) {
    auto [made_tx, made_rx] = channel<int>(Transport::Pipe);
    made_tx.send(i);
    EXPECT_EQ(made_rx.recv(), i);
  }
  waiter.join();
  EXPECT_FALSE(rx.is_open());
  done.post();
  EXPECT_TRUE(test::child_succeeded(child));
}

// Only ends that lived through a fork() can be owned elsewhere: until one exists, waits do
// not wake every kReleaseCheck to let go of copies.
TEST(EndOwnership, OnlyEndsCopiedByForkMakeWaitsWakeToLetGoOfCopies) {
  const std::size_t before = detail::ends_copied_by_fork();
  {
    auto [tx, rx] = channel<int>(Transport::UnixSocket);
    EXPECT_EQ(detail::ends_copied_by_fork(), before);
    const pid_t child = fork_child([] {});
    EXPECT_TRUE(test::child_succeeded(child));
    EXPECT_EQ(detail::ends_copied_by_fork(), before + 2);  // both ends have a copy in the child
    EXPECT_EQ(detail::release_check_slice(), std::chrono::nanoseconds(detail::kReleaseCheck));
    auto [later_tx, later_rx] = channel<int>(Transport::Pipe);  // made after the fork: nobody else has it
    EXPECT_EQ(detail::ends_copied_by_fork(), before + 2);
  }
  EXPECT_EQ(detail::ends_copied_by_fork(), before);
  EXPECT_EQ(detail::release_check_slice() == std::chrono::nanoseconds::max(), detail::ends_copied_by_fork() == 0);
}

// Claim words share pages: 1,000 channels (2,000 ends) add a handful of mappings, not one
// per end, and their pages are unmapped once the ends are gone.
TEST(EndOwnership, ClaimWordsOfManyEndsShareAFewPages) {
  const std::size_t before = test::count_shared_mappings();
  {
    std::vector<std::pair<Sender<int>, Receiver<int>>> channels;
    channels.reserve(1000);
    for (int i = 0; i < 1000; ++i) channels.push_back(channel<int>(Transport::UnixSocket));
    const std::size_t with_channels = test::count_shared_mappings();
    EXPECT_LE(with_channels, before + 8) << "2,000 claim words took " << with_channels - before << " mappings";
    channels.front().first.send(1);
    EXPECT_EQ(channels.front().second.recv(), 1);
  }
  EXPECT_LE(test::count_shared_mappings(), before + 1);
}

// A child never hands out the unused words of a page it inherited while its parent hands
// them out too: ends made after a fork on both sides keep their own words.
TEST(EndOwnership, EndsMadeAfterAForkInParentAndChildKeepTheirOwnWords) {
  auto [first_tx, first_rx] = channel<int>(Transport::UnixSocket);  // a page with unused words
  constexpr int kChannels = 100;
  const auto use_all = [](auto& channels, int value) {
    try {  // false, not a throw: the other process must not be left waiting for a signal
      for (auto& [tx, rx] : channels) {
        tx.send(value);
        if (rx.recv() != value) return false;
      }
      return true;
    } catch (const EndOwnedElsewhere&) {
      return false;
    }
  };
  Signal parent_made;
  Signal child_made;
  Signal parent_used;
  const pid_t child = fork_child([&] {
    parent_made.wait();
    std::vector<std::pair<Sender<int>, Receiver<int>>> mine;
    for (int i = 0; i < kChannels; ++i) mine.push_back(channel<int>(Transport::UnixSocket));
    CHILD_CHECK(use_all(mine, 1));
    child_made.post();
    parent_used.wait();
    CHILD_CHECK(use_all(mine, 2));
  });
  std::vector<std::pair<Sender<int>, Receiver<int>>> mine;
  for (int i = 0; i < kChannels; ++i) mine.push_back(channel<int>(Transport::UnixSocket));
  EXPECT_TRUE(use_all(mine, 1));
  parent_made.post();
  child_made.wait();
  EXPECT_TRUE(use_all(mine, 2));  // EndOwnedElsewhere if the child's ends took these words
  parent_used.post();
  EXPECT_TRUE(test::child_succeeded(child));
  first_tx.send(3);
  EXPECT_EQ(first_rx.recv(), 3);
}

// A word taken before a fork is not handed out again after the parent dropped its copy of
// the end: the child that owns the end goes on using it while the parent makes new ends.
TEST(EndOwnership, AWordTakenBeforeAForkIsNotHandedOutAgain) {
  auto [tx, rx] = channel<int>(Transport::UnixSocket);
  Signal took;
  Signal parent_made;
  const pid_t child = fork_child([&tx = tx, &took, &parent_made] {
    tx.send(1);  // the child owns the Sender now
    took.post();
    parent_made.wait();
    tx.send(2);  // EndOwnedElsewhere if a new end of the parent took its word
    tx.close();
  });
  took.wait();
  { const Sender<int> dropped = std::move(tx); }  // lets go of the parent's copy only
  std::vector<std::pair<Sender<int>, Receiver<int>>> made;
  for (int i = 0; i < 50; ++i) {
    made.push_back(channel<int>(Transport::UnixSocket));
    made.back().first.send(i);
    EXPECT_EQ(made.back().second.recv(), i);
  }
  parent_made.post();
  EXPECT_EQ(rx.recv(), 1);
  EXPECT_EQ(rx.recv(), 2);
  EXPECT_FALSE(rx.recv().has_value());
  EXPECT_TRUE(test::child_succeeded(child));
}

}  // namespace
}  // namespace ferry
