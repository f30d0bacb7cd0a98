// The shared-memory ring transport between real processes: ordering and integrity of many
// frames of random sizes (around the wrap point and the capacity, and larger than the
// ring), large bodies serialized into lent ring space, back-pressure, corrupted shared
// state, dead peers, idle CPU use, and rebuilding an end from its descriptors.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>

#include "ferry/detail/frame_channel.hpp"
#include "ferry/detail/mapping.hpp"
#include "ferry/ferry.hpp"
#include "ring/ring_transport.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::child_succeeded;
using test::fork_child;
using Bytes = std::vector<std::uint8_t>;
using Numbered = std::pair<std::uint64_t, Bytes>;

class RingTest : public test::LeakCheckedTest {};

// Sanitizers slow the long tests down about tenfold; they run fewer frames there.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr int kFrameScale = 10;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
constexpr int kFrameScale = 10;
#else
constexpr int kFrameScale = 1;
#endif
#else
constexpr int kFrameScale = 1;
#endif

ChannelOptions ring_options(std::size_t capacity, std::chrono::nanoseconds spin = default_ring_spin()) {
  ChannelOptions options;
  options.ring_capacity = capacity;
  options.ring_spin = spin;
  return options;
}

// The shared header of the ring behind `reader`, mapped a second time, as another process
// scribbling in the segment would see it.
struct MappedHeader {
  explicit MappedHeader(detail::FrameReader& reader, std::size_t capacity)
      : mapping(detail::Mapping::map_shared(reader.descriptors().at(0), kRingHeaderBytes + capacity)) {}
  RingHeader& header() const { return *static_cast<RingHeader*>(mapping.data()); }
  std::byte* data() const { return static_cast<std::byte*>(mapping.data()) + kRingHeaderBytes; }
  detail::Mapping mapping;
};

std::uint8_t pattern(std::uint64_t index, std::size_t offset) {
  return static_cast<std::uint8_t>(index * 31 + offset * 7);
}

// `size` bytes of pattern(index, 0...): it repeats every 256 offsets (7 * 256 is 0 mod 256),
// so one period is computed and copied, which keeps the long tests quick in the -O0 build.
Bytes patterned(std::uint64_t index, std::size_t size) {
  std::uint8_t period[256];
  const std::size_t period_bytes = std::min<std::size_t>(size, sizeof period);
  for (std::size_t j = 0; j < period_bytes; ++j) period[j] = pattern(index, j);
  Bytes bytes(size);
  for (std::size_t at = 0; at < size; at += period_bytes) {
    std::memcpy(bytes.data() + at, period, std::min(period_bytes, size - at));
  }
  return bytes;
}

// Message sizes that put frames around the capacity and the wrap point, and beyond the ring.
std::size_t pick_size(std::mt19937_64& rng, std::size_t capacity) {
  const auto roll = rng() % 100;
  if (roll < 60) return rng() % 200;                   // small frames
  if (roll < 80) return capacity - 128 + rng() % 256;  // around the capacity
  if (roll < 95) return rng() % capacity;              // anywhere inside
  return capacity + rng() % (2 * capacity);            // larger than the ring
}

// The receiving child regenerates the sender's sizes from the same seed and checks every byte.
void random_frames_round_trip(std::chrono::nanoseconds spin, int count) {
  constexpr std::size_t kCapacity = 8192;
  constexpr std::uint64_t kSeed = 20261130;
  auto [tx, rx] = channel<Numbered>(Transport::ShmRing, ring_options(kCapacity, spin));
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    tx.detach();
    std::mt19937_64 rng(kSeed);
    for (int i = 0; i < count; ++i) {
      auto got = rx.recv();
      CHILD_CHECK(got.has_value());
      CHILD_CHECK(got->first == static_cast<std::uint64_t>(i));
      CHILD_CHECK(got->second == patterned(static_cast<std::uint64_t>(i), pick_size(rng, kCapacity)));
    }
    CHILD_CHECK(!rx.recv().has_value());
  });
  rx.close();
  std::mt19937_64 rng(kSeed);
  Numbered message;
  for (int i = 0; i < count; ++i) {
    message.first = static_cast<std::uint64_t>(i);
    message.second = patterned(static_cast<std::uint64_t>(i), pick_size(rng, kCapacity));
    tx.send(message);
  }
  tx.close();
  EXPECT_TRUE(child_succeeded(child, 120s));
}

// 200 000 frames: a bounded stand-in for "millions" (about a second on two idle cores,
// several when other work shares them).
TEST_F(RingTest, RandomSizedFramesArriveInOrderAndIntactWhileSpinning) {
  random_frames_round_trip(default_ring_spin(), 200'000 / kFrameScale);
}

// The same with no spinning at all: every wait goes through the futex.
TEST_F(RingTest, RandomSizedFramesArriveInOrderAndIntactWhenSleeping) {
  random_frames_round_trip(std::chrono::nanoseconds::zero(), 50'000 / kFrameScale);
}

TEST_F(RingTest, FrameMuchLargerThanTheRingStreamsThrough) {
  auto [tx, rx] = channel<Bytes>(Transport::ShmRing, ring_options(4096));
  Bytes big(16 << 20);
  for (std::size_t j = 0; j < big.size(); ++j) big[j] = pattern(7, j);
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    tx.detach();
    auto got = rx.recv();
    CHILD_CHECK(got.has_value());
    CHILD_CHECK(*got == big);
    CHILD_CHECK(!rx.recv().has_value());
  });
  rx.close();
  tx.send(big);
  tx.close();
  EXPECT_TRUE(child_succeeded(child));
}

TEST_F(RingTest, FullRingBlocksTheSenderAndNothingIsOverwritten) {
  constexpr std::size_t kCapacity = 4096;
  constexpr int kCount = 200;
  auto [tx, rx] = channel<Numbered>(Transport::ShmRing, ring_options(kCapacity));
  // The child reports how many sends returned, in memory shared with this process.
  void* shared = ::mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  auto* sent = new (shared) std::atomic<int>(0);
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    rx.close();
    tx.adopt();
    for (int i = 0; i < kCount; ++i) {
      tx.send(Numbered{static_cast<std::uint64_t>(i), Bytes(1000, pattern(i, 0))});
      sent->store(i + 1);
    }
    tx.close();
  });
  tx.detach();
  std::this_thread::sleep_for(200ms);
  // Nobody read yet: at most what fits in the ring went out (about 4 frames of ~1 KiB).
  EXPECT_LE(sent->load(), 5);
  for (int i = 0; i < kCount; ++i) {
    auto got = rx.recv();
    ASSERT_TRUE(got.has_value());
    ASSERT_EQ(got->first, static_cast<std::uint64_t>(i));
    ASSERT_EQ(got->second, Bytes(1000, pattern(i, 0)));
  }
  EXPECT_FALSE(rx.recv().has_value());
  EXPECT_TRUE(child_succeeded(child));
  EXPECT_EQ(sent->load(), kCount);
  ::munmap(shared, sizeof(std::atomic<int>));
}

// Fills a ring of kCapacity bytes that nobody reads until exactly `leftover` bytes are free
// (fewer than the smallest message frame needs), then closes the sender with `linger`;
// returns how long close() took and how many values were sent.
struct ClosedFullRing {
  std::chrono::steady_clock::duration close_took;
  int sent = 0;
};
ClosedFullRing close_a_ring_filled_to(Sender<Bytes>& tx, Receiver<Bytes>& rx, std::size_t capacity,
                                      std::size_t leftover) {
  MappedHeader mapped(detail::EndAccess::core(rx).reader(), capacity);
  const auto free_bytes = [&] { return capacity - (mapped.header().tail.load() - mapped.header().head.load()); };
  ClosedFullRing result;
  tx.send(Bytes{});  // the first frame also carries the type name
  const std::size_t before = free_bytes();
  tx.send(Bytes{});
  const std::size_t smallest = before - free_bytes();  // header and an empty body
  result.sent = 2;
  while (free_bytes() - leftover >= 2 * smallest) {
    tx.send(Bytes{});
    ++result.sent;
  }
  tx.send(Bytes(free_bytes() - leftover - smallest, 7));  // a body n bytes longer: a frame n bytes longer
  ++result.sent;
  EXPECT_EQ(free_bytes(), leftover);
  EXPECT_GT(smallest, leftover);
  EXPECT_FALSE(tx.send_for(Bytes{}, 0ms)) << "the ring has room for a message";
  const auto start = std::chrono::steady_clock::now();
  tx.close();
  result.close_took = std::chrono::steady_clock::now() - start;
  EXPECT_FALSE(tx.is_open());
  return result;
}

// close() waits (at most close_linger) only when the end-of-stream frame itself, a bare
// 56-byte header, does not fit: a ring too full for any message may still take it, and
// then the stream ends cleanly at once.
TEST_F(RingTest, CloseOfARingWithRoomForTheEndOfStreamEndsItCleanlyAtOnce) {
  constexpr std::size_t kCapacity = 4096;
  ChannelOptions options = ring_options(kCapacity);
  options.close_linger = 10s;
  auto [tx, rx] = channel<Bytes>(Transport::ShmRing, options);
  const ClosedFullRing closed = close_a_ring_filled_to(tx, rx, kCapacity, sizeof(detail::FrameHeader));
  EXPECT_LT(closed.close_took, 5s) << "close() waited although the end of the stream fitted";
  for (int i = 0; i < closed.sent; ++i) ASSERT_TRUE(rx.recv().has_value());
  EXPECT_FALSE(rx.recv().has_value());
}

TEST_F(RingTest, CloseOfARingWithoutRoomForTheEndOfStreamLingersThenGivesThePeerPeerDied) {
  constexpr std::size_t kCapacity = 4096;
  ChannelOptions options = ring_options(kCapacity);
  options.close_linger = 100ms;
  options.peer_check_interval = 5ms;
  auto [tx, rx] = channel<Bytes>(Transport::ShmRing, options);
  const ClosedFullRing closed = close_a_ring_filled_to(tx, rx, kCapacity, sizeof(detail::FrameHeader) - 1);
  EXPECT_GE(closed.close_took, 100ms) << "close() gave up before close_linger";
  EXPECT_LT(closed.close_took, 5s);
  for (int i = 0; i < closed.sent; ++i) ASSERT_TRUE(rx.recv().has_value());
  try {
    (void)rx.recv();
    ADD_FAILURE() << "a clean end of stream from a close() that found no room for it";
  } catch (const PeerDied& error) {
    EXPECT_NE(std::string(error.what()).find("close_linger"), std::string::npos) << error.what();
  }
}

TEST_F(RingTest, SendForGivesUpOnAFullRingAndResumesWhenThereIsRoom) {
  auto [tx, rx] = channel<Bytes>(Transport::ShmRing, ring_options(4096));
  int accepted = 0;
  while (tx.send_for(Bytes(500, 9), 10ms)) ++accepted;
  EXPECT_GE(accepted, 7);  // 4 KiB holds seven 500-byte messages with their headers
  EXPECT_LE(accepted, 8);
  auto first = rx.recv_for(1s);
  ASSERT_TRUE(first);
  EXPECT_EQ(*first, Bytes(500, 9));
  EXPECT_TRUE(tx.send_for(Bytes(500, 10), 1s));
  for (int i = 1; i < accepted; ++i) ASSERT_TRUE(rx.recv_for(1s)) << i;
  auto last = rx.recv_for(1s);
  ASSERT_TRUE(last);
  EXPECT_EQ(*last, Bytes(500, 10));
  EXPECT_TRUE(rx.try_recv().timed_out());
}

TEST_F(RingTest, TimedSendOfAFrameLargerThanTheRingIsNeverHalfSent) {
  auto [tx, rx] = channel<Bytes>(Transport::ShmRing, ring_options(4096));
  Bytes big(20000);
  for (std::size_t j = 0; j < big.size(); ++j) big[j] = pattern(3, j);
  // Accepted: the first part went out; the rest waits in the writer.
  ASSERT_TRUE(tx.send_for(big, 20ms));
  EXPECT_TRUE(rx.recv_for(20ms).timed_out());  // only part of it is in the ring
  std::thread flusher([&tx = tx] { EXPECT_TRUE(tx.flush(10s)); });
  auto got = rx.recv_for(10s);
  flusher.join();
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, big);
}

// ---- large bodies serialized straight into the ring --------------------------------------

// Frames written around a body in lent ring space, at the transport level: `name_bytes`
// of type name make the header and tables exactly 56 + name_bytes long.
struct LentFrame {
  detail::FrameHeader header;
  std::vector<char> name;
};

LentFrame lent_frame(std::size_t name_bytes, std::size_t body_bytes) {
  LentFrame frame;
  frame.header.flags = detail::kFrameHasTypeName;
  frame.header.type_name_bytes = static_cast<std::uint32_t>(name_bytes);
  frame.header.body_bytes = body_bytes;
  frame.name.resize(name_bytes);
  for (std::size_t i = 0; i < name_bytes; ++i) frame.name[i] = static_cast<char>('a' + i % 26);
  return frame;
}

// Reads one frame and checks its type name and body (pattern `seed`).
void expect_lent_frame(detail::FrameReader& reader, std::size_t name_bytes, std::size_t body_bytes,
                       std::uint64_t seed) {
  detail::FrameHeader header;
  std::span<const std::byte> payload;
  std::vector<std::byte> buffer;
  std::deque<detail::UniqueFd> fds;
  ASSERT_EQ(reader.read_view(header, payload, buffer, fds, detail::Deadline::after(10s)), ReadStatus::Frame);
  ASSERT_EQ(header.type_name_bytes, name_bytes);
  ASSERT_EQ(payload.size(), name_bytes + body_bytes);
  for (std::size_t i = 0; i < name_bytes; ++i) {
    ASSERT_EQ(static_cast<char>(payload[i]), static_cast<char>('a' + i % 26)) << i;
  }
  for (std::size_t i = 0; i < body_bytes; ++i) {
    ASSERT_EQ(static_cast<std::uint8_t>(payload[name_bytes + i]), pattern(seed, i)) << i;
  }
  reader.release();
}

// Lends space for a body of `body_bytes`, fills it and writes the frame around it.
bool write_lent_frame(detail::FrameWriter& writer, std::size_t name_bytes, std::size_t body_bytes, std::uint64_t seed,
                      const detail::Deadline& deadline = detail::Deadline::never()) {
  detail::BodySpace* space = writer.body_space(deadline);
  EXPECT_NE(space, nullptr);
  if (space == nullptr) return false;
  const std::span<std::byte> lent = space->lend(body_bytes);
  EXPECT_GE(lent.size(), body_bytes);
  if (lent.size() < body_bytes) return false;
  for (std::size_t i = 0; i < body_bytes; ++i) lent[i] = static_cast<std::byte>(pattern(seed, i));
  LentFrame frame = lent_frame(name_bytes, body_bytes);
  std::vector<iovec> parts{{&frame.header, sizeof frame.header}};
  if (name_bytes > 0) parts.push_back({frame.name.data(), name_bytes});
  parts.push_back({lent.data(), body_bytes});
  return writer.write(parts, {}, deadline);
}

// Every size of header and tables in front of a lent body: a gap record before them
// (prefixes up to kRingBodyOffset - 16 bytes, and exactly kRingBodyOffset: no gap), a gap
// too short for a record (the body moves back behind them), and more than was reserved
// (the body moves forward). Frames of about a third of the ring wrap around it often.
TEST_F(RingTest, HeaderAndTablesOfAnySizeGoInFrontOfALentBodyAcrossTheWrapPoint) {
  constexpr std::size_t kCapacity = 64 << 10;
  auto [writer, reader] = detail::make_transport(Transport::ShmRing, FrameLimits{}, kCapacity);
  const std::size_t header = sizeof(detail::FrameHeader);
  const std::size_t names[] = {0,
                               1,
                               kRingBodyOffset - header - 16,
                               kRingBodyOffset - header - 15,
                               kRingBodyOffset - header - 8,
                               kRingBodyOffset - header - 1,
                               kRingBodyOffset - header,
                               kRingBodyOffset - header + 1,
                               3000};
  std::uint64_t seed = 0;
  for (int round = 0; round < 6; ++round) {
    for (const std::size_t name : names) {
      const std::size_t body = 20'000 + 333 * static_cast<std::size_t>(round);
      ASSERT_TRUE(write_lent_frame(*writer, name, body, ++seed));
      expect_lent_frame(*reader, name, body, seed);
    }
  }
}

TEST_F(RingTest, LentBodyWhoseHeaderNoLongerFitsWaitsForRoomAndArrivesIntact) {
  constexpr std::size_t kCapacity = 64 << 10;
  constexpr std::size_t kBody = 30'000;
  auto [writer, reader] = detail::make_transport(Transport::ShmRing, FrameLimits{}, kCapacity);
  // A first frame, unread (its body lent too: it takes kRingBodyOffset + its body), leaves
  // room for the lent body and 100 bytes more: a 3000-byte header and tables do not fit in
  // front of the body, nor does the body move forward.
  constexpr std::size_t kFirst = kCapacity - kRingBodyOffset - (kRingBodyOffset + kBody + 100);
  ASSERT_TRUE(write_lent_frame(*writer, 0, kFirst, 1));
  EXPECT_FALSE(write_lent_frame(*writer, 3000, kBody, 2, detail::Deadline::after(20ms)));  // nothing went out
  std::thread drain([&reader = reader] {
    std::this_thread::sleep_for(50ms);
    expect_lent_frame(*reader, 0, kFirst, 1);
  });
  EXPECT_TRUE(write_lent_frame(*writer, 3000, kBody, 3));  // waits for the first to be read
  drain.join();
  expect_lent_frame(*reader, 3000, kBody, 3);
}

TEST_F(RingTest, LargeMessageIsSerializedIntoTheRingBehindAGap) {
  constexpr std::size_t kCapacity = 1 << 20;
  auto [tx, rx] = channel<Bytes>(Transport::ShmRing, ring_options(kCapacity));
  MappedHeader watcher(detail::EndAccess::core(rx).reader(), kCapacity);
  Bytes big(100'000);
  for (std::size_t j = 0; j < big.size(); ++j) big[j] = pattern(5, j);
  tx.send(big);
  RingSkip skip;
  std::memcpy(&skip, watcher.data(), sizeof skip);
  EXPECT_EQ(skip.magic, kRingSkipMagic);
  // The body (a size, then the bytes) ends the frame and starts kRingBodyOffset in.
  EXPECT_EQ(watcher.header().tail.load(), kRingBodyOffset + 8 + big.size());
  EXPECT_EQ(std::memcmp(watcher.data() + kRingBodyOffset + 8, big.data(), big.size()), 0);
  // A small message goes in as before: right behind, no gap.
  tx.send(Bytes(100, 3));
  EXPECT_EQ(watcher.header().tail.load(), kRingBodyOffset + 8 + big.size() + sizeof(detail::FrameHeader) + 8 + 100);
  EXPECT_EQ(rx.recv().value(), big);
  EXPECT_EQ(rx.recv().value(), Bytes(100, 3));
}

// Messages of many chunks: small ones, large ones serialized into the ring, ones that
// outgrow the ring while being serialized (the body moves back into private memory) and
// ones larger than the ring. The child checks every byte.
using Chunked = std::pair<std::uint64_t, std::vector<Bytes>>;

std::vector<std::size_t> pick_chunks(std::mt19937_64& rng, std::size_t capacity) {
  const auto roll = rng() % 100;
  if (roll < 30) return {rng() % 300};
  if (roll < 70) return {detail::FrameBody::kLendFrom + rng() % (capacity / 2)};
  if (roll < 90) return std::vector<std::size_t>(1 + rng() % 12, 4096 + rng() % 4096);
  return {capacity + rng() % capacity};
}

TEST_F(RingTest, LargeBodiesOfEveryKindArriveInOrderAndIntact) {
  constexpr std::size_t kCapacity = 64 << 10;
  constexpr std::uint64_t kSeed = 99;
  const int count = 3000 / kFrameScale;
  auto [tx, rx] = channel<Chunked>(Transport::ShmRing, ring_options(kCapacity));
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    tx.detach();
    std::mt19937_64 rng(kSeed);
    for (int i = 0; i < count; ++i) {
      auto got = rx.recv();
      CHILD_CHECK(got.has_value());
      CHILD_CHECK(got->first == static_cast<std::uint64_t>(i));
      const std::vector<std::size_t> sizes = pick_chunks(rng, kCapacity);
      CHILD_CHECK(got->second.size() == sizes.size());
      for (std::size_t c = 0; c < sizes.size(); ++c) {
        CHILD_CHECK(got->second[c].size() == sizes[c]);
        for (std::size_t j = 0; j < sizes[c]; ++j) CHILD_CHECK(got->second[c][j] == pattern(i + c, j));
      }
    }
    CHILD_CHECK(!rx.recv().has_value());
  });
  rx.close();
  std::mt19937_64 rng(kSeed);
  for (int i = 0; i < count; ++i) {
    Chunked message{static_cast<std::uint64_t>(i), {}};
    for (const std::size_t size : pick_chunks(rng, kCapacity)) {
      Bytes chunk(size);
      for (std::size_t j = 0; j < size; ++j) chunk[j] = pattern(i + message.second.size(), j);
      message.second.push_back(std::move(chunk));
    }
    tx.send(message);
  }
  tx.close();
  EXPECT_TRUE(child_succeeded(child, 120s));
}

// A message whose serialization kills its own process half-way, after its large first
// part went into lent ring space.
bool g_die_while_serializing = false;

struct DiesWhileSerialized {
  Bytes payload;
  std::uint8_t end = 1;
  template <class Archive>
  void save(Archive& ar) const {
    ar(payload);
    if (g_die_while_serializing) ::raise(SIGKILL);
    ar(end);
  }
  template <class Archive>
  void load(Archive& ar) {
    ar(payload, end);
  }
};

TEST_F(RingTest, SenderKilledWhileSerializingIntoTheRingIsPeerDiedNeverAMessage) {
  constexpr std::size_t kCapacity = 1 << 20;
  ChannelOptions options = ring_options(kCapacity);
  options.peer_check_interval = 20ms;
  auto [tx, rx] = channel<DiesWhileSerialized>(Transport::ShmRing, options);
  MappedHeader watcher(detail::EndAccess::core(rx).reader(), kCapacity);
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    rx.close();
    tx.adopt();
    tx.send(DiesWhileSerialized{Bytes(100, 1)});
    g_die_while_serializing = true;
    tx.send(DiesWhileSerialized{Bytes(200'000, 2)});
  });
  tx.detach();
  test::wait_child(child);
  auto first = rx.recv();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->payload, Bytes(100, 1));
  // The second body lies in the ring past the tail, never published.
  const std::uint64_t tail = watcher.header().tail.load();
  EXPECT_EQ(std::memcmp(watcher.data() + tail + kRingBodyOffset + 8, Bytes(200'000, 2).data(), 200'000), 0);
  EXPECT_THROW(rx.recv(), PeerDied);
  EXPECT_EQ(watcher.header().tail.load(), tail);
}

// ---- corrupted shared state --------------------------------------------------------

TEST_F(RingTest, ScribbledWritePositionIsAProtocolError) {
  auto [tx, rx] = channel<int>(Transport::ShmRing, ring_options(4096));
  MappedHeader scribbler(detail::EndAccess::core(rx).reader(), 4096);
  tx.send(1);
  scribbler.header().tail.store(1'000'000);
  EXPECT_THROW(rx.recv(), ProtocolError);
  EXPECT_THROW(rx.recv(), ProtocolError);  // broken for good
}

TEST_F(RingTest, ScribbledReadPositionIsAProtocolErrorForTheSender) {
  auto [tx, rx] = channel<Bytes>(Transport::ShmRing, ring_options(4096));
  MappedHeader scribbler(detail::EndAccess::core(rx).reader(), 4096);
  tx.send(Bytes(3000, 1));
  scribbler.header().head.store(1'000'000);
  EXPECT_THROW(tx.send(Bytes(3000, 2)), ProtocolError);  // needs room: reads the head
}

TEST_F(RingTest, ScribbledFrameLengthIsAProtocolError) {
  auto [tx, rx] = channel<Bytes>(Transport::ShmRing, ring_options(4096));
  MappedHeader scribbler(detail::EndAccess::core(rx).reader(), 4096);
  tx.send(Bytes(100, 1));
  detail::FrameHeader header;
  std::memcpy(&header, scribbler.data(), sizeof header);
  header.body_bytes = std::uint64_t{1} << 62;
  std::memcpy(scribbler.data(), &header, sizeof header);
  try {
    rx.recv();
    FAIL() << "a frame claiming 2^62 bytes was accepted";
  } catch (const ProtocolError& error) {
    EXPECT_NE(std::string(error.what()).find("body_bytes"), std::string::npos) << error.what();
  }
}

TEST_F(RingTest, FrameLengthTooShortIsAProtocolErrorNotAnOverread) {
  auto [tx, rx] = channel<Bytes>(Transport::ShmRing, ring_options(4096));
  MappedHeader scribbler(detail::EndAccess::core(rx).reader(), 4096);
  tx.send(Bytes(100, 1));
  tx.send(Bytes(100, 2));
  detail::FrameHeader header;
  std::memcpy(&header, scribbler.data(), sizeof header);
  header.body_bytes -= 60;  // the rest of the body is taken for the next frame's header
  std::memcpy(scribbler.data(), &header, sizeof header);
  EXPECT_THROW(rx.recv(), ProtocolError);
}

// A gap's record scribbled to a length below its own, past kRingBodyOffset, or past what
// was published.
TEST_F(RingTest, ScribbledGapIsAProtocolErrorNotAnOverread) {
  constexpr std::size_t kCapacity = 1 << 20;
  for (const std::uint64_t length : {std::uint64_t{8}, std::uint64_t{kRingBodyOffset + 16}, std::uint64_t{1} << 40}) {
    auto [tx, rx] = channel<Bytes>(Transport::ShmRing, ring_options(kCapacity));
    MappedHeader scribbler(detail::EndAccess::core(rx).reader(), kCapacity);
    tx.send(Bytes(100'000, 1));
    RingSkip skip;
    std::memcpy(&skip, scribbler.data(), sizeof skip);
    ASSERT_EQ(skip.magic, kRingSkipMagic);
    skip.bytes = length;
    std::memcpy(scribbler.data(), &skip, sizeof skip);
    EXPECT_THROW(rx.recv(), ProtocolError) << length;
  }
}

// ChannelOptions::ring_capacity is rounded up to a power of two, at least 4 KiB; above
// kRingMaxCapacity it is refused with an Error before anything is created.
TEST_F(RingTest, RingCapacityIsRoundedUpToAPowerOfTwoAndLimited) {
  EXPECT_EQ(ring_capacity_for(0), kRingMinCapacity);
  EXPECT_EQ(ring_capacity_for(1), std::size_t{4096});
  EXPECT_EQ(ring_capacity_for(4097), std::size_t{8192});
  EXPECT_EQ(ring_capacity_for(kRingMaxCapacity), kRingMaxCapacity);
  auto [tx, rx] = channel<Bytes>(Transport::ShmRing, ring_options(5000));
  MappedHeader scribbler(detail::EndAccess::core(rx).reader(), 8192);
  EXPECT_EQ(scribbler.header().capacity, 8192u);
  tx.send(Bytes(7000, 3));  // fits whole in 8 KiB, not in the 5000 bytes asked for
  auto got = rx.recv();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->size(), 7000u);
  EXPECT_EQ(got->back(), 3);
  try {
    (void)channel<int>(Transport::ShmRing, ring_options(kRingMaxCapacity + 1));
    ADD_FAILURE() << "a ring above kRingMaxCapacity was created";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("ring capacity of"), std::string::npos) << error.what();
  }
}

TEST_F(RingTest, ScribbledSegmentHeaderIsRefusedWhenAttaching) {
  auto [tx, rx] = channel<int>(Transport::ShmRing, ring_options(4096));
  MappedHeader scribbler(detail::EndAccess::core(rx).reader(), 4096);
  const int fd = detail::EndAccess::core(rx).reader().descriptors().at(0);
  EXPECT_NO_THROW(RingSegment::attach(detail::UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0))));
  scribbler.header().capacity = std::uint64_t{1} << 50;
  EXPECT_THROW(RingSegment::attach(detail::UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0))), ProtocolError);
  scribbler.header().capacity = 4096;
  scribbler.header().magic = 0;
  EXPECT_THROW(RingSegment::attach(detail::UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0))), ProtocolError);
  scribbler.header().magic = kRingMagic;
  // The ends keep their own copy of the capacity: the channel still works.
  tx.send(5);
  EXPECT_EQ(rx.recv().value(), 5);
}

// Another process writes random bytes over the ring's header lines and data while a
// sender and a receiver run. The receiver may get frames (whatever the bytes say), time
// out, or get ProtocolError and stay broken; it must never fault or read outside the
// segment (the ASan build checks that), and neither end may hang.
TEST_F(RingTest, PeerScribblingWhileBothEndsRunNeverCrashesEitherEnd) {
  constexpr std::size_t kCapacity = 4096;
  auto [tx, rx] = channel<Bytes>(Transport::ShmRing, ring_options(kCapacity, 0ns));
  MappedHeader shared(detail::EndAccess::core(rx).reader(), kCapacity);
  const pid_t scribbler = fork_child([&] {
    std::mt19937_64 rng(20261130);
    auto* bytes = static_cast<unsigned char*>(shared.mapping.data());
    const auto until = std::chrono::steady_clock::now() + 300ms;
    while (std::chrono::steady_clock::now() < until) {
      // Mostly the positions and futex words, sometimes the frames in the data.
      const std::size_t line = rng() % 4;
      const std::size_t offset = line < 3 ? kRingLineBytes * (line) + rng() % 24 : kRingHeaderBytes + rng() % kCapacity;
      bytes[offset] = static_cast<unsigned char>(rng());
      if (rng() % 64 == 0) std::this_thread::sleep_for(50us);
    }
  });

  std::atomic<bool> stop{false};
  std::thread sender([&, &tx = tx] {
    std::mt19937_64 rng(7);
    try {
      while (!stop.load()) tx.send_for(Bytes(rng() % 600, 0x5a), 20ms);
    } catch (const ProtocolError&) {
    } catch (const ChannelClosed&) {
    }
  });
  int frames = 0;
  bool broken = false;
  const auto until = std::chrono::steady_clock::now() + 500ms;
  while (std::chrono::steady_clock::now() < until) {
    try {
      auto got = rx.recv_for(20ms);
      if (got.closed()) break;
      if (got) ++frames;
    } catch (const ProtocolError&) {
      broken = true;
      EXPECT_THROW(rx.recv_for(1ms), ProtocolError);  // broken for good
      break;
    }
  }
  rx.close();
  stop = true;
  sender.join();
  try {
    tx.close();  // the end-of-stream frame needs room, read from the scribbled positions
  } catch (const ProtocolError&) {
  }
  EXPECT_FALSE(tx.is_open());
  EXPECT_TRUE(child_succeeded(scribbler));
  // Random bytes over the positions break the ring quickly; the count says how far it got.
  RecordProperty("frames_before_break", frames);
  EXPECT_TRUE(broken || frames > 0);
}

// ---- dead peers ------------------------------------------------------------------------

// A sleeping end looks at its peer every peer_check_interval, so a death is noticed within
// about that interval. The tests below use a small interval and a bound fifty times larger:
// they check that the death is noticed while the end sleeps, not how fast.
constexpr auto kPeerCheck = 20ms;
constexpr auto kNoticeBound = 1s;

ChannelOptions quick_check_options() {
  ChannelOptions options = ring_options(4096);
  options.peer_check_interval = kPeerCheck;
  return options;
}

// Waits (at most 10 s) until `word` says that its end sleeps on the futex.
bool wait_until_sleeping(const std::atomic<std::uint32_t>& word) {
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (word.load() != 1) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST_F(RingTest, ReceiverKilledWhileTheSenderIsBlockedOnAFullRing) {
  auto [tx, rx] = channel<Bytes>(Transport::ShmRing, quick_check_options());
  MappedHeader watcher(detail::EndAccess::core(rx).reader(), 4096);
  const pid_t child = fork_child([&tx = tx] {
    tx.detach();
    ::pause();  // never reads
  });
  rx.close();
  std::atomic<bool> failed{false};
  std::chrono::steady_clock::time_point failed_at;
  std::thread sender([&, &tx = tx] {
    try {
      while (true) tx.send(Bytes(1000, 1));  // blocks once the ring is full
    } catch (const ChannelClosed&) {
      failed_at = std::chrono::steady_clock::now();
      failed = true;
    }
  });
  // The sender sleeps on the futex of a full ring, and keeps sleeping while the reader lives.
  ASSERT_TRUE(wait_until_sleeping(watcher.header().writer_sleeping));
  std::this_thread::sleep_for(5 * kPeerCheck);
  EXPECT_FALSE(failed.load());
  EXPECT_EQ(watcher.header().writer_sleeping.load(), 1u);
  EXPECT_GT(watcher.header().tail.load() - watcher.header().head.load(), 4096u - 1000u) << "the ring is not full";
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  sender.join();
  ASSERT_TRUE(failed.load());
  EXPECT_LT(failed_at - killed_at, kNoticeBound) << "peer_check_interval is " << kPeerCheck.count() << " ms";
  EXPECT_FALSE(tx.is_open());
  EXPECT_EQ(test::wait_child(child).signal, SIGKILL);
}

TEST_F(RingTest, SenderKilledWhileTheReceiverSleepsOnTheFutexIsPeerDied) {
  auto [tx, rx] = channel<int>(Transport::ShmRing, quick_check_options());
  MappedHeader watcher(detail::EndAccess::core(rx).reader(), 4096);
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    rx.close();
    tx.adopt();
    tx.send(1);
    ::pause();
  });
  tx.detach();
  EXPECT_EQ(rx.recv().value(), 1);
  std::chrono::steady_clock::time_point killed_at;
  bool slept = false;
  std::thread killer([&] {
    slept = wait_until_sleeping(watcher.header().reader_sleeping);
    std::this_thread::sleep_for(3 * kPeerCheck);  // several peer checks found the sender alive
    killed_at = std::chrono::steady_clock::now();
    ::kill(child, SIGKILL);
  });
  try {
    (void)rx.recv();
    ADD_FAILURE() << "a killed sender must be PeerDied";
  } catch (const PeerDied&) {
    // What the sleeping receiver must see.
  }
  const auto noticed_at = std::chrono::steady_clock::now();
  killer.join();
  EXPECT_TRUE(slept) << "the receiver never slept on the futex";
  EXPECT_LT(noticed_at - killed_at, kNoticeBound) << "peer_check_interval is " << kPeerCheck.count() << " ms";
  EXPECT_THROW(rx.recv(), PeerDied);  // stays dead
  EXPECT_EQ(test::wait_child(child).signal, SIGKILL);
}

TEST_F(RingTest, SendsIntoTheRingOfAKilledReceiverStopWithinTheCheckInterval) {
  // The sender always finds room (a small frame every millisecond into a 64 KiB ring): it
  // looks at its peer at most once per interval, so sends succeed for about that long.
  ChannelOptions options = quick_check_options();
  options.ring_capacity = 64 << 10;
  auto [tx, rx] = channel<int>(Transport::ShmRing, options);
  const pid_t child = fork_child([&tx = tx] {
    tx.detach();
    ::pause();
  });
  rx.close();
  tx.send(0);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  EXPECT_EQ(test::wait_child(child).signal, SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  int sent = 0;
  try {
    while (std::chrono::steady_clock::now() - killed_at < 10s) {
      tx.send(++sent);
      std::this_thread::sleep_for(1ms);
    }
    ADD_FAILURE() << "sends into the ring of a dead receiver kept succeeding";
  } catch (const ChannelClosed&) {
    // What the sender must see.
  }
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, kNoticeBound) << sent << " sends succeeded";
  EXPECT_FALSE(tx.is_open());
}

TEST_F(RingTest, SenderKilledMidFrameIsPeerDiedNeverAMessage) {
  constexpr std::size_t kCapacity = 4096;
  auto [tx, rx] = channel<Bytes>(Transport::ShmRing, ring_options(kCapacity));
  MappedHeader watcher(detail::EndAccess::core(rx).reader(), kCapacity);
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    rx.close();
    tx.adopt();
    tx.send(Bytes(100, 1));
    tx.send(Bytes(1 << 20, 2));  // blocks mid-frame: nobody reads
  });
  tx.detach();
  // Wait until the child filled the ring with the start of the big frame.
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (watcher.header().tail.load() < kCapacity && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_GE(watcher.header().tail.load(), kCapacity);
  ::kill(child, SIGKILL);
  test::wait_child(child);
  auto first = rx.recv();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, Bytes(100, 1));
  try {
    rx.recv();
    FAIL() << "half a frame was delivered as a message";
  } catch (const PeerDied& error) {
    EXPECT_NE(std::string(error.what()).find("middle of a frame"), std::string::npos) << error.what();
  }
  EXPECT_THROW(rx.recv(), PeerDied);
}

TEST_F(RingTest, SendingToADeadReceiverFailsOnceItIsNoticed) {
  auto [tx, rx] = channel<int>(Transport::ShmRing, ring_options(4096));
  const pid_t child = fork_child([&tx = tx] { tx.detach(); });
  rx.close();
  ASSERT_TRUE(child_succeeded(child));
  // The first send checks the companion socket: the receiver is gone.
  EXPECT_THROW(tx.send(1), ChannelClosed);
}

// ---- waiting -------------------------------------------------------------------------

double process_cpu_seconds() {
  timespec now{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

TEST_F(RingTest, IdleEndsBurnNoCpu) {
  // One receiver waiting on an empty ring, one sender waiting on a full ring.
  auto [idle_tx, idle_rx] = channel<int>(Transport::ShmRing, ring_options(4096));
  auto [full_tx, full_rx] = channel<Bytes>(Transport::ShmRing, ring_options(4096));
  while (full_tx.send_for(Bytes(1000, 1), 10ms)) {
  }
  std::thread receiver([&idle_rx = idle_rx] { EXPECT_EQ(idle_rx.recv().value(), 42); });
  std::thread sender([&full_tx = full_tx] { full_tx.send(Bytes(1000, 2)); });
  std::this_thread::sleep_for(100ms);  // past the spin budget: both sleep now

  const double before = process_cpu_seconds();
  std::this_thread::sleep_for(1s);
  const double burnt = process_cpu_seconds() - before;
  // Spinning would burn about 2 s here; sleeping ends wake ~10 times a second to check
  // their peer, which costs microseconds.
  EXPECT_LT(burnt, 0.05) << "idle ends burnt " << burnt << " s of CPU in one second";
  std::printf("CPU time of two idle ring ends across one second: %.6f s\n", burnt);

  idle_tx.send(42);
  while (full_rx.try_recv()) {
  }
  receiver.join();
  sender.join();
}

TEST_F(RingTest, TheLongestPeerCheckIntervalStillLetsAnIdleEndSleep) {
  // milliseconds::max() as "hardly ever look at the peer": the end must still sleep on its
  // futex (not wake every microsecond) and still be woken by a send.
  ChannelOptions options = ring_options(4096, std::chrono::nanoseconds::zero());
  options.peer_check_interval = std::chrono::milliseconds::max();
  auto [tx, rx] = channel<int>(Transport::ShmRing, options);
  std::thread receiver([&rx = rx] { EXPECT_EQ(rx.recv().value(), 42); });
  std::this_thread::sleep_for(100ms);  // the receiver sleeps now
  const double before = process_cpu_seconds();
  std::this_thread::sleep_for(500ms);
  const double burnt = process_cpu_seconds() - before;
  EXPECT_LT(burnt, 0.05) << "an idle receiver burnt " << burnt << " s of CPU in half a second";
  tx.send(42);
  receiver.join();
}

TEST_F(RingTest, SleepingReceiverIsWokenBySend) {
  // Ends that sleep at once and hardly ever look at their peer: only the publishing end's
  // wake-up can end a wait, so one lost wake-up (publish's fence and the sleeper's store
  // and load not pairing) hangs this test into its timeout.
  ChannelOptions options = ring_options(4096, std::chrono::nanoseconds::zero());
  options.peer_check_interval = std::chrono::milliseconds::max();
  auto [tx, rx] = channel<int>(Transport::ShmRing, options);
  auto [back_tx, back_rx] = channel<int>(Transport::ShmRing, options);
  std::thread echo([&rx = rx, &back_tx = back_tx] {
    while (auto value = rx.recv()) back_tx.send(*value + 1);
    back_tx.close();
  });
  for (int i = 0; i < 2000; ++i) {
    tx.send(i);
    ASSERT_EQ(back_rx.recv().value(), i + 1);
  }
  tx.close();
  EXPECT_FALSE(back_rx.recv().has_value());
  echo.join();
}

// The wait of one ring end, on a segment of its own, with a companion socket whose other
// side stays open (the peer never looks gone) and no spinning.
struct SleepingEnd {
  SleepingEnd() : segment(std::make_shared<const RingSegment>(RingSegment::create(4096))) {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) throw std::runtime_error("socketpair");
    other_side = detail::UniqueFd(pair[1]);
    end.emplace(
        segment, detail::UniqueFd(pair[0]),
        RingTiming{.spin = std::chrono::nanoseconds::zero(), .peer_check_interval = std::chrono::milliseconds::max()});
  }
  RingHeader& header() const { return segment->header(); }
  std::shared_ptr<const RingSegment> segment;
  detail::UniqueFd other_side;
  std::optional<detail::RingEnd> end;
};

TEST_F(RingTest, AnEndAsleepIsWokenByAPositionPublishedWithoutTheFence) {
  // What a reader's release of a lone small frame does (publish_unfenced): a writer that
  // sleeps already is woken at once. Peer checks never come, so a lost wake-up hangs here.
  SleepingEnd sleeping;
  RingHeader& header = sleeping.header();
  detail::WaitOutcome outcome = detail::WaitOutcome::Timeout;
  std::thread waiter([&] {
    outcome = sleeping.end->wait(
        header.writer_sleeping, [&] { return header.head.load() >= 1; }, detail::Deadline::never(), nullptr);
  });
  const bool slept = wait_until_sleeping(header.writer_sleeping);
  const bool owed = detail::RingEnd::publish_unfenced(header.head, 1, header.writer_sleeping);
  if (owed) detail::RingEnd::settle(header.writer_sleeping);  // so that the waiter ends whatever happened
  waiter.join();
  ASSERT_TRUE(slept);
  EXPECT_FALSE(owed);  // it saw the sleeper's 1 and woke it
  EXPECT_EQ(outcome, detail::WaitOutcome::Ready);
}

TEST_F(RingTest, AWaitWhoseWakeUpWasMissedEndsAfterItsFirstSleep) {
  // The race publish_unfenced() leaves open: the peer looked at the word just before this
  // end announced its sleep, and this end's re-check just missed the new position. Modelled
  // by a condition that turns true only after that re-check, with no wake-up at all: the
  // first sleep, cut to `first_sleep`, ends the wait (without the cut it would end only at
  // the peer check, an hour away).
  SleepingEnd sleeping;
  RingHeader& header = sleeping.header();
  int checks = 0;
  const detail::WaitOutcome outcome = sleeping.end->wait(
      header.writer_sleeping, [&] { return ++checks > 2; }, detail::Deadline::never(), nullptr, kRingRoomFirstSleep);
  EXPECT_EQ(outcome, detail::WaitOutcome::Ready);
  EXPECT_EQ(checks, 3);  // before spinning, after announcing, after the first sleep
  EXPECT_EQ(header.writer_sleeping.load(), 0u);
}

TEST_F(RingTest, AWaitReChecksOnceAfterItsFirstSleepNotEveryMillisecond) {
  // The cut applies to the sleep after an announcement only: a writer blocked for room
  // pays one extra wake-up per announcement. Counted by the condition's checks over a
  // 60 ms wait that never succeeds: about 6 (before spinning, then two per sleep), where
  // re-checking every `first_sleep` would make about 120.
  SleepingEnd sleeping;
  RingHeader& header = sleeping.header();
  int checks = 0;
  const detail::WaitOutcome outcome = sleeping.end->wait(
      header.writer_sleeping,
      [&] {
        ++checks;
        return false;
      },
      detail::Deadline::after(60ms), nullptr, kRingRoomFirstSleep);
  EXPECT_EQ(outcome, detail::WaitOutcome::Timeout);
  EXPECT_GE(checks, 5);  // the first sleep was cut and re-checked (uncut: 4)
  EXPECT_LE(checks, 12);
}

// ---- descriptors ---------------------------------------------------------------------

TEST_F(RingTest, AnEndRebuiltFromItsDescriptorsReadsTheStream) {
  auto [writer, reader] = detail::make_transport(Transport::ShmRing, FrameLimits{}, 4096);
  const std::vector<int> fds = reader->descriptors();
  ASSERT_EQ(fds.size(), 2u);  // the segment and the companion socket
  EXPECT_EQ(writer->descriptors().size(), 2u);
  // What an exec'd process would do with inherited copies of the descriptors.
  RingFrameReader rebuilt(
      std::make_shared<const RingSegment>(RingSegment::attach(detail::UniqueFd(::fcntl(fds[0], F_DUPFD_CLOEXEC, 0)))),
      detail::UniqueFd(::fcntl(fds[1], F_DUPFD_CLOEXEC, 0)), RingTiming{}, FrameLimits{});
  reader->close();
  detail::FrameHeader header;
  header.kind = static_cast<std::uint8_t>(detail::FrameKind::Message);
  header.body_bytes = 5;
  const char body[] = "hello";
  const iovec parts[] = {{&header, sizeof header}, {const_cast<char*>(body), 5}};
  ASSERT_TRUE(writer->write(parts, {}, detail::Deadline::never()));
  detail::FrameHeader got;
  std::vector<std::byte> payload;
  std::deque<detail::UniqueFd> fds_in;
  ASSERT_EQ(rebuilt.read(got, payload, fds_in, detail::Deadline::after(1s)), ReadStatus::Frame);
  ASSERT_EQ(payload.size(), 5u);
  EXPECT_EQ(std::memcmp(payload.data(), body, 5), 0);
  writer->close();
  EXPECT_THROW(rebuilt.read(got, payload, fds_in, detail::Deadline::after(1s)), PeerDied);
}

}  // namespace
}  // namespace ferry
