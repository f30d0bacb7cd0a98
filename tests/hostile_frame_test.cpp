// Frames that lie: every field a sender controls is corrupted in turn, and the receiver
// must answer with a ProtocolError naming the field, keep running, close the fds it was
// handed, and report itself broken afterwards. Frames are wire version 3 (frame.hpp): the
// first frame of a connection carries a segment table (the return board first, then the
// tensor's segment) ahead of the handle table.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ferry/detail/frame_channel.hpp"
#include "ferry/detail/message_decoder.hpp"
#include "ferry/detail/message_encoder.hpp"
#include "ferry/detail/size_classes.hpp"
#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/transports.hpp"

namespace ferry {
namespace {

struct OneTensor {
  Tensor tensor;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(tensor);
  }
};

struct Other {
  std::int32_t value = 0;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(value);
  }
};

// A raw writer connected to a typed Receiver<T>: the test writes whatever bytes it likes.
template <class T>
struct Wire {
  explicit Wire(Transport transport) {
    auto [raw_writer, reader] = detail::make_transport(transport, FrameLimits{}, 0);
    writer = std::move(raw_writer);
    rx = detail::receiver_over<T>(std::move(reader), transport, ChannelOptions{});
  }
  void send(const std::vector<std::byte>& bytes, std::vector<int> fds = {}) {
    iovec part{const_cast<std::byte*>(bytes.data()), bytes.size()};
    writer->write({&part, 1}, fds, detail::Deadline::never());
  }
  std::unique_ptr<detail::FrameWriter> writer;
  Receiver<T> rx;
};

// Index, in the segment table of a first frame, of the tensor's segment (the return board
// leads the table), and of its fd among the frame's fds.
constexpr std::size_t kDataSegment = 1;

// A valid frame for `message`, flattened, with offsets of its parts for patching. It keeps
// the encoder that made it (its segments and /proc paths stay valid, as a live sender's
// would) and duplicates of the fds passed with it.
struct Frame {
  std::unique_ptr<detail::MessageEncoder> encoder;
  std::vector<std::byte> bytes;
  std::vector<detail::UniqueFd> owned_fds;
  std::vector<int> fds;
  std::size_t segment_offset = 0;
  std::size_t table_offset = 0;
  std::size_t body_offset = 0;

  Frame() = default;
  Frame(Frame&&) noexcept = default;
  Frame& operator=(Frame&&) = delete;
  ~Frame() {
    // The test's receiver is done with the frame: whatever it did not resolve never will be,
    // so the sender unpins it (as a channel does once its receiving end is gone).
    if (encoder) encoder->receiver_gone();
  }

  detail::FrameHeader header() const {
    detail::FrameHeader h;
    std::memcpy(&h, bytes.data(), sizeof h);
    return h;
  }
  void set_header(const detail::FrameHeader& h) { std::memcpy(bytes.data(), &h, sizeof h); }
  void locate() {
    const detail::FrameHeader h = header();
    segment_offset = sizeof(detail::FrameHeader) + h.type_name_bytes;
    table_offset = segment_offset + h.segment_count * sizeof(detail::SegmentEntry);
    body_offset = table_offset + h.handle_count * sizeof(detail::HandleEntry) +
                  (std::size_t{h.release_count} + h.segment_release_count) * sizeof(std::uint32_t);
  }
  detail::SegmentEntry segment(std::size_t i) const {
    detail::SegmentEntry e;
    std::memcpy(&e, bytes.data() + segment_offset + i * sizeof e, sizeof e);
    return e;
  }
  void set_segment(std::size_t i, const detail::SegmentEntry& e) {
    std::memcpy(bytes.data() + segment_offset + i * sizeof e, &e, sizeof e);
  }
  detail::HandleEntry entry(std::size_t i) const {
    detail::HandleEntry e;
    std::memcpy(&e, bytes.data() + table_offset + i * sizeof e, sizeof e);
    return e;
  }
  void set_entry(std::size_t i, const detail::HandleEntry& e) {
    std::memcpy(bytes.data() + table_offset + i * sizeof e, &e, sizeof e);
  }
  // Removes the segment table (and with it every fd the frame passes).
  void drop_segments() {
    detail::FrameHeader h = header();
    const auto begin = bytes.begin() + static_cast<std::ptrdiff_t>(segment_offset);
    bytes.erase(begin, begin + static_cast<std::ptrdiff_t>(h.segment_count * sizeof(detail::SegmentEntry)));
    h.segment_count = 0;
    h.fd_count = 0;
    set_header(h);
    fds.clear();
    locate();
  }
  // Appends `e` to the segment table (after the segments the handles name).
  void append_segment(const detail::SegmentEntry& e) {
    detail::FrameHeader h = header();
    const auto end = bytes.begin() + static_cast<std::ptrdiff_t>(table_offset);
    const auto* raw = reinterpret_cast<const std::byte*>(&e);
    bytes.insert(end, raw, raw + sizeof e);
    ++h.segment_count;
    set_header(h);
    locate();
  }
  template <class V>
  void patch_body(std::size_t offset, V value) {
    std::memcpy(bytes.data() + body_offset + offset, &value, sizeof value);
  }
};

template <class T>
Frame encode(const T& message, detail::HandlePassing passing = detail::HandlePassing::FdPassing) {
  Frame frame;
  frame.encoder = std::make_unique<detail::MessageEncoder>(passing);
  const detail::EncodedFrame& encoded = frame.encoder->encode(message);
  for (const iovec& part : encoded.iovecs()) {
    const auto* begin = static_cast<const std::byte*>(part.iov_base);
    frame.bytes.insert(frame.bytes.end(), begin, begin + part.iov_len);
  }
  // The encoder closes the return board's fd once the frame is committed: send duplicates.
  for (const int fd : encoded.fds) {
    frame.owned_fds.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    frame.fds.push_back(frame.owned_fds.back().get());
  }
  frame.locate();
  frame.encoder->commit();
  return frame;
}

// Offsets inside the body of a OneTensor holding one 2-d tensor (see tensor_wire.cpp).
constexpr std::size_t kStateAt = 0;
constexpr std::size_t kDTypeAt = 1;
constexpr std::size_t kDimensionsAt = 3;
constexpr std::size_t kShapeAt = 7;
constexpr std::size_t kStridesAt = kShapeAt + 2 * 8;
constexpr std::size_t kOffsetAt = kStridesAt + 2 * 8;
constexpr std::size_t kHandleAt = kOffsetAt + 8;

// Receives are bounded so that a frame wrongly accepted fails the test instead of hanging
// it on the next receive.
constexpr std::chrono::seconds kRecvBound{20};

template <class T>
void expect_protocol_error(Receiver<T>& rx, const std::string& needle) {
  try {
    rx.recv_for(kRecvBound);
    ADD_FAILURE() << "expected a ProtocolError mentioning '" << needle << "'";
  } catch (const ProtocolError& error) {
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
  }
  // The channel reports itself broken from now on.
  try {
    rx.recv_for(kRecvBound);
    ADD_FAILURE() << "a broken receiver must keep failing";
  } catch (const ProtocolError& error) {
    EXPECT_NE(std::string(error.what()).find("broken"), std::string::npos) << error.what();
  }
}

class HostileFrameTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {
 protected:
  Tensor tensor_ = Tensor::zeros({4, 8}, DType::Float32, Device::SharedCpu);
  detail::HandlePassing passing() const {
    return GetParam() == Transport::UnixSocket ? detail::HandlePassing::FdPassing : detail::HandlePassing::ProcFd;
  }
};

INSTANTIATE_TEST_SUITE_P(Transports, HostileFrameTest, ::testing::ValuesIn(test::interprocess_transports()),
                         test::transport_test_name);

TEST_P(HostileFrameTest, ValidFrameIsAccepted) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  wire.send(frame.bytes, frame.fds);
  auto got = wire.rx.recv();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->tensor.shape(), (Shape{4, 8}));
}

TEST_P(HostileFrameTest, WrongMagic) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::FrameHeader h = frame.header();
  h.magic = 0xdeadbeef;
  frame.set_header(h);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "magic");
}

TEST_P(HostileFrameTest, WrongVersion) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::FrameHeader h = frame.header();
  h.version = 1;  // a peer built before the caching allocator
  frame.set_header(h);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "wire version 1, this build speaks version " + std::to_string(detail::kFrameVersion));
}

TEST_P(HostileFrameTest, UnknownFrameKind) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::FrameHeader h = frame.header();
  h.kind = 9;
  frame.set_header(h);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "unknown kind 9");
}

// Every count of the header is checked against FrameLimits before the rest of the frame
// is read (or allocated); the message names the field, its value, the limit and the
// ChannelOptions setting behind it.
TEST_P(HostileFrameTest, HeaderCountsAboveTheirLimits) {
  const FrameLimits limits;
  struct Lie {
    std::string field;
    std::uint64_t limit;
    std::string setting;
    std::function<void(detail::FrameHeader&)> apply;
  };
  const std::vector<Lie> lies = {
      {"handle_count", limits.max_handles, "max_handles",
       [&](detail::FrameHeader& h) { h.handle_count = limits.max_handles + 1; }},
      {"segment_count", limits.max_segments, "max_segments",
       [&](detail::FrameHeader& h) { h.segment_count = limits.max_segments + 1; }},
      {"fd_count", limits.max_fds, "max_fds", [&](detail::FrameHeader& h) { h.fd_count = limits.max_fds + 1; }},
      {"release_count", limits.max_releases, "max_releases",
       [&](detail::FrameHeader& h) { h.release_count = limits.max_releases + 1; }},
      {"segment_release_count", limits.max_releases, "max_releases",
       [&](detail::FrameHeader& h) { h.segment_release_count = limits.max_releases + 1; }},
      {"type_name_bytes", limits.max_type_name_bytes, "max_type_name_bytes",
       [&](detail::FrameHeader& h) { h.type_name_bytes = limits.max_type_name_bytes + 1; }},
  };
  for (const Lie& lie : lies) {
    SCOPED_TRACE(lie.field);
    Wire<OneTensor> wire(GetParam());
    Frame frame = encode(OneTensor{tensor_}, passing());
    detail::FrameHeader h = frame.header();
    lie.apply(h);
    frame.set_header(h);
    wire.send(frame.bytes, frame.fds);
    expect_protocol_error(wire.rx, "frame header field " + lie.field + " is " + std::to_string(lie.limit + 1) +
                                       ", above the limit of " + std::to_string(lie.limit) +
                                       " (ChannelOptions::limits." + lie.setting + ";");
  }
}

TEST_P(HostileFrameTest, HugeBodyLengthIsRefusedBeforeReading) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::FrameHeader h = frame.header();
  h.body_bytes = std::uint64_t{1} << 40;
  frame.set_header(h);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "body_bytes");
}

TEST_P(HostileFrameTest, TruncatedBody) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::FrameHeader h = frame.header();
  h.body_bytes -= 10;  // the archive runs out of bytes while reading the tensor
  frame.set_header(h);
  frame.bytes.resize(frame.bytes.size() - 10);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "truncated");
}

TEST_P(HostileFrameTest, LeftoverBodyBytes) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::FrameHeader h = frame.header();
  h.body_bytes += 3;
  frame.set_header(h);
  frame.bytes.resize(frame.bytes.size() + 3);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "message body has 3 bytes left over after reading a ");
}

TEST_P(HostileFrameTest, StreamCutInTheMiddleOfAFrameIsPeerDeath) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  frame.bytes.resize(frame.bytes.size() / 2);
  wire.send(frame.bytes, frame.fds);
  wire.writer->close();
  try {
    wire.rx.recv();
    ADD_FAILURE() << "expected PeerDied";
  } catch (const PeerDied& error) {
    EXPECT_NE(std::string(error.what()).find("middle of a frame"), std::string::npos) << error.what();
  }
}

TEST_P(HostileFrameTest, HandleIndexOutOfRange) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  frame.patch_body(kHandleAt, std::uint32_t{5});
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "handle index 5");
}

TEST_P(HostileFrameTest, DTypeOutOfRange) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  frame.patch_body(kDTypeAt, std::uint8_t{200});
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "dtype");
}

TEST_P(HostileFrameTest, ShapeProductOverflows) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  frame.patch_body(kShapeAt, std::int64_t{1} << 40);
  frame.patch_body(kShapeAt + 8, std::int64_t{1} << 40);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "overflows");
}

TEST_P(HostileFrameTest, OffsetBeyondTheStorage) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  frame.patch_body(kOffsetAt, std::int64_t{1});  // 32 elements from offset 1 end past the 128 bytes
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "storage has only 128 bytes");
}

TEST_P(HostileFrameTest, StrideBeyondTheStorage) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  frame.patch_body(kStridesAt, std::int64_t{1000});
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "storage has only 128 bytes");
}

TEST_P(HostileFrameTest, NegativeStride) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  frame.patch_body(kStridesAt + 8, std::int64_t{-1});
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "negative");
}

TEST_P(HostileFrameTest, HugeStrideOverflowsTheExtent) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  frame.patch_body(kStridesAt, std::int64_t{1} << 62);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "overflows");
}

TEST_P(HostileFrameTest, LeaseSlotThatWasNeverGranted) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  frame.drop_segments();  // a frame naming only leases introduces no segment
  detail::HandleEntry e = frame.entry(0);
  e.kind = static_cast<std::uint32_t>(detail::HandleKind::Leased);
  e.slot = 3;
  frame.set_entry(0, e);
  wire.send(frame.bytes);
  expect_protocol_error(wire.rx, "holds no lease");
}

TEST_P(HostileFrameTest, SlotAboveTheLimit) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::HandleEntry e = frame.entry(0);
  e.slot = detail::MessageDecoder::kMaxSlots;
  frame.set_entry(0, e);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "above the limit");
}

// Sends a frame that announces the release of storage slot 7 (or of segment slot 7), which
// the receiver never leased, and expects the receiver to name it.
void expect_unknown_release(Wire<OneTensor>& wire, Frame frame, bool segment_slot) {
  detail::FrameHeader h = frame.header();
  (segment_slot ? h.segment_release_count : h.release_count) = 1;
  frame.set_header(h);
  const std::uint32_t slot = 7;
  const auto* raw = reinterpret_cast<const std::byte*>(&slot);
  frame.bytes.insert(frame.bytes.begin() + static_cast<std::ptrdiff_t>(frame.body_offset), raw, raw + sizeof slot);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(
      wire.rx, segment_slot ? "releases segment slot 7 which holds no lease" : "releases slot 7 which holds no lease");
}

TEST_P(HostileFrameTest, ReleaseOfASlotThatHoldsNoLease) {
  Wire<OneTensor> wire(GetParam());
  expect_unknown_release(wire, encode(OneTensor{tensor_}, passing()), false);
}

TEST_P(HostileFrameTest, ReleaseOfASegmentSlotThatHoldsNoLease) {
  Wire<OneTensor> wire(GetParam());
  expect_unknown_release(wire, encode(OneTensor{tensor_}, passing()), true);
}

TEST_P(HostileFrameTest, NewHandleInASlotThatIsStillLeased) {
  Wire<OneTensor> wire(GetParam());
  Frame first = encode(OneTensor{tensor_}, passing());
  wire.send(first.bytes, first.fds);
  ASSERT_TRUE(wire.rx.recv_for(kRecvBound).has_value());
  // A second encoder knows nothing of the first: it hands another storage out at slot 0.
  // (Its segment table, a second return board and the segment at segment slot 0, which
  // the receiver would refuse first, is dropped: the block names the leased segment.)
  Tensor other = Tensor::zeros({4, 8}, DType::Float32, Device::SharedCpu);
  Frame second = encode(OneTensor{other}, passing());
  second.drop_segments();
  wire.send(second.bytes, second.fds);
  expect_protocol_error(wire.rx, "reuses slot 0 before releasing it");
}

TEST_P(HostileFrameTest, UnknownHandleKind) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::HandleEntry e = frame.entry(0);
  e.kind = 77;
  frame.set_entry(0, e);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "unknown kind");
}

TEST_P(HostileFrameTest, SizeClaimLargerThanTheSegment) {
  Wire<OneTensor> wire(GetParam());
  // The block's size claim reaches one byte past the end of its (real) segment.
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::HandleEntry e = frame.entry(0);
  e.nbytes = frame.segment(kDataSegment).size - e.offset + 1;
  frame.set_entry(0, e);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "outside its segment");
}

// A block that starts between two blocks of the allocator: its float32 elements would sit at
// addresses not aligned for float, and reading one through Tensor::data<float>() or at<>()
// is undefined behaviour (UBSan: misaligned load). Every block ferry hands out starts at a
// multiple of kBlockAlignment; any other offset is a lie.
TEST_P(HostileFrameTest, BlockOffsetNotAlignedToABlock) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::HandleEntry e = frame.entry(0);
  e.offset += 2;  // still inside the segment, by far
  frame.set_entry(0, e);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "offset");
}

// The edge that is allowed: a block that ends at the very last byte of its segment.
TEST_P(HostileFrameTest, BlockEndingAtTheLastByteOfItsSegmentIsAccepted) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::HandleEntry e = frame.entry(0);
  const std::uint64_t segment_bytes = frame.segment(kDataSegment).size;
  ASSERT_EQ(segment_bytes % detail::kBlockAlignment, 0u);
  e.offset = segment_bytes - e.nbytes;
  frame.set_entry(0, e);
  wire.send(frame.bytes, frame.fds);
  auto got = wire.rx.recv_for(kRecvBound);
  ASSERT_TRUE(got.has_value());
  const Tensor& t = got->tensor;
  const std::byte* segment_end = t.storage()->shared_block()->segment()->data() + segment_bytes;
  EXPECT_EQ(static_cast<const std::byte*>(t.data_ptr()) + t.storage()->nbytes(), segment_end);
  EXPECT_EQ(t.to_vector<float>().size(), 32u);  // reads every byte of the block
}

TEST_P(HostileFrameTest, SegmentSizeClaimThatIsNotTheSegments) {
  Wire<OneTensor> wire(GetParam());
  // The segment table claims a larger segment than the memfd it names.
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::SegmentEntry s = frame.segment(kDataSegment);
  s.size += 4096;
  frame.set_segment(kDataSegment, s);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "bytes");
}

TEST_P(HostileFrameTest, UnknownSegmentKind) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::SegmentEntry s = frame.segment(kDataSegment);
  s.kind = 77;
  frame.set_segment(kDataSegment, s);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "unknown kind");
}

TEST_P(HostileFrameTest, UpstreamBoardBeforeTheConnectionsOwnBoard) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::SegmentEntry s = frame.segment(0);  // the return board
  s.role = static_cast<std::uint32_t>(detail::SegmentRole::UpstreamBoard);
  frame.set_segment(0, s);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "never sent its own return board");
}

TEST_P(HostileFrameTest, UpstreamBoardWhoseSizeIsNotABoards) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::SegmentEntry s = frame.segment(kDataSegment);
  s.role = static_cast<std::uint32_t>(detail::SegmentRole::UpstreamBoard);
  frame.set_segment(kDataSegment, s);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "upstream return board whose field size claims");
}

// A retirement of an upstream board names only the board: one that also names an fd, a
// size or a slot is not one an honest sender writes.
TEST_P(HostileFrameTest, RetiredUpstreamBoardWithMoreThanAnIdentity) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::SegmentEntry s = frame.segment(kDataSegment);
  s.role = static_cast<std::uint32_t>(detail::SegmentRole::RetiredUpstreamBoard);
  frame.set_segment(kDataSegment, s);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "retires an upstream return board but has fields other than its identity set");
}

TEST_P(HostileFrameTest, RetiredUpstreamBoardBeforeTheConnectionsOwnBoard) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::SegmentEntry s;  // a well-formed retirement, in the place of the connection's board
  s.kind = static_cast<std::uint32_t>(detail::SegmentKind::NoFd);
  s.role = static_cast<std::uint32_t>(detail::SegmentRole::RetiredUpstreamBoard);
  s.device = 1;
  s.inode = 2;
  frame.set_segment(0, s);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "retires an upstream return board but the sender never sent its own return board");
}

// A retirement of a board the receiver does not have (one never passed, or the connection's
// own board) changes nothing: the frame reads, and so does the next one.
TEST_P(HostileFrameTest, RetiredUpstreamBoardThatTheReceiverDoesNotHaveChangesNothing) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::SegmentEntry unknown;
  unknown.kind = static_cast<std::uint32_t>(detail::SegmentKind::NoFd);
  unknown.role = static_cast<std::uint32_t>(detail::SegmentRole::RetiredUpstreamBoard);
  unknown.device = 1;
  unknown.inode = 2;
  detail::SegmentEntry own = unknown;
  own.device = frame.segment(0).device;
  own.inode = frame.segment(0).inode;
  frame.append_segment(unknown);
  frame.append_segment(own);
  wire.send(frame.bytes, frame.fds);
  auto got = wire.rx.recv_for(kRecvBound);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->tensor.shape(), (Shape{4, 8}));
  // The connection's board still works: the next frame (no new board) resolves against it.
  Tensor ones = Tensor::empty({2}, DType::Float32, Device::SharedCpu);
  ones.fill(1.0f);
  const detail::EncodedFrame& next = frame.encoder->encode(OneTensor{ones});
  std::vector<std::byte> bytes;
  for (const iovec& part : next.iovecs()) {
    const auto* begin = static_cast<const std::byte*>(part.iov_base);
    bytes.insert(bytes.end(), begin, begin + part.iov_len);
  }
  std::vector<detail::UniqueFd> owned;
  std::vector<int> fds;
  for (const int fd : next.fds) {
    owned.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    fds.push_back(owned.back().get());
  }
  frame.encoder->commit();
  wire.send(bytes, fds);
  auto second = wire.rx.recv_for(kRecvBound);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->tensor.data<float>()[1], 1.0f);
}

// A child process that sends this one a tensor of 2s (`copies` times: the later ones name
// the storage the receiver already leases) and keeps it pinned until finish(): a frame that
// forwards the tensor passes the board of its connection as an upstream board (a board of
// this process's own would not be registered on).
class OriginProcess {
 public:
  explicit OriginProcess(Transport transport, int copies = 1) {
    auto [tx, rx] = channel<OneTensor>(transport);
    auto [done_tx, done_rx] = channel<int>(transport);
    pid_ = test::fork_child([&, &tx = tx, &rx = rx, &done_tx = done_tx, &done_rx = done_rx] {
      rx.close();
      done_tx.detach();
      tx.adopt();
      Tensor tensor = Tensor::empty({4, 8}, DType::Float32, Device::SharedCpu);
      tensor.fill(2.0f);
      for (int i = 0; i < copies; ++i) tx.send(OneTensor{tensor});
      CHILD_CHECK(done_rx.recv().has_value());  // keeps what it sent pinned until then
    });
    tx.detach();
    done_rx.close();
    rx_ = std::move(rx);
    done_ = std::move(done_tx);
  }
  OneTensor receive() { return rx_.recv_for(kRecvBound).value(); }
  Receiver<OneTensor>& receiver() { return rx_; }
  /// Lets the child exit; true when it succeeded.
  bool finish() {
    done_.send(1);
    const bool succeeded = test::child_succeeded(pid_);
    rx_.close();
    done_.close();
    return succeeded;
  }

 private:
  Receiver<OneTensor> rx_;
  Sender<int> done_;
  pid_t pid_ = -1;
};

// A forwarder that claims, for an upstream board, a reclaim count ahead of the board's own:
// an honest one read the count before it sent, and counts only grow.
TEST_P(HostileFrameTest, UpstreamBoardWithAReclaimCountAheadOfTheBoards) {
  OriginProcess origin(GetParam());
  {
    const OneTensor received = origin.receive();
    Wire<OneTensor> wire(GetParam());
    Frame frame = encode(received, passing());
    std::optional<std::size_t> upstream;
    for (std::size_t i = 0; i < frame.header().segment_count; ++i) {
      if (frame.segment(i).role == static_cast<std::uint32_t>(detail::SegmentRole::UpstreamBoard)) upstream = i;
    }
    ASSERT_TRUE(upstream.has_value()) << "forwarding a received tensor passes its connection's board";
    detail::SegmentEntry s = frame.segment(*upstream);
    s.slot_or_reclaims += 3;
    frame.set_segment(*upstream, s);
    wire.send(frame.bytes, frame.fds);
    expect_protocol_error(wire.rx, "ahead of the board's own");
  }
  EXPECT_TRUE(origin.finish());
}

// The return board of the connection that brought `tensor` to this process, mapped anew:
// found by the fd number a frame that forwards the tensor names for it.
std::shared_ptr<detail::ReturnBoard> upstream_board_of(const OneTensor& tensor) {
  const Frame frame = encode(tensor, detail::HandlePassing::ProcFd);
  for (std::size_t i = 0; i < frame.header().segment_count; ++i) {
    const detail::SegmentEntry entry = frame.segment(i);
    if (entry.role != static_cast<std::uint32_t>(detail::SegmentRole::UpstreamBoard)) continue;
    detail::UniqueFd fd(::fcntl(entry.fd, F_DUPFD_CLOEXEC, 0));
    if (!fd) throw std::runtime_error("F_DUPFD_CLOEXEC failed");
    const detail::SharedMemory::Received file = detail::SharedMemory::inspect_received(fd.get());
    return detail::ReturnBoard::open_received(
        detail::SharedMemory::map_received(std::move(fd), file, detail::ReturnBoard::bytes()));
  }
  return nullptr;
}

// A process that cannot register as a holder on the board of a forwarded tensor's origin
// (every place holds a living process) refuses the frame: the origin could otherwise recycle
// the block under it once the forwarder and every registered holder exited. Once a place
// is free again, the next process receives the same tensor.
TEST_P(HostileFrameTest, ForwardedTensorIsRefusedWhileItsOriginsBoardHasNoPlaceForTheReceiver) {
  OriginProcess origin(GetParam());
  {
    const OneTensor received = origin.receive();
    const std::shared_ptr<detail::ReturnBoard> board = upstream_board_of(received);
    ASSERT_TRUE(board);
    // This process, the origin's receiver, holds the one other place.
    test::LivingChildren fillers(detail::ReturnBoard::kMaxHolders - 1);
    for (const detail::ProcessIdentity& filler : fillers.identities()) ASSERT_TRUE(board->register_holder(filler));
    const auto forward = [&](bool refused) {
      auto [tx, rx] = channel<OneTensor>(GetParam());
      const pid_t consumer = test::fork_child([&, &tx = tx, &rx = rx] {
        tx.detach();
        rx.adopt();
        if (refused) {
          try {
            rx.recv_for(kRecvBound);
            CHILD_CHECK(!"the frame was read");
          } catch (const TooManyHolders& error) {
            CHILD_CHECK(std::string(error.what()).find("cannot register as a holder") != std::string::npos);
          }
          // The refusal leaves the receiver broken (the frame was half consumed).
          try {
            rx.recv_for(kRecvBound);
            CHILD_CHECK(!"a broken receiver read on");
          } catch (const ProtocolError& error) {
            CHILD_CHECK(std::string(error.what()).find("broken") != std::string::npos);
          }
        } else {
          const auto got = rx.recv_for(kRecvBound);
          CHILD_CHECK(got.has_value() && got->tensor.data<float>()[0] == 2.0f);
        }
      });
      rx.detach();
      tx.send(received);
      EXPECT_TRUE(test::child_succeeded(consumer));
      tx.close();
    };
    forward(true);
    EXPECT_TRUE(fillers.end());
    forward(false);
  }
  EXPECT_TRUE(origin.finish());
}

// A forked process that takes a used receiver over holds what arrived so far, so it must be
// a registered holder before it reads on: with no place on the connection's board for it,
// its reads throw (its adopt() could not register, and the sender could recycle those
// blocks once the process that received them exited). The next frame names no new block
// (the same storage again, a lease), so nothing in decoding it would register: the read
// itself must refuse.
TEST_P(HostileFrameTest, ProcessThatTookAReceiverOverRefusesToReadWhileTheBoardHasNoPlaceForIt) {
  OriginProcess origin(GetParam(), 2);
  Receiver<OneTensor>& rx = origin.receiver();
  {
    const OneTensor first = origin.receive();
    const std::shared_ptr<detail::ReturnBoard> board = upstream_board_of(first);
    ASSERT_TRUE(board);
    test::LivingChildren fillers(detail::ReturnBoard::kMaxHolders - 1);  // this process holds the other place
    for (const detail::ProcessIdentity& filler : fillers.identities()) ASSERT_TRUE(board->register_holder(filler));
    const pid_t taker = test::fork_child([&, &rx = rx] {
      rx.adopt();
      try {
        rx.recv_for(kRecvBound);
        CHILD_CHECK(!"the receiver read on");
      } catch (const TooManyHolders& error) {
        CHILD_CHECK(std::string(error.what()).find("cannot register as a holder") != std::string::npos);
      }
    });
    EXPECT_TRUE(test::child_succeeded(taker));
    EXPECT_TRUE(fillers.end());
    // The taker's copy broke, not this process's: once it takes the end back from the
    // taker, which exited, it reads on (the same storage again).
    rx.adopt();
    const OneTensor second = rx.recv_for(kRecvBound).value();
    EXPECT_EQ(second.tensor.data<float>(), first.tensor.data<float>());
    EXPECT_EQ(second.tensor.data<float>()[0], 2.0f);
  }
  EXPECT_TRUE(origin.finish());
}

TEST_P(HostileFrameTest, BlockInASegmentSlotThatWasNeverGranted) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  detail::HandleEntry e = frame.entry(0);
  e.segment_slot = 9;
  frame.set_entry(0, e);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "holds no segment lease");
}

TEST_P(HostileFrameTest, ContainerSizeLie) {
  Wire<std::vector<std::int64_t>> wire(GetParam());
  Frame frame = encode(std::vector<std::int64_t>{1, 2, 3}, passing());
  frame.patch_body(0, std::uint64_t{1} << 50);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "message body holds a container size of " + std::to_string(std::uint64_t{1} << 50) +
                                     " elements but only 24 bytes remain");
}

TEST_P(HostileFrameTest, BoolThatIsNeitherZeroNorOne) {
  Wire<bool> wire(GetParam());
  Frame frame = encode(true, passing());
  frame.patch_body(0, std::uint8_t{7});
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "bool");
}

// Found by the body fuzz target: cereal reports a std::variant index out of range with a
// cereal::Exception, which escaped the receiver as an unknown exception and did not mark
// the channel broken.
TEST_P(HostileFrameTest, VariantIndexOutOfRange) {
  using Either = std::variant<std::int32_t, Tensor, std::string>;
  Wire<Either> wire(GetParam());
  Frame frame = encode(Either{std::int32_t{5}}, passing());
  frame.patch_body(0, std::int32_t{7});  // cereal writes the index as an int32 first
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "message body is not a valid std::variant<");
}

// Found by the body fuzz target: a tensor without elements whose other extents make its
// strides overflow int64 (undefined behaviour before the fix).
TEST_P(HostileFrameTest, ZeroElementTensorWhoseStridesOverflow) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{Tensor::zeros({0, 2, 2}, DType::Float32, Device::SharedCpu)}, passing());
  frame.patch_body(kShapeAt + 8, std::int64_t{1} << 40);
  frame.patch_body(kShapeAt + 16, std::int64_t{1} << 40);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "overflow");
}

// The fields in front of a tensor's shape: its state byte, its number of dimensions (at
// most kMaxDims; more would be a shape allocated from a count the peer chose), and a
// tensor without a storage that claims elements.
TEST_P(HostileFrameTest, TensorStateAndDimensionLies) {
  const std::vector<std::pair<std::string, std::function<void(Frame&)>>> lies = {
      {"invalid state byte 7", [](Frame& f) { f.patch_body(kStateAt, std::uint8_t{7}); }},
      {"33 dimensions, above the limit of 32",
       [](Frame& f) { f.patch_body(kDimensionsAt, static_cast<std::uint32_t>(kMaxDims + 1)); }},
      {"4294967295 dimensions", [](Frame& f) { f.patch_body(kDimensionsAt, ~std::uint32_t{0}); }},
      {"tensor without storage claims 32 elements", [](Frame& f) { f.patch_body(kStateAt, std::uint8_t{1}); }},
      {"tensor has a negative size -4",
       [](Frame& f) {
         f.patch_body(kStateAt, std::uint8_t{1});
         f.patch_body(kShapeAt, std::int64_t{-4});
       }},
  };
  for (const auto& [needle, lie] : lies) {
    SCOPED_TRACE(needle);
    Wire<OneTensor> wire(GetParam());
    Frame frame = encode(OneTensor{tensor_}, passing());
    lie(frame);
    wire.send(frame.bytes, frame.fds);
    expect_protocol_error(wire.rx, needle);
  }
}

// A sender that saw its receiver as gone reclaimed the frames it had not resolved and may
// recycle their blocks: the board says so (abandoned), and a receiver that reads such a
// frame late must refuse it instead of showing memory that now belongs to someone else.
TEST_P(HostileFrameTest, FrameTheSenderGaveUpOnIsRefused) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  frame.encoder->receiver_gone();
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "the sender gave up on frame 1");
}

TEST_P(HostileFrameTest, TypeMismatchNamesBothTypes) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(Other{42}, passing());
  wire.send(frame.bytes, frame.fds);
  try {
    wire.rx.recv();
    ADD_FAILURE() << "expected TypeMismatch";
  } catch (const TypeMismatch& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find(std::string(detail::type_name<Other>())), std::string::npos) << what;
    EXPECT_NE(what.find(std::string(detail::type_name<OneTensor>())), std::string::npos) << what;
  }
}

TEST_P(HostileFrameTest, ProcessKeepsWorkingOnOtherChannelsAfterABadFrame) {
  Wire<OneTensor> bad(GetParam());
  Frame frame = encode(OneTensor{tensor_}, passing());
  frame.patch_body(kDTypeAt, std::uint8_t{99});
  bad.send(frame.bytes, frame.fds);
  EXPECT_THROW(bad.rx.recv(), ProtocolError);
  auto [tx, rx] = channel<OneTensor>(GetParam());
  tx.send(OneTensor{tensor_});
  EXPECT_TRUE(rx.recv().has_value());
}

TEST_P(HostileFrameTest, HeaderClaimsFdsTheTransportDidNotCarry) {
  Wire<OneTensor> wire(GetParam());
  Frame frame = encode(OneTensor{tensor_});  // fd passing, but the fds are not sent
  wire.send(frame.bytes);
  expect_protocol_error(wire.rx, std::to_string(frame.header().fd_count) + " file descriptors but 0 arrived");
}

// ---- fds that lie (Unix socket only: the only transport that carries fds) ----------

class HostileFdTest : public test::LeakCheckedTest {
 protected:
  Tensor tensor_ = Tensor::zeros({4, 8}, DType::Float32, Device::SharedCpu);
};

// The frame's fds with the tensor segment's replaced by `fd` (the return board's is kept).
std::vector<int> with_data_fd(const Frame& frame, int fd) {
  std::vector<int> fds = frame.fds;
  fds.at(kDataSegment) = fd;
  return fds;
}

TEST_F(HostileFdTest, FdThatIsNotAMemfd) {
  Wire<OneTensor> wire(Transport::UnixSocket);
  Frame frame = encode(OneTensor{tensor_});
  int pipe_ends[2];
  ASSERT_EQ(::pipe2(pipe_ends, O_CLOEXEC), 0);
  detail::UniqueFd read_end(pipe_ends[0]), write_end(pipe_ends[1]);
  wire.send(frame.bytes, with_data_fd(frame, read_end.get()));
  expect_protocol_error(wire.rx, "not a memfd");
}

TEST_F(HostileFdTest, MemfdWithoutSeals) {
  Wire<OneTensor> wire(Transport::UnixSocket);
  Frame frame = encode(OneTensor{tensor_});
  detail::UniqueFd unsealed(::memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(unsealed);
  ASSERT_EQ(::ftruncate(unsealed.get(), static_cast<off_t>(frame.segment(kDataSegment).size)), 0);
  wire.send(frame.bytes, with_data_fd(frame, unsealed.get()));
  expect_protocol_error(wire.rx, "not sealed");
}

TEST_F(HostileFdTest, ReturnBoardFdThatIsNotAMemfd) {
  Wire<OneTensor> wire(Transport::UnixSocket);
  Frame frame = encode(OneTensor{tensor_});
  int pipe_ends[2];
  ASSERT_EQ(::pipe2(pipe_ends, O_CLOEXEC), 0);
  detail::UniqueFd read_end(pipe_ends[0]), write_end(pipe_ends[1]);
  std::vector<int> fds = frame.fds;
  fds.at(0) = read_end.get();
  wire.send(frame.bytes, fds);
  expect_protocol_error(wire.rx, "not a memfd");
}

// A peer built with another layout of the return board (version 3, before forwarded blocks)
// is refused at its first storage, before the receiver writes anything into the board.
TEST_F(HostileFdTest, ReturnBoardOfAnotherVersion) {
  for (const std::size_t word : {std::size_t{0}, std::size_t{8}}) {  // magic, version << 32 | slots
    SCOPED_TRACE(word);
    Wire<OneTensor> wire(Transport::UnixSocket);
    Frame frame = encode(OneTensor{tensor_});
    std::uint64_t value = 0;
    ASSERT_EQ(::pread(frame.fds.at(0), &value, sizeof value, static_cast<off_t>(word)), 8);
    value = word == 0 ? value + 1 : (std::uint64_t{3} << 32 | (value & 0xffffffffu));
    ASSERT_EQ(::pwrite(frame.fds.at(0), &value, sizeof value, static_cast<off_t>(word)), 8);
    wire.send(frame.bytes, frame.fds);
    expect_protocol_error(wire.rx, "return board has a wrong magic number or version");
  }
}

TEST_F(HostileFdTest, SealedSegmentSmallerThanItClaims) {
  Wire<OneTensor> wire(Transport::UnixSocket);
  Frame frame = encode(OneTensor{tensor_});
  const std::uint64_t claimed = frame.segment(kDataSegment).size;
  detail::SharedMemory small = detail::SharedMemory::create(64);  // the frame claims a whole segment
  wire.send(frame.bytes, with_data_fd(frame, small.fd()));
  expect_protocol_error(wire.rx, "frame claims " + std::to_string(claimed));
}

TEST_F(HostileFdTest, MoreFdsThanHandles) {
  Wire<OneTensor> wire(Transport::UnixSocket);
  Frame frame = encode(OneTensor{tensor_});
  detail::FrameHeader h = frame.header();
  h.fd_count = 0;  // header says none, but they arrive with the frame
  frame.set_header(h);
  wire.send(frame.bytes, frame.fds);
  expect_protocol_error(wire.rx, "fd");
}

TEST_F(HostileFdTest, MoreFdsThanFdSegments) {
  Wire<OneTensor> wire(Transport::UnixSocket);
  Frame frame = encode(OneTensor{tensor_});
  detail::FrameHeader h = frame.header();
  h.fd_count += 1;  // one fd more than the segment table has NewFd entries
  frame.set_header(h);
  std::vector<int> fds = frame.fds;
  fds.push_back(frame.fds.at(kDataSegment));
  wire.send(frame.bytes, fds);
  expect_protocol_error(wire.rx, "fd");
}

TEST_F(HostileFdTest, FewerFdsThanTheHeaderClaims) {
  Wire<OneTensor> wire(Transport::UnixSocket);
  Frame frame = encode(OneTensor{tensor_});
  wire.send(frame.bytes);  // the fd is missing
  expect_protocol_error(wire.rx, "file descriptors");
}

TEST_F(HostileFdTest, HeaderClaimsMoreFdsThanHandles) {
  Wire<OneTensor> wire(Transport::UnixSocket);
  Frame frame = encode(OneTensor{tensor_});
  detail::FrameHeader h = frame.header();
  const std::uint32_t segments = h.segment_count;  // the return board and the tensor's segment
  h.fd_count = segments + 1;
  frame.set_header(h);
  std::vector<int> fds = frame.fds;
  fds.push_back(frame.fds.at(kDataSegment));
  wire.send(frame.bytes, fds);
  expect_protocol_error(
      wire.rx, "claims " + std::to_string(segments + 1) + " fds for only " + std::to_string(segments) + " segments");
}

TEST_F(HostileFdTest, FdsWithAFrameThatDeclaresNone) {
  // Before the fix, these fds were queued silently (and handed to a later frame's
  // handles): a peer could fill this process's fd table without declaring a single fd.
  Wire<Other> wire(Transport::UnixSocket);
  Frame frame = encode(Other{1});
  detail::UniqueFd a(::memfd_create("stray", MFD_CLOEXEC)), b(::memfd_create("stray", MFD_CLOEXEC));
  ASSERT_TRUE(a && b);
  wire.send(frame.bytes, {a.get(), b.get()});
  expect_protocol_error(wire.rx, "declares 0 (fd_count)");
}

TEST_F(HostileFdTest, FdForAHandleThatIsLeased) {
  Wire<OneTensor> wire(Transport::UnixSocket);
  detail::MessageEncoder encoder(detail::HandlePassing::FdPassing);
  auto flatten = [&](const detail::EncodedFrame& encoded) {
    Frame frame;
    for (const iovec& part : encoded.iovecs()) {
      const auto* begin = static_cast<const std::byte*>(part.iov_base);
      frame.bytes.insert(frame.bytes.end(), begin, begin + part.iov_len);
    }
    // Duplicates: the encoder closes its return board's fd once the frame is committed.
    for (const int fd : encoded.fds) {
      frame.owned_fds.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
      frame.fds.push_back(frame.owned_fds.back().get());
    }
    frame.locate();
    encoder.commit();
    return frame;
  };
  Frame first = flatten(encoder.encode(OneTensor{tensor_}));
  wire.send(first.bytes, first.fds);
  ASSERT_TRUE(wire.rx.recv().has_value());
  Frame second = flatten(encoder.encode(OneTensor{tensor_}));  // travels as a lease: no fd, no segment
  detail::FrameHeader h = second.header();
  ASSERT_EQ(h.fd_count, 0u);
  ASSERT_EQ(h.segment_count, 0u);
  h.fd_count = 1;
  second.set_header(h);
  wire.send(second.bytes, {tensor_.storage()->shared_block()->segment()->fd()});
  expect_protocol_error(wire.rx, "claims 1 fds for only 0 segments");
  encoder.receiver_gone();  // the broken receiver will never give the first frame's block back
}

TEST_F(HostileFdTest, MemfdSealedAgainstShrinkingOnly) {
  Wire<OneTensor> wire(Transport::UnixSocket);
  Frame frame = encode(OneTensor{tensor_});
  detail::UniqueFd half_sealed(::memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(half_sealed);
  ASSERT_EQ(::ftruncate(half_sealed.get(), static_cast<off_t>(frame.segment(kDataSegment).size)), 0);
  ASSERT_EQ(::fcntl(half_sealed.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
  wire.send(frame.bytes, with_data_fd(frame, half_sealed.get()));
  expect_protocol_error(wire.rx, "not sealed");
}

// A memfd sealed against writing (F_SEAL_WRITE, or F_SEAL_FUTURE_WRITE) cannot be mapped
// for writing: the receiver maps every segment, and the return board, read-write. Such a fd
// is a lie about what ferry sends, refused like the others as a ProtocolError naming the
// seal, not an mmap failure.
TEST_F(HostileFdTest, MemfdSealedAgainstWriting) {
  for (const int write_seal : {F_SEAL_WRITE, F_SEAL_FUTURE_WRITE}) {
    for (const std::size_t segment : {kDataSegment, std::size_t{0}}) {  // a data segment, the return board
      Wire<OneTensor> wire(Transport::UnixSocket);
      Frame frame = encode(OneTensor{tensor_});
      detail::UniqueFd sealed(::memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING));
      ASSERT_TRUE(sealed);
      ASSERT_EQ(::ftruncate(sealed.get(), static_cast<off_t>(frame.segment(segment).size)), 0);
      ASSERT_EQ(::fcntl(sealed.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | write_seal), 0);
      std::vector<int> fds = frame.fds;
      fds.at(segment) = sealed.get();
      wire.send(frame.bytes, fds);
      expect_protocol_error(wire.rx, "sealed against writing");
    }
  }
}

// A sender that tries to shrink a segment after sending it cannot: ferry seals every
// segment against shrinking and growing, and seals the seals. The receiver's mapping stays
// readable; the most the sender can do is change the bytes (or punch holes, which read
// back as zeros), as with any memory it shares.
TEST_F(HostileFdTest, SenderCannotShrinkASegmentAfterSendingIt) {
  auto [tx, rx] = channel<OneTensor>(Transport::UnixSocket);
  auto [go_tx, go_rx] = channel<int>(Transport::UnixSocket);
  const std::int64_t count = 64 * 1024;
  const pid_t child = test::fork_child([&, &tx = tx, &rx = rx, &go_tx = go_tx, &go_rx = go_rx] {
    tx.detach();
    go_tx.detach();
    OneTensor got = rx.recv().value();
    CHILD_CHECK(go_rx.recv().value() == 1);                    // the sender has tried its worst
    const auto values = got.tensor.to_vector<std::int32_t>();  // reads every byte: no SIGBUS
    CHILD_CHECK(static_cast<std::int64_t>(values.size()) == count);
    for (const std::int32_t v : values) CHILD_CHECK(v == 7 || v == 0);
  });
  rx.close();
  go_rx.close();
  Tensor t = Tensor::empty({count}, DType::Int32, Device::SharedCpu);
  t.fill(std::int32_t{7});
  tx.send(OneTensor{t});
  const SharedBlock& block = *t.storage()->shared_block();
  const int fd = block.segment()->fd();
  const auto size = static_cast<off_t>(block.segment()->size());
  errno = 0;
  EXPECT_EQ(::ftruncate(fd, 0), -1);
  EXPECT_EQ(errno, EPERM) << "shrinking a sent segment must be refused by its seals";
  errno = 0;
  EXPECT_EQ(::ftruncate(fd, size / 2), -1);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_EQ(::ftruncate(fd, size * 2), -1);
  EXPECT_EQ(errno, EPERM) << "growing is sealed too";
  EXPECT_NE(::fcntl(fd, F_GET_SEALS) & F_SEAL_SEAL, 0) << "the seals themselves are sealed";
  errno = 0;
  EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
  EXPECT_EQ(errno, EPERM);
  // Allowed by the seals: freeing the pages of the first half of the tensor's block. They
  // read back as zeros.
  EXPECT_EQ(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(block.offset()),
                        static_cast<off_t>(t.storage()->nbytes() / 2)),
            0);
  go_tx.send(1);
  tx.close();
  go_tx.close();
  EXPECT_TRUE(test::child_succeeded(child));
}

// A frame whose segment table names more passed fds than came with it, the missing one
// naming the identity of a segment this process already maps: refused before the cache is
// consulted (the identity of a passed fd is read from the fd, never taken from the frame).
TEST_F(HostileFdTest, FdSegmentWhoseFdIsMissingIsRefusedEvenWhenItsIdentityIsMapped) {
  Wire<OneTensor> wire(Transport::UnixSocket);
  Frame frame = encode(OneTensor{tensor_});
  detail::SegmentEntry e = frame.segment(kDataSegment);
  ASSERT_EQ(e.kind, static_cast<std::uint32_t>(detail::SegmentKind::NewFd));
  const detail::FileIdentity mapped = tensor_.storage()->shared_block()->segment()->identity();
  e.device = mapped.device;
  e.inode = mapped.inode;
  frame.set_segment(kDataSegment, e);
  detail::FrameHeader h = frame.header();
  h.fd_count -= 1;  // only the return board's fd travels
  frame.set_header(h);
  wire.send(frame.bytes, {frame.fds.at(0)});
  expect_protocol_error(wire.rx, "more fd segments than the 1 fds");
}

// The /proc path of the pipe transport gets the same checks as a passed fd, in the same
// order: seals first, then identity and size (read once the seals make them final).
class HostileProcPathTest : public HostileFdTest {
 protected:
  // A Pipe frame for tensor_ whose data segment names `fd` of this process, with `claimed`
  // identity.
  Frame frame_naming(int fd, const detail::FileIdentity& claimed) {
    Frame frame = encode(OneTensor{tensor_}, detail::HandlePassing::ProcFd);
    detail::SegmentEntry e = frame.segment(kDataSegment);
    EXPECT_EQ(e.kind, static_cast<std::uint32_t>(detail::SegmentKind::NewProcFd));
    e.fd = fd;
    e.device = claimed.device;
    e.inode = claimed.inode;
    frame.set_segment(kDataSegment, e);
    return frame;
  }
  std::uint64_t claimed_size() {
    return encode(OneTensor{tensor_}, detail::HandlePassing::ProcFd).segment(kDataSegment).size;
  }
};

TEST_F(HostileProcPathTest, UnsealedMemfdIsRefused) {
  Wire<OneTensor> wire(Transport::Pipe);
  detail::UniqueFd unsealed(::memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(unsealed);
  ASSERT_EQ(::ftruncate(unsealed.get(), static_cast<off_t>(claimed_size())), 0);
  Frame frame = frame_naming(unsealed.get(), detail::identify_fd(unsealed.get()));
  wire.send(frame.bytes);
  expect_protocol_error(wire.rx, "not sealed");
}

TEST_F(HostileProcPathTest, MemfdSealedAgainstShrinkingOnlyIsRefused) {
  Wire<OneTensor> wire(Transport::Pipe);
  detail::UniqueFd half_sealed(::memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(half_sealed);
  ASSERT_EQ(::ftruncate(half_sealed.get(), static_cast<off_t>(claimed_size())), 0);
  ASSERT_EQ(::fcntl(half_sealed.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
  Frame frame = frame_naming(half_sealed.get(), detail::identify_fd(half_sealed.get()));
  wire.send(frame.bytes);
  expect_protocol_error(wire.rx, "not sealed");
}

TEST_F(HostileProcPathTest, SealedSegmentSmallerThanItClaimsIsRefused) {
  Wire<OneTensor> wire(Transport::Pipe);
  detail::SharedMemory small = detail::SharedMemory::create(64);
  Frame frame = frame_naming(small.fd(), small.identity());
  wire.send(frame.bytes);
  expect_protocol_error(wire.rx, "frame claims " + std::to_string(claimed_size()));
}

TEST_F(HostileProcPathTest, SealedSegmentThatIsNotTheOneNamedIsRefused) {
  Wire<OneTensor> wire(Transport::Pipe);
  detail::SharedMemory other = detail::SharedMemory::create(claimed_size());
  detail::FileIdentity claimed = other.identity();
  claimed.inode += 1;  // not the identity of the file at the path
  Frame frame = frame_naming(other.fd(), claimed);
  wire.send(frame.bytes);
  expect_protocol_error(wire.rx, "is not the segment the frame names");
}

// The kernel lets a receiver open a sender's fd (/proc/<pid>/fd, pidfd_getfd) only when it
// may ptrace the sender, so a sender that names its segments by fd cannot name one it does
// not hold. A sender of another user (a worker that dropped its privileges: this process can
// reach it, not the other way round) names in its frame the identity of a segment this
// process maps already, which it could never open itself: the receiver must not take the
// identity on trust, and so hand the sender's message a view of its own memory (or of
// another peer's), to read and write as the sender's tensor.
TEST_F(HostileProcPathTest, SenderOfAnotherUserCannotNameASegmentMappedHere) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a sender as another user";
  constexpr uid_t kNobody = 65534;
  Wire<OneTensor> wire(Transport::Pipe);
  Tensor secret = Tensor::empty({1024}, DType::Int32, Device::SharedCpu);
  secret.fill(std::int32_t{42});
  const SharedBlock& block = *secret.storage()->shared_block();
  const detail::FileIdentity mapped = block.segment()->identity();
  int go[2];
  ASSERT_EQ(::pipe2(go, O_CLOEXEC), 0);
  detail::UniqueFd go_read(go[0]), go_write(go[1]);
  const pid_t child = test::fork_child([&] {
    if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) throw std::runtime_error("cannot become nobody");
    Frame frame =
        encode(OneTensor{Tensor::zeros({1024}, DType::Int32, Device::SharedCpu)}, detail::HandlePassing::ProcFd);
    detail::SegmentEntry e = frame.segment(kDataSegment);
    CHILD_CHECK(e.kind == static_cast<std::uint32_t>(detail::SegmentKind::NewProcFd));
    e.device = mapped.device;
    e.inode = mapped.inode;
    e.size = block.segment()->size();
    frame.set_segment(kDataSegment, e);
    detail::HandleEntry h = frame.entry(0);
    h.offset = block.offset();
    frame.set_entry(0, h);
    wire.send(frame.bytes);
    char byte = 0;
    CHILD_CHECK(::read(go_read.get(), &byte, 1) == 1);  // alive until the receiver is done
  });
  expect_protocol_error(wire.rx, "is not the segment the frame names");
  char byte = 0;
  ASSERT_EQ(::write(go_write.get(), &byte, 1), 1);
  EXPECT_TRUE(test::child_succeeded(child));
}

TEST_F(HostileFdTest, ProcPathToAForeignFileIsRefused) {
  Wire<OneTensor> wire(Transport::Pipe);
  Frame frame = encode(OneTensor{tensor_}, detail::HandlePassing::ProcFd);
  detail::SegmentEntry e = frame.segment(kDataSegment);
  ASSERT_EQ(e.kind, static_cast<std::uint32_t>(detail::SegmentKind::NewProcFd));
  e.fd = 0;  // stdin: not the segment the frame names
  e.inode += 1;
  frame.set_segment(kDataSegment, e);
  wire.send(frame.bytes);
  expect_protocol_error(wire.rx, "/proc/");
}

// The tensor record, byte for byte (tensor_wire.cpp): state, dtype, device, ndim, sizes,
// strides, offset, handle. The device is the one the tensor had when it was sent, also for
// a heap tensor that sending moves into shared memory.
TEST(TensorRecordTest, IsWrittenFieldByFieldWithTheDeviceTheTensorHadWhenSent) {
  const Tensor heap = Tensor::zeros({3, 5}, DType::Float32, Device::Cpu).slice(1, 1, 4);
  const Frame frame = encode(OneTensor{heap});
  const std::byte* body = frame.bytes.data() + frame.body_offset;
  const auto read = [&](std::size_t at, auto value) {
    std::memcpy(&value, body + at, sizeof value);
    return value;
  };
  EXPECT_EQ(frame.header().body_bytes, kHandleAt + 4);
  EXPECT_EQ(read(kStateAt, std::uint8_t{}), 2);  // stored
  EXPECT_EQ(read(kDTypeAt, std::uint8_t{}), static_cast<std::uint8_t>(DType::Float32));
  EXPECT_EQ(read(kDTypeAt + 1, std::uint8_t{}), static_cast<std::uint8_t>(DeviceKind::Cpu));
  EXPECT_EQ(heap.device().kind, DeviceKind::SharedCpu);  // sending moved the storage into shared memory
  EXPECT_EQ(read(kDimensionsAt, std::uint32_t{}), 2u);
  EXPECT_EQ(read(kShapeAt, std::int64_t{}), 3);
  EXPECT_EQ(read(kShapeAt + 8, std::int64_t{}), 3);
  EXPECT_EQ(read(kStridesAt, std::int64_t{}), 5);
  EXPECT_EQ(read(kStridesAt + 8, std::int64_t{}), 1);
  EXPECT_EQ(read(kOffsetAt, std::int64_t{}), 1);
  EXPECT_EQ(read(kHandleAt, std::uint32_t{}), 0u);
}

}  // namespace
}  // namespace ferry
