// Segment fds that travel instead of being taken from the sender's /proc: the side channel
// of the pipe and the ring (SegmentFdChannel) with honest and lying peers, senders that
// peers may not take fds from (not dumpable), and frames with more fds than one sendmsg
// carries.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#include "fd_passing/segment_fd_channel.hpp"
#include "ferry/detail/peer_fd.hpp"
#include "ferry/detail/transport.hpp"
#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/transports.hpp"

namespace ferry {
namespace fd_passing_test {  // named: unity builds put several test files in one unit
namespace {

using detail::SegmentFdChannel;
using test::child_succeeded;
using test::count_open_fds;
using test::fork_child;

constexpr uid_t kNobody = 65534;

struct SocketPair {
  detail::UniqueFd a;
  detail::UniqueFd b;
  SocketPair() {
    int ends[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) throw_errno("socketpair");
    a.reset(ends[0]);
    b.reset(ends[1]);
  }
};

std::vector<detail::UniqueFd> open_files(std::size_t count) {
  std::vector<detail::UniqueFd> files;
  for (std::size_t i = 0; i < count; ++i) {
    files.emplace_back(::memfd_create("fd-passing-test", MFD_CLOEXEC));
    if (!files.back()) throw_errno("memfd_create");
  }
  return files;
}

std::vector<int> numbers(const std::vector<detail::UniqueFd>& files) {
  std::vector<int> out;
  for (const detail::UniqueFd& file : files) out.push_back(file.get());
  return out;
}

// Sends one message of `fds` whose count byte says `declared`.
void send_raw(int socket, const std::vector<int>& fds, unsigned char declared) {
  iovec byte{&declared, 1};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  msghdr message{};
  message.msg_iov = &byte;
  message.msg_iovlen = 1;
  if (!fds.empty()) {
    message.msg_control = control.data();
    message.msg_controllen = control.size();
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(header), fds.data(), sizeof(int) * fds.size());
  }
  ASSERT_EQ(::sendmsg(socket, &message, MSG_NOSIGNAL), 1);
}

class SegmentFdChannelTest : public test::LeakCheckedTest {};

TEST_F(SegmentFdChannelTest, MoreFdsThanOneMessageCarriesArriveInOrder) {
  SocketPair pair;
  const std::vector<detail::UniqueFd> files = open_files(600);
  ASSERT_TRUE(SegmentFdChannel(pair.a.get()).send(numbers(files), detail::Deadline::never()));
  std::deque<detail::UniqueFd> got;
  EXPECT_EQ(SegmentFdChannel(pair.b.get()).receive(files.size(), got), files.size());
  ASSERT_EQ(got.size(), files.size());
  for (std::size_t i = 0; i < files.size(); ++i) {
    struct stat sent {
    }, received{};
    ASSERT_EQ(::fstat(files[i].get(), &sent), 0);
    ASSERT_EQ(::fstat(got[i].get(), &received), 0);
    EXPECT_EQ(sent.st_ino, received.st_ino) << "fd " << i;
    EXPECT_NE(::fcntl(got[i].get(), F_GETFD) & FD_CLOEXEC, 0);
  }
}

TEST_F(SegmentFdChannelTest, AMessageWithMoreFdsThanTheFrameDeclaresIsRefusedAndClosed) {
  SocketPair pair;
  const std::vector<detail::UniqueFd> files = open_files(10);
  send_raw(pair.a.get(), numbers(files), 10);
  const std::size_t fds_before = count_open_fds();
  std::deque<detail::UniqueFd> got;
  EXPECT_THROW(SegmentFdChannel(pair.b.get()).receive(3, got), ProtocolError);
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(count_open_fds(), fds_before) << "the refused fds were kept";
}

TEST_F(SegmentFdChannelTest, ACountByteThatDisagreesWithTheFdsIsRefused) {
  SocketPair pair;
  const std::vector<detail::UniqueFd> files = open_files(2);
  send_raw(pair.a.get(), numbers(files), 7);
  std::deque<detail::UniqueFd> got;
  EXPECT_THROW(SegmentFdChannel(pair.b.get()).receive(7, got), ProtocolError);
  send_raw(pair.a.get(), {}, 0);  // a byte without fds
  EXPECT_THROW(SegmentFdChannel(pair.b.get()).receive(1, got), ProtocolError);
  EXPECT_TRUE(got.empty());
}

// The reader takes what waits and never waits for more: a frame whose fds did not all come
// is the decoder's to refuse.
TEST_F(SegmentFdChannelTest, TheReaderTakesWhatCameAndNeverWaits) {
  SocketPair pair;
  const std::vector<detail::UniqueFd> files = open_files(1);
  std::deque<detail::UniqueFd> got;
  EXPECT_EQ(SegmentFdChannel(pair.b.get()).receive(2, got), 0u);
  send_raw(pair.a.get(), numbers(files), 1);
  EXPECT_EQ(SegmentFdChannel(pair.b.get()).receive(2, got), 1u);
  send_raw(pair.a.get(), numbers(files), 1);
  pair.a.reset();
  EXPECT_EQ(SegmentFdChannel(pair.b.get()).receive(2, got), 1u);
  EXPECT_EQ(SegmentFdChannel(pair.b.get()).receive(2, got), 0u);  // the writer is gone
  EXPECT_EQ(got.size(), 2u);
}

// A full socket: a timed send that could not send anything says so, and leaves nothing.
TEST_F(SegmentFdChannelTest, ATimedSendIntoAFullSocketGivesUpBeforeTheFirstMessage) {
  SocketPair pair;
  const std::vector<detail::UniqueFd> files = open_files(1);
  std::size_t sent = 0;
  while (SegmentFdChannel(pair.a.get()).send(numbers(files), detail::Deadline::after(std::chrono::milliseconds(0)))) {
    ASSERT_LT(++sent, 100000u) << "the socket never filled up";
  }
  std::deque<detail::UniqueFd> got;
  EXPECT_EQ(SegmentFdChannel(pair.b.get()).receive(sent + 1, got), sent);
}

TEST_F(SegmentFdChannelTest, SendingToAClosedReaderIsChannelClosed) {
  SocketPair pair;
  const std::vector<detail::UniqueFd> files = open_files(1);
  pair.b.reset();
  EXPECT_THROW(SegmentFdChannel(pair.a.get()).send(numbers(files), detail::Deadline::never()), ChannelClosed);
}

// ---- over channels --------------------------------------------------------------------

struct Batch {
  std::int64_t index = 0;
  std::vector<Tensor> tensors;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(index, tensors);
  }
};

// Larger than the largest slab block: every such tensor gets a segment of its own.
std::int64_t segment_sized_elements() {
  return static_cast<std::int64_t>(SharedAllocator::global().settings().segment_bytes / 8 / sizeof(std::int32_t) +
                                   1024);
}

Tensor filled(std::int64_t elements, std::int32_t value) {
  return Tensor::from(std::vector<std::int32_t>(static_cast<std::size_t>(elements), value), {elements},
                      Device::SharedCpu);
}

class NotDumpableSenderTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {};

INSTANTIATE_TEST_SUITE_P(Transports, NotDumpableSenderTest, ::testing::ValuesIn(test::interprocess_transports()),
                         test::transport_test_name);

// A sender that is not dumpable (prctl, a daemon that dropped root with setuid, a binary
// with file capabilities) refuses /proc/<pid>/fd and pidfd_getfd to its peers even of the
// same user: its segments travel as fds instead, and the receiver gets every tensor.
TEST_P(NotDumpableSenderTest, SendsTensorsToAPeerOfTheSameUser) {
  const Transport transport = GetParam();
  const pid_t user = fork_child([&] {
    // Root may open anyone's fds: be a plain user, as the receiver of such a daemon is.
    if (::geteuid() == 0) CHILD_CHECK(::setgid(kNobody) == 0 && ::setuid(kNobody) == 0);
    auto [tx, rx] = channel<Batch>(transport);
    const std::int64_t elements = segment_sized_elements();
    const pid_t sender = fork_child([&, &tx = tx, &rx = rx] {
      rx.detach();
      CHILD_CHECK(::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0);
      CHILD_CHECK(!detail::fds_takeable_by_peers());
      std::vector<Tensor> kept;  // sent again below: leased, not passed again
      for (std::int32_t i = 0; i < 3; ++i) {
        Batch batch{i, {filled(elements, i), filled(elements, 10 + i), filled(16, 20 + i)}};
        kept.insert(kept.end(), batch.tensors.begin(), batch.tensors.end());
        tx.send(batch);
      }
      tx.send(Batch{3, kept});
      tx.close();
    });
    tx.detach();
    for (std::int32_t i = 0; i < 3; ++i) {
      std::optional<Batch> batch = rx.recv();
      CHILD_CHECK(batch && batch->index == i && batch->tensors.size() == 3);
      CHILD_CHECK(batch->tensors[0].at<std::int32_t>({elements - 1}) == i);
      CHILD_CHECK(batch->tensors[1].at<std::int32_t>({0}) == 10 + i);
      CHILD_CHECK(batch->tensors[2].at<std::int32_t>({15}) == 20 + i);
    }
    std::optional<Batch> again = rx.recv();
    CHILD_CHECK(again && again->tensors.size() == 9 && again->tensors[8].at<std::int32_t>({0}) == 22);
    CHILD_CHECK(!rx.recv());
    CHILD_CHECK(child_succeeded(sender));
  });
  EXPECT_TRUE(child_succeeded(user));
}

// The sender's own check: dumpable processes without capabilities let peers take their fds.
TEST(FdsTakeableByPeers, FollowsTheDumpableFlag) {
  const pid_t child = fork_child([] {
    CHILD_CHECK(::prctl(PR_GET_DUMPABLE) == 1);
    CHILD_CHECK(detail::fds_takeable_by_peers());  // a test process holds capabilities only as root
    CHILD_CHECK(::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0);
    CHILD_CHECK(!detail::fds_takeable_by_peers());
    CHILD_CHECK(::prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) == 0);
    CHILD_CHECK(detail::fds_takeable_by_peers());
  });
  EXPECT_TRUE(child_succeeded(child));
}

// ---- more fds than one sendmsg carries --------------------------------------------------

// Tensors of 16 KiB from segments of 64 KiB: each has a segment of its own (larger than an
// eighth of the segment size), so each brings its own fd.
class ManySegmentsTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {};

INSTANTIATE_TEST_SUITE_P(Transports, ManySegmentsTest, ::testing::ValuesIn(test::interprocess_transports()),
                         test::transport_test_name);

// 300 tensors with segments of their own in one message (more than the 253 fds one sendmsg
// carries) pass on every transport, from dumpable and from not dumpable senders.
TEST_P(ManySegmentsTest, AMessageWithMoreNewSegmentsThanOneSendmsgCarriesArrives) {
  constexpr std::int32_t kTensors = 300;
  constexpr std::int64_t kElements = 4096;
  for (const bool dumpable : {true, false}) {
    auto [tx, rx] = channel<Batch>(GetParam());
    const pid_t sender = fork_child([&, &tx = tx, &rx = rx] {
      rx.detach();
      SharedAllocator::global().configure({std::size_t{64} << 10, 0});
      if (!dumpable) CHILD_CHECK(::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0);
      Batch batch{7, {}};
      for (std::int32_t i = 0; i < kTensors; ++i) batch.tensors.push_back(filled(kElements, i));
      CHILD_CHECK(SharedAllocator::global().stats().segments == static_cast<std::size_t>(kTensors));
      tx.send(batch);
      tx.close();
    });
    tx.detach();
    {
      std::optional<Batch> batch = rx.recv();
      ASSERT_TRUE(batch.has_value());
      ASSERT_EQ(batch->tensors.size(), static_cast<std::size_t>(kTensors));
      for (std::int32_t i = 0; i < kTensors; ++i) {
        ASSERT_EQ(batch->tensors[i].at<std::int32_t>({kElements - 1}), i) << "tensor " << i;
      }
      EXPECT_FALSE(rx.recv());
    }
    rx.close();
    EXPECT_TRUE(child_succeeded(sender)) << (dumpable ? "dumpable" : "not dumpable");
  }
}

// A peer that sends a batch of fds with every byte of a long frame: the receiver refuses it
// as soon as it holds more than the frame declares and one batch, not once it ran out of fds.
TEST(UnixSocketFdBound, ALyingPeerCannotMakeTheReceiverHoldMoreThanAFrameDeclaresAndOneBatch) {
  auto [writer, reader] = detail::make_transport(Transport::UnixSocket, FrameLimits{}, 0);
  const int raw = writer->descriptors().at(0);
  detail::FrameHeader header;
  header.segment_count = 1;
  header.fd_count = 1;
  header.body_bytes = 1000;
  ASSERT_EQ(::send(raw, &header, sizeof header, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof header));
  const std::vector<detail::UniqueFd> files = open_files(SegmentFdChannel::kMaxFdsPerMessage);
  for (int i = 0; i < 8; ++i) send_raw(raw, numbers(files), 0);  // a byte of the body and 253 fds, 8 times
  const std::size_t fds_before = count_open_fds();
  detail::FrameHeader got;
  std::vector<std::byte> payload;
  std::deque<detail::UniqueFd> fds;
  try {
    // The body never comes: a reader that does not refuse the fds as they arrive waits.
    const ReadStatus status = reader->read(got, payload, fds, detail::Deadline::after(std::chrono::seconds(2)));
    ADD_FAILURE() << "not refused: read() returned " << static_cast<int>(status) << " holding " << fds.size() << " fds";
  } catch (const ProtocolError& error) {
    EXPECT_NE(std::string(error.what()).find("refusing fds that no frame accounts for"), std::string::npos)
        << error.what();
  }
  // At most the frame's one fd and two batches arrived before the refusal (the batch that
  // broke the bound included).
  EXPECT_LE(fds.size(), 1 + 2 * SegmentFdChannel::kMaxFdsPerMessage);
  EXPECT_LE(count_open_fds(), fds_before + 1 + 2 * SegmentFdChannel::kMaxFdsPerMessage);
}

}  // namespace
}  // namespace fd_passing_test
}  // namespace ferry
