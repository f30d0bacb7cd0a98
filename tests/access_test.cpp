// Access: segments are owner-only, peers' credentials can be checked (SO_PEERCRED), and a
// process of another user cannot reach this process's segments through /proc. The tests
// that switch to another user need root and skip with a message otherwise.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "ferry/detail/peer_fd.hpp"
#include "ferry/detail/return_board.hpp"
#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"

namespace ferry {
namespace {

using test::child_succeeded;
using test::fork_child;

constexpr uid_t kNobody = 65534;

class AccessTest : public test::LeakCheckedTest {};

// Becomes user nobody in a forked child (after it needed root for nothing else).
void become_nobody() {
  if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) throw std::runtime_error("cannot become nobody");
}

// A listening Unix socket in the abstract namespace, unique to this process.
struct SocketListener {
  detail::UniqueFd fd;
  sockaddr_un address{};
  socklen_t length = 0;
  SocketListener() {
    fd.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) throw_errno("socket");
    address.sun_family = AF_UNIX;
    const std::string name = "ferry-access-test-" + std::to_string(::getpid());
    std::memcpy(address.sun_path + 1, name.data(), name.size());  // sun_path[0] == 0: abstract
    length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), length) != 0) throw_errno("bind");
    if (::listen(fd.get(), 4) != 0) throw_errno("listen");
  }
  // Connects from this process (in a child: that child is the peer) and keeps the socket open.
  detail::UniqueFd connect() const {
    detail::UniqueFd client(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!client || ::connect(client.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0) {
      throw_errno("connect");
    }
    return client;
  }
  detail::UniqueFd accept() const {
    detail::UniqueFd accepted(::accept4(fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!accepted) throw_errno("accept4");
    return accepted;
  }
};

TEST_F(AccessTest, SharedSegmentsAreOwnerOnly) {
  for (const std::size_t bytes : {std::size_t{1}, std::size_t{4096}, std::size_t{1} << 20}) {
    detail::SharedMemory segment = detail::SharedMemory::create(bytes);
    struct stat st {};
    ASSERT_EQ(::fstat(segment.fd(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600u) << "a segment of " << bytes << " bytes";
    EXPECT_EQ(st.st_uid, ::geteuid());
  }
  // Also a heap tensor moved into shared memory when it is sent.
  Tensor heap = Tensor::zeros({64}, DType::Float32);
  heap.share_memory();
  struct stat st {};
  ASSERT_EQ(::fstat(heap.storage()->shared_block()->segment()->fd(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  // And a connection's return board, which its receiver maps read-write.
  const auto board = detail::ReturnBoard::create();
  ASSERT_EQ(::fstat(board->fd(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST_F(AccessTest, PeerCredentialsOfASocketPairAreItsCreator) {
  int ends[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends), 0);
  detail::UniqueFd a(ends[0]), b(ends[1]);
  const PeerCredentials peer = peer_credentials(a.get());
  EXPECT_EQ(peer.pid, ::getpid());
  EXPECT_EQ(peer.uid, ::getuid());
  EXPECT_EQ(peer.gid, ::getgid());
  EXPECT_NO_THROW(require_peer_uid(b.get(), ::getuid()));
}

TEST_F(AccessTest, PeerCredentialsOfAConnectedProcess) {
  SocketListener listener;
  const pid_t child = fork_child([&] {
    detail::UniqueFd client = listener.connect();
    char byte = 0;
    CHILD_CHECK(::read(client.get(), &byte, 1) == 0);  // wait for the parent to hang up
  });
  detail::UniqueFd accepted = listener.accept();
  const PeerCredentials peer = peer_credentials(accepted.get());
  EXPECT_EQ(peer.pid, child);
  EXPECT_EQ(peer.uid, ::getuid());
  EXPECT_NO_THROW(require_peer_uid(accepted.get(), ::getuid()));
  try {
    require_peer_uid(accepted.get(), ::getuid() + 1);
    ADD_FAILURE() << "expected UntrustedPeer";
  } catch (const UntrustedPeer& error) {
    EXPECT_NE(std::string(error.what()).find("runs as user " + std::to_string(::getuid())), std::string::npos)
        << error.what();
  }
  accepted.reset();
  EXPECT_TRUE(child_succeeded(child));
}

TEST_F(AccessTest, PipesHaveNoPeerCredentials) {
  int ends[2];
  ASSERT_EQ(::pipe2(ends, O_CLOEXEC), 0);
  detail::UniqueFd read_end(ends[0]), write_end(ends[1]);
  try {
    peer_credentials(read_end.get());
    ADD_FAILURE() << "expected SystemError";
  } catch (const SystemError& error) {
    EXPECT_EQ(error.code(), ENOTSOCK);
  }
}

TEST_F(AccessTest, PeerOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a peer as another user";
  SocketListener listener;
  const pid_t child = fork_child([&] {
    become_nobody();
    detail::UniqueFd client = listener.connect();
    char byte = 0;
    CHILD_CHECK(::read(client.get(), &byte, 1) == 0);
  });
  detail::UniqueFd accepted = listener.accept();
  EXPECT_EQ(peer_credentials(accepted.get()).uid, kNobody);
  EXPECT_THROW(require_peer_uid(accepted.get(), ::getuid()), UntrustedPeer);
  accepted.reset();
  EXPECT_TRUE(child_succeeded(child));
}

// The pipe transport names segments by /proc/<pid>/fd/<n>. A process of another user
// cannot open that path: the kernel checks ptrace access to the owner of the fd table.
TEST_F(AccessTest, AnotherUserCannotOpenSegmentsThroughProc) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a process as another user";
  Tensor t = Tensor::zeros({1024}, DType::Float32, Device::SharedCpu);
  const std::string path =
      "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(t.storage()->shared_block()->segment()->fd());
  const pid_t child = fork_child([&] {
    become_nobody();
    errno = 0;
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    CHILD_CHECK(fd < 0);
    CHILD_CHECK(errno == EACCES || errno == EPERM);
  });
  EXPECT_TRUE(child_succeeded(child));
}

// The receiver first tries pidfd_getfd, which needs ptrace attach rights over the sender:
// refused to another user as well, and the /proc fallback is refused too.
TEST_F(AccessTest, AnotherUserCannotTakeSegmentsWithPidfdGetfd) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a process as another user";
  Tensor t = Tensor::zeros({1024}, DType::Float32, Device::SharedCpu);
  const int fd = t.storage()->shared_block()->segment()->fd();
  const pid_t owner = ::getpid();
  const pid_t child = fork_child([&] {
    become_nobody();
    detail::PeerFdOpener opener;
    const std::uint64_t fallbacks = detail::PeerFdOpener::fallback_count();
    detail::PeerFdOpener::Taken taken = opener.take(owner, fd);
    CHILD_CHECK(!taken.fd);
    CHILD_CHECK(taken.method == detail::PeerFdOpener::Method::ProcPath);  // pidfd_getfd refused first
    CHILD_CHECK(taken.error == EACCES || taken.error == EPERM);
    CHILD_CHECK(detail::PeerFdOpener::fallback_count() == fallbacks + 1);
    CHILD_CHECK(!opener.exited(owner, std::chrono::milliseconds(0)));
  });
  EXPECT_TRUE(child_succeeded(child));
}

}  // namespace
}  // namespace ferry
