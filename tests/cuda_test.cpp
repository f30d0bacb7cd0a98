// The CUDA parts that run without a GPU: hold-counter boards (the counters receivers release),
// the caching block pool on host memory, the checks a receiver makes on CUDA handles before
// any CUDA call, and the errors of a machine or build without CUDA. Built in every build.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "cuda_frame.hpp"
#include "ferry/cuda.hpp"
#include "ferry/detail/cuda/block_pool.hpp"
#include "ferry/detail/cuda/hold_counter_board.hpp"
#include "ferry/detail/cuda/ipc.hpp"
#include "ferry/detail/cuda_records.hpp"
#include "ferry/detail/frame_channel.hpp"
#include "ferry/detail/message_decoder.hpp"
#include "ferry/detail/message_encoder.hpp"
#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using cuda::BlockPool;
using cuda::HoldCounterBoard;
using cuda::HoldCounterBoardSet;
using cuda::HoldCounterView;

// ---- hold-counter boards --------------------------------------------------------------------

TEST(HoldCounterBoardTest, HandsOutZeroedCountersUntilFull) {
  auto board = HoldCounterBoard::create(3);
  std::uint32_t a = 99, b = 99, c = 99, d = 99;
  ASSERT_TRUE(board->acquire(a));
  ASSERT_TRUE(board->acquire(b));
  ASSERT_TRUE(board->acquire(c));
  EXPECT_FALSE(board->acquire(d));
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, 1u);
  EXPECT_EQ(c, 2u);
  board->add(b, 5);
  EXPECT_EQ(board->value(b), 5);
  board->free(b);
  ASSERT_TRUE(board->acquire(d));
  EXPECT_EQ(d, b);
  EXPECT_EQ(board->value(d), 0) << "a reused counter starts from zero";
}

TEST(HoldCounterBoardTest, ZeroIsReleasedAndAPositiveCountIsHeld) {
  auto board = HoldCounterBoard::create(4);
  std::uint32_t counter = 0;
  ASSERT_TRUE(board->acquire(counter));
  EXPECT_TRUE(board->released(counter));
  board->add(counter, 1);
  EXPECT_FALSE(board->released(counter)) << "no consumer registered yet: the frame is in flight";
  board->add(counter, -1);
  EXPECT_TRUE(board->released(counter));
}

TEST(HoldCounterBoardTest, ReceiverViewChecksTheSegmentAndReleases) {
  auto board = HoldCounterBoard::create(8);
  std::uint32_t counter = 0;
  ASSERT_TRUE(board->acquire(counter));
  board->add(counter, 2);
  const HoldCounterView view(board->storage()->shared_allocation());
  EXPECT_EQ(view.capacity(), 8u);
  view.release(counter);
  EXPECT_EQ(board->value(counter), 1);
  view.release(counter);
  EXPECT_TRUE(board->released(counter));

  // Not a board: wrong magic, too small, not shared memory.
  auto plain = Storage::allocate(4096, Device::SharedCpu, true);  // zeroed: a recycled block may hold anything
  EXPECT_THROW(HoldCounterView{plain->shared_allocation()}, ProtocolError);
  auto tiny = Storage::allocate(16, Device::SharedCpu);
  EXPECT_THROW(HoldCounterView{tiny->shared_allocation()}, ProtocolError);
  auto heap = Storage::allocate(4096, Device::Cpu);
  EXPECT_THROW(HoldCounterView{heap->shared_allocation()}, ProtocolError);
}

TEST(HoldCounterBoardTest, AConsumerKilledWhileHoldingReleasesItsCounters) {
  auto board = HoldCounterBoard::create(4);
  std::uint32_t counter = 0;
  ASSERT_TRUE(board->acquire(counter));
  board->add(counter, 1);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t consumer = test::fork_child([&] {
    // The child maps the same segment (inherited), registers as a consumer, and holds.
    const HoldCounterView view(board->storage()->shared_allocation());
    const char byte = 'r';
    CHILD_CHECK(::write(ready[1], &byte, 1) == 1);
    ::pause();
  });
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  ::close(ready[1]);
  EXPECT_FALSE(board->released(counter)) << "a live consumer holds the counter";
  EXPECT_EQ(board->live_consumers(), std::vector<pid_t>{consumer});
  ASSERT_EQ(::kill(consumer, SIGKILL), 0);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!board->released(counter) && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(board->released(counter)) << "a dead consumer must not pin the producer's memory";
  EXPECT_EQ(test::wait_child(consumer).signal, SIGKILL);
  EXPECT_TRUE(board->live_consumers().empty());
}

TEST(HoldCounterBoardTest, ASetGrowsABoardWhenFullAndKnowsItsBoards) {
  HoldCounterBoardSet set({}, 2);
  cuda::ConsumerHold a = set.acquire();
  cuda::ConsumerHold b = set.acquire();
  cuda::ConsumerHold c = set.acquire();
  EXPECT_EQ(a.board(), b.board());
  EXPECT_NE(a.board(), c.board());
  EXPECT_TRUE(set.owns(*a.board()));
  EXPECT_TRUE(set.owns(*c.board()));
  HoldCounterBoardSet other({}, 2);
  EXPECT_FALSE(other.owns(*a.board()));
  // A dropped hold gives its counter back.
  const std::uint32_t freed = b.counter();
  { cuda::ConsumerHold gone = std::move(b); }
  cuda::ConsumerHold d = set.acquire();
  EXPECT_EQ(d.board(), a.board());
  EXPECT_EQ(d.counter(), freed);
}

TEST(HoldCounterBoardTest, ExitWarningNamesConsumersThatStillHold) {
  int err[2];
  ASSERT_EQ(::pipe(err), 0);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(err[1], STDERR_FILENO);
    auto board = HoldCounterBoard::create(4);
    std::uint32_t counter = 0;
    if (!board->acquire(counter)) ::_exit(2);
    board->add(counter, 1);
    // This process registers as the consumer (alive while the warning is written).
    const HoldCounterView view(board->storage()->shared_allocation());
    static auto keep = board;  // alive at exit, as a producer's board would be
    cuda::warn_at_exit_about_outstanding_holds();
    std::exit(0);
  }
  ::close(err[1]);
  std::string text;
  char buffer[1024];
  for (ssize_t n; (n = ::read(err[0], buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<std::size_t>(n));
  ::close(err[0]);
  EXPECT_TRUE(test::wait_child(pid).exited);
  EXPECT_NE(text.find("still hold 1 CUDA storage"), std::string::npos) << text;
  EXPECT_NE(text.find(std::to_string(pid)), std::string::npos) << text;
}

// ---- the block pool, on host memory ------------------------------------------------------

// Host memory standing in for a device: counts blocks and can run out.
class HostBlocks final : public cuda::BlockSource {
 public:
  explicit HostBlocks(std::size_t budget = std::size_t{1} << 40) : budget_(budget) {}
  void* allocate(std::size_t bytes) override {
    if (bytes > budget_ - in_use_) return nullptr;
    in_use_ += bytes;
    ++blocks_;
    return ::operator new (bytes, std::align_val_t{512});
  }
  void release(void* base, std::size_t bytes) noexcept override {
    in_use_ -= bytes;
    --blocks_;
    ::operator delete (base, std::align_val_t{512});
  }
  std::size_t blocks() const { return blocks_; }
  std::size_t in_use() const { return in_use_; }

 private:
  std::size_t budget_;
  std::size_t in_use_ = 0;
  std::size_t blocks_ = 0;
};

struct PoolFixture {
  explicit PoolFixture(std::size_t budget = std::size_t{1} << 40) {
    auto owned = std::make_unique<HostBlocks>(budget);
    source = owned.get();
    pool = std::make_unique<BlockPool>(std::move(owned), 0);
  }
  HostBlocks* source;
  std::unique_ptr<BlockPool> pool;
};

const cuda::CudaAllocation& as_cuda(const std::shared_ptr<Allocation>& allocation) {
  return dynamic_cast<const cuda::CudaAllocation&>(*allocation);
}

TEST(BlockPoolTest, SmallStoragesShareABlockAtOffsets) {
  PoolFixture f;
  auto a = f.pool->allocate(4096);
  auto b = f.pool->allocate(1000);  // rounded to 1024
  auto c = f.pool->allocate(4096);
  EXPECT_EQ(f.source->blocks(), 1u);
  EXPECT_EQ(&as_cuda(a).block(), &as_cuda(b).block());
  EXPECT_EQ(as_cuda(a).offset(), 0u);
  EXPECT_EQ(as_cuda(b).offset(), 4096u);
  EXPECT_EQ(as_cuda(c).offset(), 4096u + 1024u);
  EXPECT_EQ(b->size(), 1000u) << "the storage keeps its requested size";
  EXPECT_EQ(b->data(), a->data() + 4096);
  EXPECT_EQ(as_cuda(a).block().bytes, BlockPool::kSmallBlock);
  EXPECT_EQ(b->device(), Device::Cuda(0));
  const CudaMemoryStats stats = f.pool->stats();
  EXPECT_EQ(stats.blocks, 1u);
  EXPECT_EQ(stats.reserved_bytes, BlockPool::kSmallBlock);
  EXPECT_EQ(stats.allocated_bytes, 4096u + 1024u + 4096u);
}

TEST(BlockPoolTest, BlockSizesFollowTheRequest) {
  PoolFixture f;
  auto small = f.pool->allocate(BlockPool::kSmallRequest);
  auto medium = f.pool->allocate(BlockPool::kSmallRequest + 1);
  auto large = f.pool->allocate((std::size_t{64} << 20) + 1);
  EXPECT_EQ(as_cuda(small).block().bytes, BlockPool::kSmallBlock);
  EXPECT_EQ(as_cuda(medium).block().bytes, BlockPool::kMediumBlock);
  EXPECT_EQ(as_cuda(large).block().bytes, (std::size_t{64} << 20) + BlockPool::kLargeRounding);
  EXPECT_NE(&as_cuda(small).block(), &as_cuda(medium).block());
  // A small request never lands in a large block, even one with room.
  auto another_small = f.pool->allocate(512);
  EXPECT_TRUE(as_cuda(another_small).block().small);
  EXPECT_EQ(f.pool->allocate(0)->size(), 0u);
  EXPECT_EQ(f.source->blocks(), 3u);
}

TEST(BlockPoolTest, FreedRangesMergeAndAreReused) {
  PoolFixture f;
  auto a = f.pool->allocate(4096);
  auto b = f.pool->allocate(4096);
  auto c = f.pool->allocate(4096);
  std::byte* const first = a->data();
  a.reset();
  b.reset();  // merges with a's range: 8 KiB free at offset 0
  auto d = f.pool->allocate(8192);
  EXPECT_EQ(d->data(), first);
  EXPECT_EQ(f.source->blocks(), 1u);
  d.reset();
  c.reset();
  EXPECT_EQ(f.pool->stats().allocated_bytes, 0u);
  EXPECT_EQ(f.pool->empty_cache(), BlockPool::kSmallBlock);
  EXPECT_EQ(f.source->blocks(), 0u);
}

TEST(BlockPoolTest, AStorageHeldByAReceiverWaitsInLimbo) {
  PoolFixture f;
  HoldCounterBoardSet boards;
  auto a = f.pool->allocate(4096);
  std::byte* const address = a->data();
  auto [board, counter] = std::dynamic_pointer_cast<cuda::CudaAllocation>(a)->hold_for(boards);
  board->add(counter, 1);  // a frame carried it; the receiver holds it
  a.reset();
  CudaMemoryStats stats = f.pool->stats();
  EXPECT_EQ(stats.limbo_ranges, 1u);
  EXPECT_EQ(stats.limbo_bytes, 4096u);
  auto b = f.pool->allocate(4096);
  EXPECT_NE(b->data(), address) << "memory a receiver holds must not be handed out again";
  EXPECT_EQ(f.pool->collect(), 0u);

  const HoldCounterView receiver(board->storage()->shared_allocation());
  receiver.release(counter);  // the receiver's Storage died
  EXPECT_EQ(f.pool->collect(), 4096u);
  stats = f.pool->stats();
  EXPECT_EQ(stats.limbo_ranges, 0u);
  auto c = f.pool->allocate(4096);
  EXPECT_EQ(c->data(), address);
}

TEST(BlockPoolTest, LaterFreesCollectTheLimbo) {
  PoolFixture f;
  HoldCounterBoardSet boards;
  auto a = f.pool->allocate(4096);
  auto b = f.pool->allocate(4096);
  auto [board, counter] = std::dynamic_pointer_cast<cuda::CudaAllocation>(a)->hold_for(boards);
  board->add(counter, 1);
  a.reset();
  ASSERT_EQ(f.pool->stats().limbo_ranges, 1u);
  board->add(counter, -1);
  b.reset();  // a free runs the collect step
  EXPECT_EQ(f.pool->stats().limbo_ranges, 0u);
  EXPECT_EQ(f.pool->stats().allocated_bytes, 0u);
}

TEST(BlockPoolTest, RunningShortCollectsThenEmptiesTheCacheThenReports) {
  // Room for exactly one 20 MiB block.
  PoolFixture f(BlockPool::kMediumBlock);
  HoldCounterBoardSet boards;
  auto a = f.pool->allocate(std::size_t{8} << 20);
  auto [board, counter] = std::dynamic_pointer_cast<cuda::CudaAllocation>(a)->hold_for(boards);
  board->add(counter, 1);
  auto b = f.pool->allocate(std::size_t{8} << 20);
  a.reset();  // limbo
  try {
    auto c = f.pool->allocate(std::size_t{8} << 20);
    FAIL() << "the pool has no room while a receiver holds the limbo";
  } catch (const CudaError& error) {
    EXPECT_EQ(error.code(), 2);  // cudaErrorMemoryAllocation
    EXPECT_NE(std::string(error.what()).find("out of memory on cuda:0"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("other processes still hold"), std::string::npos) << error.what();
  }
  board->add(counter, -1);                          // released, but not collected yet
  auto c = f.pool->allocate(std::size_t{8} << 20);  // collects, then fits
  EXPECT_EQ(f.source->blocks(), 1u);
  // A different size class needs a new block: the pool gives free blocks back first.
  b.reset();
  c.reset();
  auto d = f.pool->allocate(512);  // a 2 MiB block: only after the free 20 MiB one went back
  EXPECT_EQ(f.source->blocks(), 1u);
  EXPECT_TRUE(as_cuda(d).block().small);
}

// ---- builds and machines without CUDA -----------------------------------------------------

TEST(CudaAvailabilityTest, ReportsWhatItKnowsWithoutADevice) {
  if (!cuda_built()) {
    EXPECT_EQ(cuda_device_count(), 0);
    EXPECT_FALSE(cuda_available());
    EXPECT_NE(cuda_unavailable_reason().find("without CUDA"), std::string::npos);
    EXPECT_EQ(cuda_collect(), 0u);
    return;
  }
  // Asked in a child: the test process must not initialise CUDA.
  const pid_t child = test::fork_child([] {
    CHILD_CHECK(cuda_available() == cuda_unavailable_reason().empty());
    if (cuda_available()) return;
    // Without a device, allocating is a clear CudaError naming the device.
    try {
      (void)Tensor::empty({4}, DType::Float32, Device::Cuda(0));
      CHILD_CHECK(false);
    } catch (const CudaError& error) {
      CHILD_CHECK(std::string(error.what()).find("cuda:0") != std::string::npos);
    }
  });
  EXPECT_TRUE(test::child_succeeded(child));
}

TEST(CudaAvailabilityTest, ABuildWithoutCudaRefusesCudaTensors) {
  if (cuda_built()) GTEST_SKIP() << "this build has CUDA; see the GPU tests (cuda_ipc_test)";
  try {
    (void)Tensor::empty({4}, DType::Float32, Device::Cuda(0));
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("without CUDA"), std::string::npos) << error.what();
  }
  // A zero-element CUDA tensor needs no memory but still needs CUDA.
  EXPECT_THROW((void)Tensor::empty({0}, DType::Float32, Device::Cuda(0)), Error);
}

// ---- what a receiver checks before any CUDA call -----------------------------------------

struct Payload {
  Tensor tensor;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(tensor);
  }
};

// A hand-made frame for a Receiver<Payload>: handle 0 is a hold-counter board (a real memfd passed
// with the frame), handle 1 a CudaIpc entry with `record`; the tensor uses handle 1.
struct CudaFrame {
  std::shared_ptr<HoldCounterBoard> board = HoldCounterBoard::create(16);
  detail::HandleEntry entry;
  detail::CudaHandleRecord record{};
  bool with_record = true;

  CudaFrame() {
    entry.kind = static_cast<std::uint32_t>(detail::HandleKind::CudaIpc);
    entry.slot = 1;
    entry.nbytes = 4096;
    record.pid = static_cast<std::int32_t>(::getppid());
    std::memset(record.memory_handle, 0x5a, sizeof record.memory_handle);
    std::strcpy(record.pci_bus_id, "0000:00:00.0");
    record.block_id = 7;
    record.block_bytes = std::size_t{2} << 20;
    record.offset = 4096;
    record.board_index = 0;
    record.counter = 3;
  }

  // Bytes and fds of the frame: the encoder's frame for a tensor on the board (wire version
  // 3: segment table with the return board and the board's segment, then the board's block
  // as handle 0), spliced. The fds are duplicates: the encoder closes its return board's fd.
  std::pair<std::vector<std::byte>, std::vector<detail::UniqueFd>> build() const {
    detail::MessageEncoder encoder(detail::HandlePassing::FdPassing);
    const Tensor on_board = Tensor::from_storage(board->storage(), DType::Float32, {16}, {1}, 0);
    const detail::EncodedFrame& encoded = encoder.encode(Payload{on_board});
    std::vector<std::byte> plain;
    for (const iovec& part : encoded.iovecs()) {
      const auto* begin = static_cast<const std::byte*>(part.iov_base);
      plain.insert(plain.end(), begin, begin + part.iov_len);
    }
    std::vector<detail::UniqueFd> fds;
    for (const int fd : encoded.fds) fds.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    detail::FrameHeader header;
    std::memcpy(&header, plain.data(), sizeof header);
    const std::size_t table_at =
        sizeof header + header.type_name_bytes + header.segment_count * sizeof(detail::SegmentEntry);
    const std::size_t table_end = table_at + header.handle_count * sizeof(detail::HandleEntry);
    const std::size_t body_at =
        table_end + (std::size_t{header.release_count} + header.segment_release_count) * sizeof(std::uint32_t);
    std::vector<std::byte> body(plain.begin() + static_cast<std::ptrdiff_t>(body_at), plain.end());
    const std::uint32_t handle = 1;
    std::memcpy(body.data() + body.size() - sizeof handle, &handle, sizeof handle);  // last field of the tensor

    header.handle_count = 2;
    header.body_bytes = body.size() + (with_record ? sizeof record : 0);
    std::vector<std::byte> bytes(plain.begin(), plain.begin() + static_cast<std::ptrdiff_t>(table_end));
    std::memcpy(bytes.data(), &header, sizeof header);
    const auto* entry_bytes = reinterpret_cast<const std::byte*>(&entry);
    bytes.insert(bytes.end(), entry_bytes, entry_bytes + sizeof entry);
    bytes.insert(bytes.end(), plain.begin() + static_cast<std::ptrdiff_t>(table_end),
                 plain.begin() + static_cast<std::ptrdiff_t>(body_at));  // released slots (none)
    if (with_record) {
      const auto* record_bytes = reinterpret_cast<const std::byte*>(&record);
      bytes.insert(bytes.end(), record_bytes, record_bytes + sizeof record);
    }
    bytes.insert(bytes.end(), body.begin(), body.end());
    encoder.commit();
    return {std::move(bytes), std::move(fds)};
  }
};

class CudaHandleCheckTest : public test::LeakCheckedTest {
 protected:
  // Sends `frame` to a Receiver<Payload> over a Unix socket and expects a ProtocolError
  // containing `needle`, after which the receiver stays broken.
  void expect_refused(const CudaFrame& frame, const std::string& needle) {
    auto [writer, reader] = detail::make_transport(Transport::UnixSocket, FrameLimits{}, 0);
    Receiver<Payload> rx = detail::receiver_over<Payload>(std::move(reader), Transport::UnixSocket, ChannelOptions{});
    auto [bytes, owned_fds] = frame.build();
    std::vector<int> fds;
    for (const detail::UniqueFd& fd : owned_fds) fds.push_back(fd.get());
    iovec part{bytes.data(), bytes.size()};
    writer->write({&part, 1}, fds, detail::Deadline::never());
    try {
      rx.recv();
      ADD_FAILURE() << "expected a ProtocolError mentioning '" << needle << "'";
    } catch (const ProtocolError& error) {
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
    }
    EXPECT_THROW(rx.recv(), ProtocolError) << "a broken receiver keeps failing";
    rx.close();
    writer->close();
  }
};

// The codec's CUDA half is a strategy of its own, which a build without CUDA does not have.
TEST(CudaRecordsTest, TheCodecHasACudaHalfOnlyInACudaBuild) {
  EXPECT_EQ(detail::CudaRecordWriter::make(std::nullopt) != nullptr, cuda_built());
  EXPECT_EQ(detail::CudaRecordReader::make() != nullptr, cuda_built());
}

TEST_F(CudaHandleCheckTest, ABuildWithoutCudaSaysSo) {
  if (cuda_built()) GTEST_SKIP() << "this build has CUDA";
  CudaFrame frame;
  expect_refused(frame, "no CUDA support");
}

TEST_F(CudaHandleCheckTest, EveryFieldIsCheckedBeforeCudaIsCalled) {
  if (!cuda_built()) GTEST_SKIP() << "ferry was built without CUDA: CUDA handles are refused outright";
  {
    CudaFrame frame;
    frame.with_record = false;
    frame.entry.nbytes = 64;
    expect_refused(frame, "too short for the CUDA record");
  }
  {
    CudaFrame frame;
    frame.record.board_index = 1;
    expect_refused(frame, "not an earlier handle");
  }
  {
    CudaFrame frame;
    frame.record.counter = 16;
    expect_refused(frame, "uses counter 16");
  }
  {
    CudaFrame frame;
    frame.record.offset = frame.record.block_bytes - 1024;
    expect_refused(frame, "of a block of only");
  }
  {
    CudaFrame frame;
    std::memset(frame.record.pci_bus_id, 'x', sizeof frame.record.pci_bus_id);
    expect_refused(frame, "PCI bus id");
  }
  {
    CudaFrame frame;
    frame.record.pid = static_cast<std::int32_t>(::getpid());
    expect_refused(frame, "this very process");
  }
  {
    CudaFrame frame;
    frame.entry.nbytes = 0;
    expect_refused(frame, "has no bytes");
  }
  {
    CudaFrame frame;
    frame.entry.slot = detail::MessageDecoder::kMaxSlots;
    expect_refused(frame, "above the limit");
  }
  for (const std::uint32_t flags :
       {detail::kCudaRecordHasEvent | detail::kCudaRecordHasFence, std::uint32_t{4}, std::uint32_t{1} << 31}) {
    CudaFrame frame;
    frame.record.flags = flags;
    expect_refused(frame, "expected at most one of event (1) and fence (2)");
  }
  for (const std::uint64_t offset :
       {std::uint64_t{4}, cuda::kFenceBufferBytes, cuda::kFenceBufferBytes - 4, ~std::uint64_t{0}}) {
    CudaFrame frame;
    frame.record.flags = detail::kCudaRecordHasFence;
    frame.record.fence_offset = offset;
    expect_refused(frame, "must be a multiple of 8 inside it");
  }
  {
    CudaFrame frame;
    frame.record.reserved = 1;
    expect_refused(frame, "reserved field of its CUDA record (must be zero)");
  }
}

TEST_F(CudaHandleCheckTest, AHandleThatCannotBeOpenedGivesItsCountBack) {
  if (!cuda_built()) GTEST_SKIP() << "ferry was built without CUDA";
  // In a child: resolving reaches CUDA, which must not be initialised in the test process.
  // The second frame's fence is in the buffer's last word: past the checks, to CUDA.
  const pid_t child = test::fork_child([this] {
    for (const bool fence : {false, true}) {
      CudaFrame frame;
      if (fence) {
        frame.record.flags = detail::kCudaRecordHasFence;
        frame.record.fence_offset = cuda::kFenceBufferBytes - sizeof(std::uint64_t);
        frame.record.fence_value = 1;
      }
      std::uint32_t counter = 0;
      for (std::uint32_t i = 0; i <= frame.record.counter; ++i) CHILD_CHECK(frame.board->acquire(counter));
      frame.board->add(counter, 1);  // what the sender adds for the frame
      expect_refused(frame, "cannot map the CUDA storage of CUDA handle 1");
      CHILD_CHECK(frame.board->value(counter) == 0);
    }
    CHILD_CHECK(!::testing::Test::HasFailure());
  });
  EXPECT_TRUE(test::child_succeeded(child));
}

}  // namespace
}  // namespace ferry
