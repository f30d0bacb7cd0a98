// Running out of resources: a receiver at its open-file limit, shared memory that cannot be
// reserved. Each limit is lowered in a forked child, which must get a ferry exception with
// a message that names the limit (never a silent drop, a hang or a signal) and must leak
// nothing once it lets go of the channel.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/transports.hpp"

namespace ferry {
namespace {

using test::child_succeeded;
using test::count_open_fds;
using test::fork_child;

struct Payload {
  std::int64_t index = 0;
  Tensor data;
  template <class Archive>
  void serialize(Archive& ar) { ar(index, data); }
};

// The RLIMIT_NOFILE value that leaves exactly `free` descriptor numbers for new fds: the
// limit bounds the numbers of new fds (which take the lowest free numbers), not the count,
// and fds already open above it stay usable.
rlim_t nofile_limit_leaving(int free) {
  int fd = 0;
  for (int found = 0;; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF && ++found == free) break;
  }
  return static_cast<rlim_t>(fd + 1);
}

void set_soft_limit(int resource, rlim_t value) {
  rlimit limit{};
  if (::getrlimit(resource, &limit) != 0) throw std::runtime_error("getrlimit failed");
  limit.rlim_cur = value;
  if (::setrlimit(resource, &limit) != 0) throw std::runtime_error("setrlimit failed");
}

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

class ResourceLimitTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {};

INSTANTIATE_TEST_SUITE_P(Transports, ResourceLimitTest, ::testing::ValuesIn(test::interprocess_transports()),
                         test::transport_test_name);

// Every message brings a new segment (its tensor is too large for a slab of the caching
// allocator, so it gets a segment of its own), and the receiver keeps every message: each
// held segment is one more open fd, until the receiver reaches RLIMIT_NOFILE. Over a Unix
// socket the kernel then drops the fds of the next frame (MSG_CTRUNC); over a pipe the
// open() of /proc/<pid>/fd/<n> fails with EMFILE. Either way: a clear error, then nothing
// held open once the receiver lets go.
TEST_P(ResourceLimitTest, ReceiverAtItsOpenFileLimitGetsAClearError) {
  auto [tx, rx] = channel<Payload>(GetParam());
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    tx.detach();
    const std::size_t own_fds = rx.core().reader().descriptors().size();
    const std::size_t fds_before = count_open_fds();
    set_soft_limit(RLIMIT_NOFILE, nofile_limit_leaving(4));
    std::vector<Payload> held;
    std::string error;
    try {
      while (auto message = rx.recv()) held.push_back(std::move(*message));
    } catch (const ProtocolError& e) {
      error = e.what();
    }
    std::fprintf(stderr, "receiver at its fd limit after %zu messages: %s\n", held.size(), error.c_str());
    CHILD_CHECK(contains(error, "RLIMIT_NOFILE"));
    CHILD_CHECK(!held.empty() && held.size() <= 4);
    // The messages that arrived are intact.
    for (const Payload& p : held) CHILD_CHECK(p.data.to_vector<std::int32_t>().back() == p.index);
    try {
      rx.recv();
      CHILD_CHECK(false);
    } catch (const ProtocolError& e) {
      CHILD_CHECK(contains(e.what(), "broken"));
    }
    held.clear();
    rx.close();
    CHILD_CHECK(count_open_fds() == fds_before - own_fds);
  });
  rx.close();
  // Larger than the largest slab block (an eighth of a slab): a segment per tensor.
  const std::size_t elements = SharedAllocator::global().settings().segment_bytes / 8 / sizeof(std::int32_t) + 1024;
  std::vector<Tensor> alive;
  try {
    for (std::int32_t i = 0; i < 64; ++i) {
      alive.push_back(Tensor::from(std::vector<std::int32_t>(elements, i), {static_cast<std::int64_t>(elements)},
                                   Device::SharedCpu));
      tx.send(Payload{i, alive.back()});
    }
  } catch (const ChannelClosed&) {
    // The receiver gave up: expected once it is out of fds.
  }
  tx.close();
  EXPECT_TRUE(child_succeeded(child));
}

// RLIMIT_FSIZE applies to memfds: a segment larger than the limit cannot be created. The
// kernel would also send SIGXFSZ (default action: kill); ferry checks the limit first, so
// the child, which keeps the default action, must survive with an OutOfSharedMemory.
TEST(SharedMemoryLimit, SegmentAboveTheFileSizeLimitIsOutOfSharedMemory) {
  const pid_t child = fork_child([] {
    CHILD_CHECK(::signal(SIGXFSZ, SIG_DFL) != SIG_ERR);
    set_soft_limit(RLIMIT_FSIZE, 1 << 20);
    const std::size_t fds_before = count_open_fds();
    try {
      Tensor::zeros({4 << 20}, DType::UInt8, Device::SharedCpu);
      CHILD_CHECK(false);
    } catch (const OutOfSharedMemory& e) {
      std::fprintf(stderr, "%s\n", e.what());
      CHILD_CHECK(contains(e.what(), "RLIMIT_FSIZE"));
      CHILD_CHECK(e.code() == EFBIG);
    }
    // Below the limit, segments still work.
    Tensor small = Tensor::zeros({1 << 19}, DType::UInt8, Device::SharedCpu);
    small.data<std::uint8_t>()[(1 << 19) - 1] = 1;
    CHILD_CHECK(count_open_fds() == fds_before + 1);
  });
  EXPECT_TRUE(child_succeeded(child));
}

// A heap tensor is moved into shared memory when it is sent; when that fails, send()
// throws OutOfSharedMemory, nothing of the frame goes out, and the channel stays usable.
// (The limit leaves room for a slab of the caching allocator, 2 MiB, where the small
// tensor of the second send goes, but not for the 4 MiB segment of the large one.)
TEST_P(ResourceLimitTest, SendThatCannotShareItsTensorFailsCleanly) {
  auto [tx, rx] = channel<Payload>(GetParam());
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    rx.close();
    tx.adopt();
    set_soft_limit(RLIMIT_FSIZE, 3 << 20);
    Tensor heap = Tensor::zeros({4 << 20}, DType::UInt8);  // private memory: fine
    try {
      tx.send(Payload{0, heap});
      CHILD_CHECK(false);
    } catch (const OutOfSharedMemory& e) {
      CHILD_CHECK(contains(e.what(), "RLIMIT_FSIZE"));
    }
    CHILD_CHECK(!heap.is_shared());
    tx.send(Payload{1, Tensor::from(std::vector<std::int32_t>(16, 1), {16})});
    tx.close();
  });
  tx.detach();
  auto got = rx.recv();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->index, 1);
  EXPECT_EQ(got->data.to_vector<std::int32_t>().back(), 1);
  EXPECT_FALSE(rx.recv().has_value());
  EXPECT_TRUE(child_succeeded(child));
}

}  // namespace
}  // namespace ferry
