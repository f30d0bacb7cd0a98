// Running out of resources: a receiver at its open-file limit, shared memory that cannot be
// reserved. Each limit is lowered in a forked child, which must get a ferry exception with
// a message that names the limit (never a silent drop, a hang or a signal) and must leak
// nothing once it lets go of the channel.
//
// Shared memory that is full (ENOSPC) or out of memory (ENOMEM) cannot be provoked for
// real without privileges: memfds live on the kernel's internal tmpfs, which has no size
// limit, and only a memory cgroup (root) could bound it. Those children install a seccomp
// filter that makes the reservation's fallocate(2) fail with that errno instead
// (support/syscall_fault.hpp); everything else, ferry's code path included, is real.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "ferry/detail/frame_channel.hpp"
#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/syscall_fault.hpp"
#include "support/transports.hpp"

namespace ferry {
namespace {

using test::child_succeeded;
using test::count_dev_shm_entries;
using test::count_open_fds;
using test::fork_child;

struct IndexedTensor {
  std::int64_t index = 0;
  Tensor data;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(index, data);
  }
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

// In a forked child: from now on, reserving at least `min_bytes` of shared memory fails
// with `error`, as when the kernel's shared memory is exhausted.
void fail_reservations_from(std::uint64_t min_bytes, int error) {
  const std::string why = test::fail_fallocate_from(min_bytes, error);
  if (!why.empty()) std::fprintf(stderr, "%s\n", why.c_str());
  CHILD_CHECK(why.empty());
}

const char* errno_name(int error) { return error == ENOSPC ? "ENOSPC" : error == ENOMEM ? "ENOMEM" : "?"; }

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
  auto [tx, rx] = channel<IndexedTensor>(GetParam());
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    tx.detach();
    const std::size_t own_fds = detail::EndAccess::core(rx).reader().descriptors().size();
    const std::size_t fds_before = count_open_fds();
    set_soft_limit(RLIMIT_NOFILE, nofile_limit_leaving(4));
    std::vector<IndexedTensor> held;
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
    for (const IndexedTensor& p : held) CHILD_CHECK(p.data.to_vector<std::int32_t>().back() == p.index);
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
      tx.send(IndexedTensor{i, alive.back()});
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
    release_cached_shared_memory();  // what earlier tests in this process left cached would serve the small tensor
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
// throws OutOfSharedMemory, nothing of the frame goes out, and the channel stays usable:
// a storage leased before arrives again as the same storage. (The limit leaves room for a
// slab of the caching allocator, 2 MiB, where the small tensors go, but not for the 4 MiB
// segment of the large one.)
TEST_P(ResourceLimitTest, SendThatCannotShareItsTensorFailsCleanly) {
  auto [tx, rx] = channel<IndexedTensor>(GetParam());
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    rx.close();
    tx.adopt();
    const Tensor leased = Tensor::from(std::vector<std::int32_t>(16, 7), {16}, Device::SharedCpu);
    tx.send(IndexedTensor{0, leased});
    set_soft_limit(RLIMIT_FSIZE, 3 << 20);
    Tensor heap = Tensor::zeros({4 << 20}, DType::UInt8);  // private memory: fine
    try {
      tx.send(IndexedTensor{1, heap});
      CHILD_CHECK(false);
    } catch (const OutOfSharedMemory& e) {
      CHILD_CHECK(contains(e.what(), "RLIMIT_FSIZE"));
    }
    CHILD_CHECK(!heap.is_shared());
    tx.send(IndexedTensor{2, leased});
    tx.send(IndexedTensor{3, Tensor::from(std::vector<std::int32_t>(16, 1), {16})});
    tx.close();
  });
  tx.detach();
  auto leased = rx.recv();
  ASSERT_TRUE(leased.has_value());
  EXPECT_EQ(leased->index, 0);
  // The storage leased before the failed send still arrives as the same storage.
  auto again = rx.recv();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->index, 2);
  EXPECT_EQ(again->data.storage()->id(), leased->data.storage()->id());
  EXPECT_EQ(again->data.data_ptr(), leased->data.data_ptr());
  EXPECT_EQ(again->data.to_vector<std::int32_t>().back(), 7);
  auto got = rx.recv();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->index, 3);
  EXPECT_EQ(got->data.to_vector<std::int32_t>().back(), 1);
  EXPECT_FALSE(rx.recv().has_value());
  EXPECT_TRUE(child_succeeded(child));
}

// The kernel has no room for the pages of a new segment (ENOSPC: its shared memory is
// exhausted; ENOMEM: out of memory, e.g. a memory cgroup at its limit). The tensor that
// needed it is refused with an OutOfSharedMemory that says so, the half-made segment is
// gone, and smaller segments (a slab of the caching allocator) still work. A ring that
// cannot be reserved is refused the same way when the channel is made.
TEST(SharedMemoryLimit, NoRoomForSharedMemoryIsOutOfSharedMemory) {
  FERRY_SKIP_WITHOUT_SYSCALL_FAULTS();
  for (const int error : {ENOSPC, ENOMEM}) {
    SCOPED_TRACE(errno_name(error));
    const pid_t child = fork_child([error] {
      release_cached_shared_memory();  // a refused segment first empties the cache: count from an empty one
      const std::size_t fds_before = count_open_fds();
      const std::size_t shm_before = count_dev_shm_entries();
      const std::size_t segments_before = shared_memory_stats().segments;
      fail_reservations_from(4 << 20, error);
      try {
        Tensor::zeros({8 << 20}, DType::UInt8, Device::SharedCpu);
        CHILD_CHECK(false);
      } catch (const OutOfSharedMemory& e) {
        std::fprintf(stderr, "%s\n", e.what());
        CHILD_CHECK(e.code() == error);
        CHILD_CHECK(contains(e.what(), errno_name(error)));
        CHILD_CHECK(contains(e.what(), "shared segment of 8388608 bytes"));
        CHILD_CHECK(contains(e.what(), "free memory or send smaller tensors"));
      }
      CHILD_CHECK(count_open_fds() == fds_before);  // the refused memfd is closed
      CHILD_CHECK(shared_memory_stats().segments == segments_before);

      ChannelOptions large_ring;
      large_ring.ring_capacity = 8 << 20;
      try {
        auto ends = channel<int>(Transport::ShmRing, large_ring);
        CHILD_CHECK(false);
      } catch (const OutOfSharedMemory& e) {
        std::fprintf(stderr, "%s\n", e.what());
        CHILD_CHECK(e.code() == error);
        CHILD_CHECK(contains(e.what(), errno_name(error)));
        CHILD_CHECK(contains(e.what(), "ring_capacity"));
      }
      CHILD_CHECK(count_open_fds() == fds_before);

      // Below the failing size, segments and rings still work, and their pages are there.
      {
        Tensor small = Tensor::zeros({1 << 16}, DType::UInt8, Device::SharedCpu);
        small.data<std::uint8_t>()[(1 << 16) - 1] = 1;
        auto [tx, rx] = channel<IndexedTensor>(Transport::ShmRing);
        tx.send(IndexedTensor{7, small});
        auto got = rx.recv();
        CHILD_CHECK(got.has_value() && got->index == 7);
        CHILD_CHECK(got->data.data<std::uint8_t>()[(1 << 16) - 1] == 1);
      }
      release_cached_shared_memory();
      CHILD_CHECK(count_open_fds() == fds_before);
      CHILD_CHECK(count_dev_shm_entries() == shm_before);
    });
    EXPECT_TRUE(child_succeeded(child));
  }
}

// A ring counts as a file for RLIMIT_FSIZE too: a ring larger than the limit is an
// OutOfSharedMemory naming the limit, not a process killed by SIGXFSZ.
TEST(SharedMemoryLimit, RingAboveTheFileSizeLimitIsOutOfSharedMemory) {
  const pid_t child = fork_child([] {
    CHILD_CHECK(::signal(SIGXFSZ, SIG_DFL) != SIG_ERR);
    set_soft_limit(RLIMIT_FSIZE, 1 << 20);
    const std::size_t fds_before = count_open_fds();
    try {
      auto ends = channel<int>(Transport::ShmRing);  // 1 MiB of data plus its header
      CHILD_CHECK(false);
    } catch (const OutOfSharedMemory& e) {
      std::fprintf(stderr, "%s\n", e.what());
      CHILD_CHECK(e.code() == EFBIG);
      CHILD_CHECK(contains(e.what(), "RLIMIT_FSIZE"));
      CHILD_CHECK(contains(e.what(), "ring_capacity"));
    }
    CHILD_CHECK(count_open_fds() == fds_before);
    ChannelOptions small_ring;
    small_ring.ring_capacity = 64 << 10;
    auto [tx, rx] = channel<int>(Transport::ShmRing, small_ring);
    tx.send(3);
    CHILD_CHECK(rx.recv().value() == 3);
  });
  EXPECT_TRUE(child_succeeded(child));
}

// Shared memory runs out between two sends: the send of a heap tensor that cannot be moved
// into shared memory fails with OutOfSharedMemory (ENOSPC), nothing of its frame goes out,
// and the channel's state is intact: a storage the receiver leased before still arrives as
// the same storage, and new small tensors (a slab) still travel.
TEST_P(ResourceLimitTest, SendWhenSharedMemoryIsFullFailsCleanly) {
  FERRY_SKIP_WITHOUT_SYSCALL_FAULTS();
  auto [tx, rx] = channel<IndexedTensor>(GetParam());
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    rx.close();
    tx.adopt();
    Tensor leased = Tensor::from(std::vector<std::int32_t>(16, 5), {16}, Device::SharedCpu);
    tx.send(IndexedTensor{0, leased});
    fail_reservations_from(4 << 20, ENOSPC);
    Tensor heap = Tensor::zeros({8 << 20}, DType::UInt8);  // private memory: fine
    try {
      tx.send(IndexedTensor{1, heap});
      CHILD_CHECK(false);
    } catch (const OutOfSharedMemory& e) {
      CHILD_CHECK(e.code() == ENOSPC);
      CHILD_CHECK(contains(e.what(), "ENOSPC"));
    }
    CHILD_CHECK(!heap.is_shared());
    CHILD_CHECK(tx.is_open());
    tx.send(IndexedTensor{2, leased});
    tx.send(IndexedTensor{3, Tensor::from(std::vector<std::int32_t>(16, 3), {16})});
    tx.close();
  });
  tx.detach();
  auto first = rx.recv();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->index, 0);
  auto again = rx.recv();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->index, 2) << "the refused message must not arrive";
  EXPECT_EQ(again->data.data_ptr(), first->data.data_ptr()) << "the lease of the earlier storage was lost";
  EXPECT_EQ(again->data.to_vector<std::int32_t>(), std::vector<std::int32_t>(16, 5));
  auto small = rx.recv();
  ASSERT_TRUE(small.has_value());
  EXPECT_EQ(small->index, 3);
  EXPECT_EQ(small->data.to_vector<std::int32_t>(), std::vector<std::int32_t>(16, 3));
  EXPECT_FALSE(rx.recv().has_value()) << "a clean end of stream";
  EXPECT_TRUE(child_succeeded(child));
}

}  // namespace
}  // namespace ferry
