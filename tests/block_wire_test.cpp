// Storages as blocks on the wire, in one process (encoder and decoder without a
// transport): many small tensors share one segment, a new tensor in a leased segment
// travels without fds, pins follow the return board (also past a holder killed while it
// registered), hostile block entries are refused, and an isolated encoder passes only its
// pool's segments.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cereal/types/vector.hpp>
#include <cerrno>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>

#include "ferry/detail/hold_ledger.hpp"
#include "ferry/detail/message_decoder.hpp"
#include "ferry/detail/message_encoder.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"

namespace ferry {
namespace {

struct Message {
  std::vector<Tensor> tensors;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(tensors);
  }
};

// A frame as a transport would carry it: bytes, plus duplicates of the fds passed with it.
struct CapturedFrame {
  detail::FrameHeader header;
  std::vector<std::byte> payload;
  std::deque<detail::UniqueFd> fds;

  // Tables are not aligned in the payload (the type name before them has any length):
  // entries are copied out, edited and copied back.
  template <class Entry>
  void edit(std::size_t offset_in_payload, const std::function<void(Entry&)>& change) {
    Entry entry;
    std::memcpy(&entry, payload.data() + offset_in_payload, sizeof entry);
    change(entry);
    std::memcpy(payload.data() + offset_in_payload, &entry, sizeof entry);
  }
  void edit_segment(std::size_t index, const std::function<void(detail::SegmentEntry&)>& change) {
    edit<detail::SegmentEntry>(header.type_name_bytes + index * sizeof(detail::SegmentEntry), change);
  }
  // The handle table starts after the type name and the segment table.
  void edit_handle(std::size_t index, const std::function<void(detail::HandleEntry&)>& change) {
    edit<detail::HandleEntry>(header.type_name_bytes + header.segment_count * sizeof(detail::SegmentEntry) +
                                  index * sizeof(detail::HandleEntry),
                              change);
  }
  detail::HandleEntry handle(std::size_t index) {
    detail::HandleEntry entry;
    edit_handle(index, [&](detail::HandleEntry& e) { entry = e; });
    return entry;
  }
};

class FrameLoopback {
 public:
  explicit FrameLoopback(detail::HandlePassing passing = detail::HandlePassing::FdPassing,
                         std::optional<SharedAllocator> pool = std::nullopt)
      : encoder_(passing, std::move(pool)) {}

  CapturedFrame send(const Message& message) {
    const detail::EncodedFrame& frame = encoder_.encode(message);
    std::vector<std::byte> bytes;
    for (const iovec& part : frame.iovecs()) {
      const auto* begin = static_cast<const std::byte*>(part.iov_base);
      bytes.insert(bytes.end(), begin, begin + part.iov_len);
    }
    CapturedFrame wire;
    for (int fd : frame.fds) wire.fds.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    encoder_.commit();
    std::memcpy(&wire.header, bytes.data(), sizeof wire.header);
    wire.payload.assign(bytes.begin() + sizeof wire.header, bytes.end());
    return wire;
  }

  Message receive(CapturedFrame& wire) {
    detail::validate_header(wire.header, FrameLimits{});
    decoder_.decode(wire.header, wire.payload, wire.fds);
    if (decoder_.wants_acknowledgement()) encoder_.acknowledge(wire.header.sequence);
    return decoder_.read<Message>();
  }

  Message round_trip(const Message& message) {
    CapturedFrame wire = send(message);
    last_ = wire.header;
    return receive(wire);
  }

  detail::MessageEncoder encoder_;
  detail::MessageDecoder decoder_{detail::type_fingerprint<Message>(), detail::type_name<Message>()};
  detail::FrameHeader last_;
};

Message small_tensors(int count, int seed) {
  Message message;
  for (int i = 0; i < count; ++i) {
    Tensor t = Tensor::empty({1024}, DType::Int32, Device::SharedCpu);  // 4 KiB
    t.fill(std::int32_t{seed + i});
    message.tensors.push_back(t);
  }
  return message;
}

class BlockWireTest : public test::LeakCheckedTest {};

TEST_F(BlockWireTest, HundredSmallTensorsShareOneSegmentAndLaterOnesNeedNoFd) {
  FrameLoopback loop;
  {
    Message got = loop.round_trip(small_tensors(100, 0));
    EXPECT_EQ(loop.last_.handle_count, 100u);
    EXPECT_EQ(loop.last_.segment_count, 2u);  // one slab of 4 KiB blocks, and the return board
    EXPECT_EQ(loop.last_.fd_count, 2u);
    for (int i = 0; i < 100; ++i) ASSERT_EQ(got.tensors[i].at<std::int32_t>({1023}), i);
  }
  for (int round = 1; round < 5; ++round) {
    // Brand-new tensors, in recycled blocks: (segment slot, offset, size) only.
    Message got = loop.round_trip(small_tensors(100, round * 1000));
    EXPECT_EQ(loop.last_.handle_count, 100u);
    EXPECT_EQ(loop.last_.segment_count, 0u);
    EXPECT_EQ(loop.last_.fd_count, 0u);
    for (int i = 0; i < 100; ++i) ASSERT_EQ(got.tensors[i].at<std::int32_t>({0}), round * 1000 + i);
  }
  EXPECT_EQ(loop.decoder_.leased_segments(), 1u);
  EXPECT_EQ(loop.encoder_.tracked_segments(), 1u);
}

TEST_F(BlockWireTest, HundredsOfNewBlocksPerFrameGoBackTogether) {
  // Frames of 300 new tensors: their releases reach the return board in batches, several
  // bitmap words each, and the sender gives the blocks back to its pool under one lock.
  SharedAllocator pool;
  FrameLoopback loop;
  for (int round = 0; round < 4; ++round) {
    Message message;
    for (int i = 0; i < 300; ++i) {
      message.tensors.push_back(Tensor::empty({1024}, DType::Int32, pool));
      *message.tensors.back().data<std::int32_t>() = round * 1000 + i;
    }
    const Message got = loop.round_trip(message);
    ASSERT_EQ(got.tensors.size(), 300u);
    for (int i = 0; i < 300; ++i) {
      ASSERT_EQ(*got.tensors[i].data<std::int32_t>(), round * 1000 + i);
      // Sent and received in this process: the block resolves to the storage that was sent.
      ASSERT_EQ(got.tensors[i].storage(), message.tensors[i].storage());
    }
    // The previous frame's blocks were given back during this one, and are collected by the next.
    EXPECT_EQ(loop.encoder_.pinned_storages(), round == 0 ? 300u : 600u);
  }
  loop.round_trip(Message{});  // announces the releases; the receiver posts its returns
  EXPECT_EQ(loop.decoder_.leased(), 0u);
  loop.round_trip(Message{});  // collects them
  EXPECT_EQ(loop.encoder_.pinned_storages(), 0u);
  EXPECT_EQ(pool.stats().blocks_in_use, 0u);
}

TEST_F(BlockWireTest, APostBatchPostsItsSlotsToItsBoardWhenItEnds) {
  const auto board = detail::ReturnBoard::create();
  const auto other = detail::ReturnBoard::create();
  const std::vector<std::uint32_t> slots{5, 70, 3, 200, 64, 65, 6, detail::ReturnBoard::kSlots - 1, 7};
  std::vector<std::uint32_t> taken;
  {
    const detail::ReturnBoard::PostBatch batch(board.get());
    {
      const detail::ReturnBoard::PostBatch inner(board.get());  // joins the outer batch
      for (const std::uint32_t slot : slots) board->post_return(slot);
    }
    other->post_return(9);  // another board: posted at once
    board->take_returns(detail::ReturnBoard::kSlots, taken);
    EXPECT_TRUE(taken.empty());
    other->take_returns(detail::ReturnBoard::kSlots, taken);
    EXPECT_EQ(taken, std::vector<std::uint32_t>{9});
    taken.clear();
  }
  board->take_returns(detail::ReturnBoard::kSlots, taken);
  std::sort(taken.begin(), taken.end());
  std::vector<std::uint32_t> expected = slots;
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(taken, expected);
  taken.clear();
  board->post_return(5);  // after the batch: at once again
  board->take_returns(detail::ReturnBoard::kSlots, taken);
  EXPECT_EQ(taken, std::vector<std::uint32_t>{5});
}

// A receiver registers as a holder in two steps: it claims an entry with its pid marked
// "registering", then publishes its start time and clears the mark. One SIGKILLed between
// the steps leaves the mark for ever; the sender must not count it as alive for ever (its
// pins would never be reclaimed). The child writes that half-made entry itself (the layout
// of return_board.cpp: holder entries from byte 64, 16 bytes each, bit 63 of the pid word
// the mark), as the kill leaves it, into a board whose ledger pins one block.
TEST_F(BlockWireTest, HolderKilledWhileRegisteringStillLetsThePinsBeReclaimed) {
  SharedAllocator pool;
  const auto ledger = detail::HoldLedger::create();
  std::vector<detail::HoldLedger::Pin> pins{{0, pool.allocate(4096)}};
  ledger->pin(pins, 1);
  ASSERT_EQ(pool.stats().blocks_in_use, 1u);
  const int board_fd = ledger->board()->fd();
  int go[2];
  ASSERT_EQ(::pipe2(go, O_CLOEXEC), 0);
  detail::UniqueFd go_read(go[0]), go_write(go[1]);
  const pid_t child = test::fork_child([&] {
    const std::uint64_t half_registered = static_cast<std::uint64_t>(::getpid()) | std::uint64_t{1} << 63;
    CHILD_CHECK(::pwrite(board_fd, &half_registered, sizeof half_registered, 64) == sizeof half_registered);
    char byte = 0;
    CHILD_CHECK(::write(go_write.get(), &byte, 1) == 1);
    while (true) ::pause();  // killed "between the two steps"
  });
  char byte = 0;
  ASSERT_EQ(::read(go_read.get(), &byte, 1), 1);
  ASSERT_EQ(ledger->board()->holders().size(), 1u);
  EXPECT_TRUE(ledger->board()->holders()[0].registering);
  ledger->collect(true);
  EXPECT_EQ(ledger->pinned(), 1u) << "a process still registering is alive: its pins stay";
  EXPECT_EQ(ledger->board()->reclaims(), 0u);
  ::kill(child, SIGKILL);
  ASSERT_EQ(test::wait_child(child).signal, SIGKILL);
  ledger->collect(true);
  EXPECT_EQ(ledger->pinned(), 0u) << "the half-registered holder has exited: nobody holds the block";
  EXPECT_EQ(pool.stats().blocks_in_use, 0u);
  EXPECT_EQ(ledger->board()->reclaims(), 1u) << "the reclaim is counted for receivers of forwarded blocks";
  ledger->channel_closed(detail::UniqueFd());
  detail::collect_returned_blocks(false);  // forgets the finished ledger
}

// A receiver of a forwarded block registers on the board upstream and then reads its
// reclaim count: while the sender is checking its holders, the read waits for the check
// to end (or gives up after its patience), so that it sees that check's reclaim.
TEST_F(BlockWireTest, TheReclaimCountWaitsForAHolderCheckInProgress) {
  const auto board = detail::ReturnBoard::create();
  EXPECT_EQ(board->reclaims_after_checks(std::chrono::milliseconds(0)), 0u);
  board->begin_holder_check();
  EXPECT_EQ(board->reclaims_after_checks(std::chrono::milliseconds(20)), std::nullopt);
  board->end_holder_check(false);
  EXPECT_EQ(board->reclaims_after_checks(std::chrono::milliseconds(0)), 0u);
  board->begin_holder_check();
  std::thread checker([&board] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    board->end_holder_check(true);
  });
  EXPECT_EQ(board->reclaims_after_checks(std::chrono::seconds(10)), 1u);
  checker.join();
  EXPECT_EQ(board->reclaims(), 1u);
}

// The delivery doorbell (Distributor, Broadcast): the receiver rings once, when it claims
// the frame the sender asked for or a later one; a claim below it, or a request withdrawn,
// does not ring.
TEST_F(BlockWireTest, TheDeliveryDoorbellRingsOnceWhenTheAwaitedFrameIsResolved) {
  const auto board = detail::ReturnBoard::create();
  const auto rung = [](const detail::ReturnBoard::DeliveryWake& wake) {
    return std::atomic_ref<std::uint32_t>(*wake.doorbell).load() != wake.rung;
  };
  ASSERT_TRUE(board->claim_resolved(2));
  detail::ReturnBoard::DeliveryWake wake = board->request_delivery_wake(5);
  EXPECT_EQ(wake.resolved, 2u) << "the last claim, read after the request";
  ASSERT_TRUE(board->claim_resolved(4));
  EXPECT_FALSE(rung(wake)) << "frame 4 is not the awaited 5";
  ASSERT_TRUE(board->claim_resolved(6));
  EXPECT_TRUE(rung(wake)) << "frame 6 covers 5";
  const detail::ReturnBoard::DeliveryWake after = board->request_delivery_wake(0);  // no request: reads the bell only
  board->cancel_delivery_wake();
  ASSERT_TRUE(board->claim_resolved(7));
  EXPECT_FALSE(rung(after)) << "rang twice for one request";
  detail::ReturnBoard::DeliveryWake withdrawn = board->request_delivery_wake(9);
  board->cancel_delivery_wake();
  ASSERT_TRUE(board->claim_resolved(9));
  EXPECT_FALSE(rung(withdrawn)) << "rang for a withdrawn request";
  // A sleeper on the doorbell is woken by the claim (a futex wake on the shared word).
  detail::ReturnBoard::DeliveryWake awaited = board->request_delivery_wake(10);
  std::thread receiver([&board] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    (void)board->claim_resolved(10);
  });
  while (!rung(awaited)) {
    const long rc = ::syscall(SYS_futex, awaited.doorbell, FUTEX_WAIT, awaited.rung, nullptr, nullptr, 0);
    ASSERT_TRUE(rc == 0 || errno == EAGAIN || errno == EINTR) << std::strerror(errno);
  }
  receiver.join();
}

// Two processes check the holders of one board when a used Sender was handed to a forked
// worker: the parent keeps its pins (and checks them when short of memory) while the worker
// that adopted the end checks its own. One check ending must neither hide the other still
// running (a receiver registering meanwhile would read the count before that check's
// reclaim) nor lose the other's reclaim.
TEST_F(BlockWireTest, TheReclaimCountWaitsForEveryHolderCheckInProgress) {
  const auto board = detail::ReturnBoard::create();
  board->begin_holder_check();  // the parent's check: it read the holders (all dead)...
  board->begin_holder_check();  // ...the worker's check, which sees a holder registering
  board->end_holder_check(false);
  EXPECT_EQ(board->reclaims_after_checks(std::chrono::milliseconds(0)), std::nullopt)
      << "the parent's check still runs: its reclaim is yet to be counted";
  board->end_holder_check(true);
  EXPECT_EQ(board->reclaims_after_checks(std::chrono::milliseconds(0)), 1u);
  // Ending in the other order counts both outcomes too.
  board->begin_holder_check();
  board->begin_holder_check();
  board->end_holder_check(true);
  board->end_holder_check(false);
  EXPECT_EQ(board->reclaims_after_checks(std::chrono::milliseconds(0)), 2u);
  EXPECT_EQ(board->reclaims(), 2u);
}

// A board refuses a holder only while kMaxHolders living processes hold places. Every
// process a long-lived connection's blocks were forwarded to registers on its board: one
// that exited gives its place up, or the board would refuse every holder after the first
// 64 (whose forwarded blocks would then go unprotected). A living holder keeps its place.
TEST_F(BlockWireTest, ABoardRefusesHoldersOnlyWhileItsPlacesHoldLivingProcesses) {
  const auto board = detail::ReturnBoard::create();
  const detail::ProcessIdentity self = detail::current_process();
  test::LivingChildren children(detail::ReturnBoard::kMaxHolders - 1);
  EXPECT_TRUE(board->register_holder(self));
  for (const detail::ProcessIdentity& child : children.identities()) EXPECT_TRUE(board->register_holder(child));
  EXPECT_TRUE(board->register_holder(self)) << "already registered";
  const std::optional<detail::ProcessIdentity> parent = detail::identify_process(::getppid());
  ASSERT_TRUE(parent.has_value());
  EXPECT_FALSE(board->register_holder(*parent)) << "every place holds a living process";
  EXPECT_EQ(board->holders().size(), detail::ReturnBoard::kMaxHolders);
  EXPECT_TRUE(children.end());
  EXPECT_TRUE(board->register_holder(*parent)) << "an exited holder keeps its place for ever";
  const auto holders = board->holders();
  EXPECT_EQ(holders.size(), detail::ReturnBoard::kMaxHolders);
  const auto registered = [&holders](const detail::ProcessIdentity& process) {
    return std::any_of(holders.begin(), holders.end(), [&process](const auto& holder) {
      return holder.process.pid == process.pid && holder.process.start_time == process.start_time;
    });
  };
  EXPECT_TRUE(registered(*parent));
  EXPECT_TRUE(registered(self)) << "a living holder lost its place";
}

// Another object of `board` in this process, as a second connection that brought it makes.
std::shared_ptr<detail::ReturnBoard> another_object_of(const detail::ReturnBoard& board) {
  detail::UniqueFd fd(::fcntl(board.fd(), F_DUPFD_CLOEXEC, 0));
  if (!fd) throw std::runtime_error("F_DUPFD_CLOEXEC failed");
  const detail::SharedMemory::Received file = detail::SharedMemory::inspect_received(fd.get());
  return detail::ReturnBoard::open_received(
      detail::SharedMemory::map_received(std::move(fd), file, detail::ReturnBoard::bytes()));
}

// How many places of `board` hold `process`.
std::size_t places_of(const detail::ReturnBoard& board, const detail::ProcessIdentity& process) {
  const auto holders = board.holders();
  return static_cast<std::size_t>(std::count_if(holders.begin(), holders.end(), [&process](const auto& holder) {
    return holder.process.pid == process.pid && holder.process.start_time == process.start_time;
  }));
}

// A process's registration is shared by its objects of one board (one per connection that
// brought the board): a downstream one ends with the last of them; a receiver's own one, one
// kept for a forked process, and the parent's in a forked child stay (and an object the child
// inherited, dying there, takes no share of the child's own registration).
TEST_F(BlockWireTest, ADownstreamRegistrationEndsWithTheLastObjectOfItsBoardInTheProcess) {
  using Role = detail::ReturnBoard::HolderRole;
  const detail::ProcessIdentity self = detail::current_process();
  {
    const auto origin = detail::ReturnBoard::create();
    auto first = another_object_of(*origin);
    auto second = another_object_of(*origin);
    EXPECT_TRUE(first->hold_registration(Role::Downstream));
    EXPECT_TRUE(first->hold_registration(Role::Downstream));  // one share per object
    EXPECT_TRUE(second->hold_registration(Role::Downstream));
    EXPECT_EQ(places_of(*origin, self), 1u);
    first.reset();
    EXPECT_EQ(places_of(*origin, self), 1u) << "the second object still holds a share";
    second.reset();
    EXPECT_EQ(places_of(*origin, self), 0u) << "nothing that came through the board lives here";
  }
  {
    const auto origin = detail::ReturnBoard::create();
    auto own = another_object_of(*origin);
    EXPECT_TRUE(own->hold_registration(Role::Receiver));
    own.reset();
    EXPECT_EQ(places_of(*origin, self), 1u) << "a receiver stays registered, as before";
    // A place freed in front of this process's own is not taken a second time.
    const pid_t other = test::fork_child([] {});
    ASSERT_TRUE(test::child_succeeded(other));
    origin->unregister_holder(self);
    const auto exited = detail::ProcessIdentity{other, 1};
    EXPECT_TRUE(origin->register_holder(exited));
    EXPECT_TRUE(origin->register_holder(self));
    origin->unregister_holder(exited);
    EXPECT_TRUE(origin->register_holder(self));
    EXPECT_EQ(places_of(*origin, self), 1u);
  }
  {
    const auto origin = detail::ReturnBoard::create();
    auto own = another_object_of(*origin);
    auto downstream = another_object_of(*origin);
    EXPECT_TRUE(own->hold_registration(Role::Receiver));
    EXPECT_TRUE(downstream->hold_registration(Role::Downstream));  // a block that came back round
    downstream.reset();
    EXPECT_EQ(places_of(*origin, self), 1u) << "the receiver's own share still holds";
    own.reset();
    EXPECT_EQ(places_of(*origin, self), 0u);
  }
  {
    const auto origin = detail::ReturnBoard::create();
    auto handed_over = another_object_of(*origin);
    EXPECT_TRUE(handed_over->hold_registration(Role::Downstream));
    handed_over->keep_registration();
    handed_over.reset();
    EXPECT_EQ(places_of(*origin, self), 1u) << "kept for a forked process that took the blocks over";
  }
  {
    const auto origin = detail::ReturnBoard::create();
    auto inherited = another_object_of(*origin);
    EXPECT_TRUE(inherited->hold_registration(Role::Downstream));
    const pid_t child = test::fork_child([&origin, &inherited] {
      // The child registers for itself (another connection brought the board to it); the
      // object it inherited holds the parent's share, not one of the child's.
      const detail::ProcessIdentity child_self = detail::current_process();
      auto mine = another_object_of(*origin);
      CHILD_CHECK(mine->hold_registration(Role::Downstream));
      inherited.reset();
      CHILD_CHECK(places_of(*origin, child_self) == 1);  // the child's own object still holds
      mine.reset();
      CHILD_CHECK(places_of(*origin, child_self) == 0);
    });
    EXPECT_TRUE(test::child_succeeded(child));
    EXPECT_EQ(places_of(*origin, self), 1u) << "a forked child dropped the parent's registration";
  }
}

// Objects of one board come and go on several threads at once (tensors of different
// connections dying while a decoder adds the board again): whenever a thread holds an object
// with a share, the process is registered, exactly once.
TEST_F(BlockWireTest, ADownstreamRegistrationHoldsWhileAnObjectOfTheBoardLivesOnAnyThread) {
  const auto origin = detail::ReturnBoard::create();
  const detail::ProcessIdentity self = detail::current_process();
  std::atomic<int> lost{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 300; ++i) {
        auto object = another_object_of(*origin);
        if (!object->hold_registration(detail::ReturnBoard::HolderRole::Downstream) || places_of(*origin, self) != 1) {
          ++lost;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(lost.load(), 0) << "a thread held a share of a registration the process did not have";
  EXPECT_EQ(places_of(*origin, self), 0u);
}

TEST_F(BlockWireTest, RepeatedStoragesInALargeFrameShareOneEntry) {
  FrameLoopback loop;
  std::vector<Tensor> originals;
  for (int i = 0; i < 40; ++i) originals.push_back(Tensor::zeros({64}, DType::Int64, Device::SharedCpu));
  Message message;
  for (int pass = 0; pass < 3; ++pass) {
    for (int i = 0; i < 40; ++i) message.tensors.push_back(originals[(i * 7 + pass) % 40].slice(0, pass, 64));
  }
  for (int round = 0; round < 2; ++round) {
    Message got = loop.round_trip(message);
    EXPECT_EQ(loop.last_.handle_count, 40u);
    for (std::size_t i = 0; i < 120; ++i) {
      ASSERT_TRUE(got.tensors[i].shares_storage_with(got.tensors[(i + 40) % 120]) ==
                  message.tensors[i].shares_storage_with(message.tensors[(i + 40) % 120]));
    }
  }
}

TEST_F(BlockWireTest, PinsFollowTheReturnBoard) {
  SharedAllocator pool;
  FrameLoopback loop;
  Message message;
  message.tensors.push_back(Tensor::empty({256}, DType::Float32, pool));
  Message got = loop.round_trip(message);
  EXPECT_EQ(loop.encoder_.pinned_storages(), 1u);
  message.tensors.clear();
  got.tensors.clear();
  // The sender's storage died: the next frame announces the release; the receiver drops
  // its lease, its block dies and gives the slot back; the frame after that collects it.
  loop.round_trip(Message{});
  EXPECT_EQ(loop.decoder_.leased(), 0u);
  EXPECT_EQ(pool.stats().blocks_in_use, 1u);  // still pinned: the return is not read yet
  loop.round_trip(Message{});
  EXPECT_EQ(loop.encoder_.pinned_storages(), 0u);
  EXPECT_EQ(pool.stats().blocks_in_use, 0u);
}

// Runs `tamper` on a fresh frame holding one new 4 KiB block and expects the decoder to
// refuse it with a ProtocolError whose message names `field`.
void expect_refused(const std::function<void(CapturedFrame&)>& tamper, const std::string& field) {
  FrameLoopback loop;
  Message message;
  message.tensors.push_back(Tensor::zeros({1024}, DType::Int32, Device::SharedCpu));
  CapturedFrame wire = loop.send(message);
  tamper(wire);
  try {
    loop.receive(wire);
    ADD_FAILURE() << "a frame tampered in " << field << " was accepted";
  } catch (const ProtocolError& error) {
    EXPECT_NE(std::string(error.what()).find(field), std::string::npos) << error.what();
  }
  // A receiver broken by a bad frame leaves its channel; the sender sees its end gone.
  loop.encoder_.receiver_gone();
}

TEST_F(BlockWireTest, HostileBlockEntriesAreProtocolErrorsNamingTheField) {
  const std::uint64_t segment_bytes = SharedAllocator::global().settings().segment_bytes;
  // A block reaching past the end of its segment.
  expect_refused(
      [&](CapturedFrame& w) { w.edit_handle(0, [&](detail::HandleEntry& e) { e.offset = segment_bytes - 16; }); },
      "offset");
  expect_refused(
      [&](CapturedFrame& w) { w.edit_handle(0, [&](detail::HandleEntry& e) { e.nbytes = segment_bytes + 1; }); },
      "nbytes");
  // offset + nbytes overflowing 64 bits must not wrap around into the segment.
  expect_refused(
      [&](CapturedFrame& w) { w.edit_handle(0, [](detail::HandleEntry& e) { e.offset = ~std::uint64_t{0} - 8; }); },
      "offset");
  expect_refused([&](CapturedFrame& w) { w.edit_handle(0, [](detail::HandleEntry& e) { e.nbytes = 0; }); }, "nbytes");
  expect_refused([&](CapturedFrame& w) { w.edit_handle(0, [](detail::HandleEntry& e) { e.segment_slot = 7; }); },
                 "segment_slot");
  expect_refused([&](CapturedFrame& w) { w.edit_handle(0, [](detail::HandleEntry& e) { e.kind = 9; }); }, "kind");
  // A block smaller than the tensor that views it: the view check refuses it.
  expect_refused([&](CapturedFrame& w) { w.edit_handle(0, [](detail::HandleEntry& e) { e.nbytes = 64; }); },
                 "storage has only 64 bytes");
  // A segment entry claiming another size than its memfd has (entry 0 is the return board).
  expect_refused([&](CapturedFrame& w) { w.edit_segment(1, [](detail::SegmentEntry& e) { e.size += 4096; }); },
                 "bytes");
  expect_refused([&](CapturedFrame& w) { w.edit_segment(0, [](detail::SegmentEntry& e) { e.size += 4096; }); },
                 "return board");
}

TEST_F(BlockWireTest, LeasedEntryWithAnotherSizeIsRefused) {
  FrameLoopback loop;
  Message message;
  message.tensors.push_back(Tensor::zeros({1024}, DType::Int32, Device::SharedCpu));
  loop.round_trip(message);
  CapturedFrame wire = loop.send(message);
  ASSERT_EQ(wire.handle(0).kind, static_cast<std::uint32_t>(detail::HandleKind::Leased));
  wire.edit_handle(0, [](detail::HandleEntry& e) { e.nbytes = 1 << 20; });
  EXPECT_THROW(loop.receive(wire), ProtocolError);
}

TEST_F(BlockWireTest, IsolatedEncoderPassesOnlyItsPoolsSegments) {
  SharedAllocator pool;
  FrameLoopback loop(detail::HandlePassing::FdPassing, pool);
  Tensor foreign = Tensor::from({1.0, 2.0, 3.0}, Device::SharedCpu);  // global pool
  Tensor heap = Tensor::from({4.0, 5.0});
  Tensor own = Tensor::empty({2}, DType::Float64, pool);
  own.fill(6.0);
  Message message{{foreign, foreign.slice(0, 1, 3), heap, own}};
  Message got = loop.round_trip(message);
  EXPECT_EQ(loop.last_.handle_count, 3u);  // views of one storage still share one entry
  for (const Tensor& t : got.tensors) EXPECT_TRUE(pool.owns(*t.storage()->shared_block())) << t.to_string();
  EXPECT_EQ(got.tensors[0].to_vector<double>(), (std::vector<double>{1.0, 2.0, 3.0}));
  EXPECT_TRUE(got.tensors[0].shares_storage_with(got.tensors[1]));
  EXPECT_EQ(got.tensors[1].to_vector<double>(), (std::vector<double>{2.0, 3.0}));
  // The foreign storage was copied, not moved: it still lives in the global pool.
  EXPECT_TRUE(SharedAllocator::global().owns(*foreign.storage()->shared_block()));
  EXPECT_FALSE(got.tensors[0].shares_storage_with(foreign));
  // A heap storage moved into the pool in place; a pool storage travelled as itself.
  EXPECT_TRUE(pool.owns(*heap.storage()->shared_block()));
  EXPECT_EQ(got.tensors[3].storage(), own.storage());
}

}  // namespace
}  // namespace ferry
