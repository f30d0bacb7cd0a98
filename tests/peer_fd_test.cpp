// Segments named by fd number (Transport::Pipe and ShmRing): the receiver takes them with
// pidfd_getfd, or through /proc where that is refused; the sender learns from the return
// board that it may let them go, and waits on the transport only in close().
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "ferry/detail/frame_channel.hpp"
#include "ferry/detail/peer_fd.hpp"
#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/syscall_fault.hpp"

#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::child_succeeded;
using test::fork_child;
using test::wait_child;
using Method = detail::PeerFdOpener::Method;

detail::FileIdentity identity_of(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_errno("fstat");
  return detail::FileIdentity{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)};
}

// A child that holds a memfd at a known fd number (100 unless taken) until told to exit (a byte on `go`).
struct FdHolder {
  pid_t pid = -1;
  int fd = -1;
  detail::FileIdentity identity;
  detail::UniqueFd go;
};

FdHolder start_holder() {
  int to_child[2];
  int from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) throw_errno("pipe2");
  FdHolder holder;
  holder.pid = fork_child([&] {
    ::close(to_child[1]);
    ::close(from_child[0]);
    const int created = ::memfd_create("peer-fd-test", MFD_CLOEXEC);
    CHILD_CHECK(created >= 0);
    // At a fixed number (the lowest free one from 100), whatever this child inherited.
    const int memfd = ::fcntl(created, F_DUPFD_CLOEXEC, 100);
    CHILD_CHECK(memfd >= 0 && ::close(created) == 0);
    CHILD_CHECK(::write(from_child[1], &memfd, sizeof memfd) == sizeof memfd);
    char byte = 0;
    CHILD_CHECK(::read(to_child[0], &byte, 1) >= 0);  // 0 at EOF: the parent went away
  });
  ::close(to_child[0]);
  ::close(from_child[1]);
  holder.go.reset(to_child[1]);
  detail::UniqueFd answer(from_child[0]);
  if (::read(answer.get(), &holder.fd, sizeof holder.fd) != sizeof holder.fd) throw_errno("read from the holder");
  // The identity through /proc, without pidfd_getfd (what is under test).
  const std::string path = "/proc/" + std::to_string(holder.pid) + "/fd/" + std::to_string(holder.fd);
  detail::UniqueFd opened(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!opened) throw_errno("open " + path);
  holder.identity = identity_of(opened.get());
  return holder;
}

void stop_holder(FdHolder& holder) {
  holder.go.reset();
  EXPECT_TRUE(child_succeeded(holder.pid));
}

class PeerFdOpenerTest : public test::LeakCheckedTest {};

TEST_F(PeerFdOpenerTest, TakesADescriptorWithPidfdGetfdThroughOneKeptPidfd) {
  FdHolder holder = start_holder();
  {
    detail::PeerFdOpener opener;
    const std::uint64_t by_pidfd = detail::PeerFdOpener::taken_count(Method::PidfdGetfd);
    const std::uint64_t by_proc = detail::PeerFdOpener::taken_count(Method::ProcPath);
    detail::PeerFdOpener::Taken first = opener.take(holder.pid, holder.fd);
    ASSERT_TRUE(first.fd) << std::strerror(first.error);
    EXPECT_EQ(first.method, Method::PidfdGetfd);
    EXPECT_EQ(identity_of(first.fd.get()), holder.identity);
    EXPECT_TRUE(::fcntl(first.fd.get(), F_GETFD) & FD_CLOEXEC);
    // The pidfd is kept: a second take opens exactly one new descriptor.
    const std::size_t fds = test::count_open_fds();
    detail::PeerFdOpener::Taken second = opener.take(holder.pid, holder.fd);
    ASSERT_TRUE(second.fd);
    EXPECT_EQ(test::count_open_fds(), fds + 1);
    EXPECT_EQ(detail::PeerFdOpener::taken_count(Method::PidfdGetfd), by_pidfd + 2);
    EXPECT_EQ(detail::PeerFdOpener::taken_count(Method::ProcPath), by_proc);
    EXPECT_FALSE(opener.exited(holder.pid, 0ms));
  }
  stop_holder(holder);
}

TEST_F(PeerFdOpenerTest, SwitchedOffItOpensTheProcPath) {
  FdHolder holder = start_holder();
  detail::PeerFdOpener::allow_pidfd_getfd(false);
  {
    detail::PeerFdOpener opener;
    const std::uint64_t by_proc = detail::PeerFdOpener::taken_count(Method::ProcPath);
    detail::PeerFdOpener::Taken taken = opener.take(holder.pid, holder.fd);
    ASSERT_TRUE(taken.fd) << std::strerror(taken.error);
    EXPECT_EQ(taken.method, Method::ProcPath);
    EXPECT_EQ(identity_of(taken.fd.get()), holder.identity);
    EXPECT_EQ(detail::PeerFdOpener::taken_count(Method::ProcPath), by_proc + 1);
  }
  detail::PeerFdOpener::allow_pidfd_getfd(true);
  stop_holder(holder);
}

// pidfd_getfd refused (a container's seccomp profile, Yama) or missing (an old kernel):
// the opener falls back to /proc, and asks pidfd_getfd no more.
void expect_fallback_when_pidfd_getfd_fails_with(int error) {
  FERRY_SKIP_WITHOUT_SYSCALL_FAULTS();
  FdHolder holder = start_holder();
  const pid_t child = fork_child([&] {
    CHILD_CHECK(test::fail_syscall(SYS_pidfd_getfd, error).empty());
    detail::PeerFdOpener opener;
    const std::uint64_t fallbacks = detail::PeerFdOpener::fallback_count();
    const std::uint64_t by_proc = detail::PeerFdOpener::taken_count(Method::ProcPath);
    const std::uint64_t by_pidfd = detail::PeerFdOpener::taken_count(Method::PidfdGetfd);
    for (int i = 0; i < 3; ++i) {
      detail::PeerFdOpener::Taken taken = opener.take(holder.pid, holder.fd);
      CHILD_CHECK(taken.fd);
      CHILD_CHECK(taken.method == Method::ProcPath);
      CHILD_CHECK(identity_of(taken.fd.get()) == holder.identity);
    }
    CHILD_CHECK(detail::PeerFdOpener::fallback_count() == fallbacks + 1);  // remembered
    CHILD_CHECK(detail::PeerFdOpener::taken_count(Method::ProcPath) == by_proc + 3);
    CHILD_CHECK(detail::PeerFdOpener::taken_count(Method::PidfdGetfd) == by_pidfd);
  });
  EXPECT_TRUE(child_succeeded(child));
  stop_holder(holder);
}

TEST_F(PeerFdOpenerTest, RefusedPidfdGetfdFallsBackToProcOnce) { expect_fallback_when_pidfd_getfd_fails_with(EPERM); }

TEST_F(PeerFdOpenerTest, MissingPidfdGetfdFallsBackToProcOnce) { expect_fallback_when_pidfd_getfd_fails_with(ENOSYS); }

TEST_F(PeerFdOpenerTest, APeerThatExitedIsReportedAsExited) {
  FdHolder holder = start_holder();
  detail::PeerFdOpener opener;
  ASSERT_TRUE(opener.take(holder.pid, holder.fd).fd);
  stop_holder(holder);  // exited and reaped
  detail::PeerFdOpener::Taken taken = opener.take(holder.pid, holder.fd);
  EXPECT_FALSE(taken.fd);
  EXPECT_EQ(taken.error, ESRCH);
  EXPECT_TRUE(opener.exited(holder.pid, 0ms));
  opener.reset();
}

// Makes the next fork() of this process get pid `pid` (needs the right to write
// /proc/sys/kernel/ns_last_pid, root in the pid namespace); false when it cannot.
bool next_pid_will_be(pid_t pid) {
  detail::UniqueFd last(::open("/proc/sys/kernel/ns_last_pid", O_WRONLY | O_CLOEXEC));
  if (!last) return false;
  const std::string text = std::to_string(pid - 1);
  return ::write(last.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size());
}

// The kept pidfd names the process that was asked first: after it exited, a new process
// that got the same pid (and holds a segment at the same fd number) is not reached.
TEST_F(PeerFdOpenerTest, APidReusedByAnotherProcessIsNotReached) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to choose the pid of a new process (ns_last_pid)";
  FdHolder first = start_holder();
  detail::PeerFdOpener opener;
  ASSERT_TRUE(opener.take(first.pid, first.fd).fd);
  stop_holder(first);
  FdHolder second;
  for (int attempt = 0; attempt < 20 && second.pid != first.pid; ++attempt) {
    if (second.pid > 0) stop_holder(second);
    ASSERT_TRUE(next_pid_will_be(first.pid)) << "cannot write /proc/sys/kernel/ns_last_pid";
    second = start_holder();  // another process may take the pid first: try again
  }
  ASSERT_EQ(second.pid, first.pid) << "the pid was not reused";
  ASSERT_EQ(second.fd, first.fd);
  ASSERT_NE(second.identity, first.identity);
  detail::PeerFdOpener::Taken taken = opener.take(second.pid, second.fd);
  EXPECT_FALSE(taken.fd) << "reached the new process that reused the pid";
  EXPECT_TRUE(opener.exited(second.pid, 0ms));
  // A new opener (a new connection) reaches the new process.
  detail::PeerFdOpener fresh;
  detail::PeerFdOpener::Taken reached = fresh.take(second.pid, second.fd);
  ASSERT_TRUE(reached.fd);
  EXPECT_EQ(identity_of(reached.fd.get()), second.identity);
  reached.fd.reset();
  fresh.reset();
  opener.reset();
  stop_holder(second);
}

// ---- over a channel ------------------------------------------------------------------

struct Payload {
  std::int64_t index = 0;
  Tensor data;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(index, data);
  }
};

// Larger than the largest slab block: every tensor gets a segment of its own.
std::int64_t segment_sized_elements() {
  return static_cast<std::int64_t>(SharedAllocator::global().settings().segment_bytes / 8 / sizeof(std::int32_t) +
                                   1024);
}

Tensor filled(std::int64_t elements, std::int32_t value) {
  return Tensor::from(std::vector<std::int32_t>(static_cast<std::size_t>(elements), value), {elements},
                      Device::SharedCpu);
}

class FdNamingTransportTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {};

INSTANTIATE_TEST_SUITE_P(Transports, FdNamingTransportTest, ::testing::Values(Transport::Pipe, Transport::ShmRing),
                         [](const ::testing::TestParamInfo<Transport>& info) {
                           return std::string(transport_name(info.param));
                         });

// Runs `rounds` round trips of a new segment each, with pidfd_getfd allowed or not in the
// receiver; the receiver checks which way it took them.
void round_trips_of_new_segments(Transport transport, bool allow_pidfd_getfd, int rounds) {
  auto [tx, rx] = channel<Payload>(transport);
  auto [reply_tx, reply_rx] = channel<std::int64_t>(transport);
  const std::int64_t elements = segment_sized_elements();
  const pid_t child = fork_child([&, &rx = rx, &tx = tx, &reply_tx = reply_tx, &reply_rx = reply_rx] {
    tx.detach();
    reply_rx.close();
    reply_tx.adopt();
    detail::PeerFdOpener::allow_pidfd_getfd(allow_pidfd_getfd);
    const std::uint64_t by_pidfd = detail::PeerFdOpener::taken_count(Method::PidfdGetfd);
    const std::uint64_t by_proc = detail::PeerFdOpener::taken_count(Method::ProcPath);
    int got = 0;
    while (auto message = rx.recv()) {
      CHILD_CHECK(message->data.numel() == elements);
      CHILD_CHECK(message->data.at<std::int32_t>({elements - 1}) == static_cast<std::int32_t>(message->index));
      reply_tx.send(message->index);
      ++got;
    }
    CHILD_CHECK(got == rounds);
    // Each new segment was taken once, plus the return board with the first.
    const std::uint64_t expected = static_cast<std::uint64_t>(rounds) + 1;
    CHILD_CHECK(detail::PeerFdOpener::taken_count(allow_pidfd_getfd ? Method::PidfdGetfd : Method::ProcPath) ==
                (allow_pidfd_getfd ? by_pidfd : by_proc) + expected);
    CHILD_CHECK(detail::PeerFdOpener::taken_count(allow_pidfd_getfd ? Method::ProcPath : Method::PidfdGetfd) ==
                (allow_pidfd_getfd ? by_proc : by_pidfd));
    reply_tx.close();
  });
  rx.close();
  reply_tx.detach();
  std::vector<Tensor> sent;
  for (std::int32_t i = 0; i < rounds; ++i) {
    sent.push_back(filled(elements, i));
    tx.send(Payload{i, sent.back()});
    ASSERT_EQ(reply_rx.recv().value(), i);
    // Frames before the last one are acknowledged: the board told this send.
    EXPECT_LE(detail::EndAccess::core(tx).segments_awaiting_acknowledgement(), 1u);
  }
  // The receiver recorded every frame on the board and acknowledged none on the transport.
  EXPECT_EQ(detail::EndAccess::core(tx).writer().acknowledged(), 0u);
  if (transport == Transport::Pipe) {
    int queued = -1;
    ASSERT_EQ(::ioctl(detail::EndAccess::core(tx).writer().descriptors().at(1), FIONREAD, &queued), 0);
    EXPECT_EQ(queued, 0) << "the receiver wrote acknowledgements to the pipe";
  }
  tx.close();
  EXPECT_FALSE(reply_rx.recv().has_value());
  EXPECT_TRUE(child_succeeded(child));
}

TEST_P(FdNamingTransportTest, NewSegmentsAreTakenWithPidfdGetfdAndAcknowledgedOnTheBoard) {
  round_trips_of_new_segments(GetParam(), true, 8);
}

TEST_P(FdNamingTransportTest, WithoutPidfdGetfdNewSegmentsComeThroughProc) {
  round_trips_of_new_segments(GetParam(), false, 4);
}

// close() right after sending new segments, then exit: the receiver, which starts reading
// only later, still maps them, because close() asked for an acknowledgement on the
// transport and waited for it.
TEST_P(FdNamingTransportTest, SenderThatClosesAndExitsRightAfterSendingWaitsForTheReceiver) {
  auto [tx, rx] = channel<Payload>(GetParam());
  const std::int64_t elements = segment_sized_elements();
  int report[2];
  ASSERT_EQ(::pipe2(report, O_CLOEXEC), 0);
  detail::UniqueFd report_read(report[0]);
  detail::UniqueFd report_write(report[1]);
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    rx.close();
    report_read.reset();
    tx.adopt();
    for (std::int32_t i = 0; i < 3; ++i) tx.send(Payload{i, filled(elements, 100 + i)});
    const char closing = 1;
    CHILD_CHECK(::write(report_write.get(), &closing, 1) == 1);
    tx.close();  // waits for the receiver to have the segments
    const std::uint64_t acknowledged = detail::EndAccess::core(tx).writer().acknowledged();
    CHILD_CHECK(::write(report_write.get(), &acknowledged, sizeof acknowledged) == sizeof acknowledged);
  });  // exits at once
  tx.detach();
  report_write.reset();
  char closing = 0;
  ASSERT_EQ(::read(report_read.get(), &closing, 1), 1);
  std::this_thread::sleep_for(100ms);  // the sender is blocked in close() by now
  for (std::int32_t i = 0; i < 3; ++i) {
    auto got = rx.recv();
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->index, i);
    EXPECT_EQ(got->data.at<std::int32_t>({elements - 1}), 100 + i);
  }
  EXPECT_FALSE(rx.recv().has_value());
  std::uint64_t acknowledged = 0;
  ASSERT_EQ(::read(report_read.get(), &acknowledged, sizeof acknowledged), static_cast<ssize_t>(sizeof acknowledged));
  EXPECT_EQ(acknowledged, 3u) << "close() learned of the last frame through the transport";
  EXPECT_TRUE(child_succeeded(child));
  rx.close();
}

// A receiver killed while the sender waits in close(): close() returns (the transport
// reports the reader gone), well within its linger.
TEST_P(FdNamingTransportTest, ReceiverKilledWhileTheSenderWaitsInClose) {
  ChannelOptions options;
  options.close_linger = 60s;
  auto [tx, rx] = channel<Payload>(GetParam(), options);
  const pid_t child = fork_child([&, &tx = tx] {
    tx.detach();
    ::pause();  // never reads
  });
  rx.close();
  tx.send(Payload{1, filled(segment_sized_elements(), 1)});
  std::thread killer([child] {
    std::this_thread::sleep_for(200ms);
    ::kill(child, SIGKILL);
  });
  const auto start = std::chrono::steady_clock::now();
  tx.close();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  killer.join();
  EXPECT_EQ(wait_child(child).signal, SIGKILL);
}

}  // namespace
}  // namespace ferry
