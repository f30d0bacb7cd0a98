// The byte path of plain messages in one process: FrameBody (a private buffer that moves
// into memory a transport lends once the body is large) and the input archive's
// single-copy reads of vectors of numbers and strings.
#include <gtest/gtest.h>

#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "ferry/detail/body_reader.hpp"
#include "ferry/detail/frame_body.hpp"
#include "ferry/detail/message_encoder.hpp"

namespace ferry {
namespace {

using namespace ferry::detail;  // frame bodies and the encoder

std::vector<std::byte> pattern_bytes(std::size_t size, unsigned seed) {
  std::vector<std::byte> bytes(size);
  for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<std::byte>(i * 7 + seed);
  return bytes;
}

// A BodySpace over a buffer of its own, lending at most `limit` bytes; counts calls.
class FakeSpace : public detail::BodySpace {
 public:
  explicit FakeSpace(std::size_t limit) : memory_(limit) {}
  std::span<std::byte> lend(std::size_t bytes) override {
    ++calls;
    if (bytes > memory_.size()) return {};
    return {memory_.data(), memory_.size()};
  }
  const std::byte* data() const { return memory_.data(); }
  int calls = 0;

 private:
  std::vector<std::byte> memory_;
};

void append_all(detail::FrameBody& body, const std::vector<std::byte>& bytes, std::size_t piece) {
  for (std::size_t at = 0; at < bytes.size(); at += piece) {
    body.append(bytes.data() + at, std::min(piece, bytes.size() - at));
  }
}

bool same(std::span<const std::byte> got, const std::vector<std::byte>& want) {
  return got.size() == want.size() && std::memcmp(got.data(), want.data(), want.size()) == 0;
}

TEST(FrameBodyTest, SmallBodyStaysPrivateAndIsReusedFrameAfterFrame) {
  FakeSpace space(1 << 20);
  detail::FrameBody body;
  const auto bytes = pattern_bytes(detail::FrameBody::kLendFrom - 1, 1);
  body.reset(&space);
  append_all(body, bytes, 100);
  EXPECT_FALSE(body.lent());
  EXPECT_EQ(space.calls, 0);
  EXPECT_TRUE(same(body.bytes(), bytes));
  const std::byte* first = body.bytes().data();
  body.reset(&space);
  EXPECT_EQ(body.size(), 0u);
  append_all(body, bytes, 1000);
  EXPECT_EQ(body.bytes().data(), first);  // the private buffer is kept
  EXPECT_TRUE(same(body.bytes(), bytes));
}

TEST(FrameBodyTest, LargeBodyMovesIntoLentMemoryWithWhatItHeld) {
  FakeSpace space(1 << 20);
  detail::FrameBody body;
  body.reset(&space);
  const auto bytes = pattern_bytes(300'000, 2);
  append_all(body, bytes, 5000);
  EXPECT_TRUE(body.lent());
  EXPECT_EQ(body.bytes().data(), space.data());
  EXPECT_EQ(space.calls, 1);  // the space lent all it had at once
  EXPECT_TRUE(same(body.bytes(), bytes));
}

TEST(FrameBodyTest, RefusedLendKeepsTheBodyPrivate) {
  FakeSpace space(1000);  // less than any large body
  detail::FrameBody body;
  body.reset(&space);
  const auto bytes = pattern_bytes(100'000, 3);
  append_all(body, bytes, 3000);
  EXPECT_FALSE(body.lent());
  EXPECT_EQ(space.calls, 1);  // asked once, then not again for this frame
  EXPECT_TRUE(same(body.bytes(), bytes));
}

TEST(FrameBodyTest, BodyOutgrowingLentMemoryMovesBackIntoPrivateMemory) {
  FakeSpace space(64 << 10);
  detail::FrameBody body;
  body.reset(&space);
  const auto bytes = pattern_bytes(200'000, 4);
  append_all(body, bytes, 10'000);
  EXPECT_FALSE(body.lent());
  EXPECT_EQ(space.calls, 2);  // lent at 16 KiB, refused past 64 KiB
  EXPECT_TRUE(same(body.bytes(), bytes));
  // The next frame starts private again and may be lent again.
  body.reset(&space);
  append_all(body, pattern_bytes(20'000, 5), 20'000);
  EXPECT_TRUE(body.lent());
}

TEST(FrameBodyTest, WithoutASpaceABodyOfAnySizeIsPrivate) {
  detail::FrameBody body;
  body.reset(nullptr);
  const auto bytes = pattern_bytes(1 << 20, 6);
  append_all(body, bytes, 1 << 20);
  EXPECT_FALSE(body.lent());
  EXPECT_TRUE(same(body.bytes(), bytes));
}

// ---- borrowed bytes: a byte message's elements written from where it holds them ---------

TEST(FrameBodyTest, LargeBorrowedBytesStayInPlaceAfterWhatWasAppended) {
  FrameBody body;
  body.allow_borrowing(true);
  body.reset(nullptr);
  const auto head = pattern_bytes(8, 7);
  const auto bytes = pattern_bytes(FrameBody::kBorrowFrom, 8);
  append_all(body, head, 8);
  body.append_borrowed(bytes.data(), bytes.size());
  EXPECT_TRUE(same(body.bytes(), head));
  EXPECT_EQ(body.borrowed().data(), bytes.data());
  EXPECT_EQ(body.borrowed().size(), bytes.size());
  EXPECT_EQ(body.size(), head.size() + bytes.size());
  body.reset(nullptr);  // the next frame borrows nothing until it asks
  EXPECT_TRUE(body.borrowed().empty());
  EXPECT_EQ(body.size(), 0u);
}

TEST(FrameBodyTest, BorrowedBytesAreCopiedWhenSmallNotAllowedOrLent) {
  const auto small = pattern_bytes(FrameBody::kBorrowFrom - 1, 9);
  const auto large = pattern_bytes(100'000, 10);
  FrameBody body;
  body.allow_borrowing(true);
  body.reset(nullptr);
  body.append_borrowed(small.data(), small.size());
  EXPECT_TRUE(body.borrowed().empty());
  EXPECT_TRUE(same(body.bytes(), small));

  body.allow_borrowing(false);
  body.reset(nullptr);
  body.append_borrowed(large.data(), large.size());
  EXPECT_TRUE(body.borrowed().empty());
  EXPECT_TRUE(same(body.bytes(), large));

  FakeSpace space(1 << 20);  // a transport that lends memory: the body goes there
  body.allow_borrowing(true);
  body.reset(&space);
  body.append_borrowed(large.data(), large.size());
  EXPECT_TRUE(body.borrowed().empty());
  EXPECT_TRUE(body.lent());
  EXPECT_TRUE(same(body.bytes(), large));
}

TEST(FrameBodyTest, BytesAppendedAfterBorrowedOnesCopyThemInFirst) {
  const auto first = pattern_bytes(50'000, 11);
  const auto second = pattern_bytes(40'000, 12);
  const auto tail = pattern_bytes(3, 13);
  FrameBody body;
  body.allow_borrowing(true);
  body.reset(nullptr);
  body.append_borrowed(first.data(), first.size());
  body.append_borrowed(second.data(), second.size());  // one borrow per body: copied in after
  body.append(tail.data(), tail.size());
  std::vector<std::byte> want = first;
  want.insert(want.end(), second.begin(), second.end());
  want.insert(want.end(), tail.begin(), tail.end());
  EXPECT_TRUE(body.borrowed().empty());
  EXPECT_TRUE(same(body.bytes(), want));
  EXPECT_EQ(body.size(), want.size());
}

// The frame's bytes in order, whatever parts they are in.
std::vector<std::byte> flatten(const EncodedFrame& frame) {
  std::vector<std::byte> out;
  for (const iovec& part : frame.iovecs()) {
    const auto* begin = static_cast<const std::byte*>(part.iov_base);
    out.insert(out.end(), begin, begin + part.iov_len);
  }
  return out;
}

// Whether a part of `frame` lies in [data, data + size).
bool refers_to(const EncodedFrame& frame, const void* data, std::size_t size) {
  const auto* begin = static_cast<const std::byte*>(data);
  for (const iovec& part : frame.iovecs()) {
    const auto* at = static_cast<const std::byte*>(part.iov_base);
    if (at >= begin && at < begin + size) return true;
  }
  return false;
}

template <class T>
void expect_borrowed_frame_is_the_copied_one(const T& message, std::size_t bytes) {
  MessageEncoder copying(HandlePassing::FdPassing);
  MessageEncoder borrowing(HandlePassing::FdPassing);
  borrowing.borrow_message_bytes(true);
  const std::vector<std::byte> copied = flatten(copying.encode(message));
  const EncodedFrame& frame = borrowing.encode(message);
  EXPECT_EQ(frame.iovecs().back().iov_base, static_cast<const void*>(message.data()));
  EXPECT_EQ(frame.iovecs().back().iov_len, bytes);
  EXPECT_EQ(flatten(frame), copied);  // the same frame on the wire
  copying.rollback();
  borrowing.rollback();
}

TEST(FrameBodyTest, AByteMessagesElementsAreWrittenFromWhereItHoldsThem) {
  const std::vector<std::uint8_t> bytes(100'000, 5);
  expect_borrowed_frame_is_the_copied_one(bytes, bytes.size());
  std::vector<float> floats(30'000);
  std::iota(floats.begin(), floats.end(), 0.5f);
  expect_borrowed_frame_is_the_copied_one(floats, floats.size() * sizeof(float));
  const std::string text(70'000, 'x');
  expect_borrowed_frame_is_the_copied_one(text, text.size());
}

struct Holder {
  std::vector<std::uint8_t> bytes;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(bytes);
  }
};

// Its save() serializes a vector made for the moment: gone before the frame is written.
struct Packed {
  std::size_t size = 0;
  template <class Archive>
  void save(Archive& ar) const {
    ar(std::vector<std::uint8_t>(size, 3));
  }
  template <class Archive>
  void load(Archive& ar) {
    std::vector<std::uint8_t> bytes;
    ar(bytes);
    size = bytes.size();
  }
};

// Encodes `message` with and without borrowing: the same frame, in as many parts.
template <class T>
void expect_nothing_borrowed(const T& message) {
  MessageEncoder copying(HandlePassing::FdPassing);
  MessageEncoder borrowing(HandlePassing::FdPassing);
  borrowing.borrow_message_bytes(true);
  const EncodedFrame& expected = copying.encode(message);
  const EncodedFrame& frame = borrowing.encode(message);
  EXPECT_EQ(frame.part_count, expected.part_count);
  EXPECT_EQ(flatten(frame), flatten(expected));
  copying.rollback();
  borrowing.rollback();
}

TEST(FrameBodyTest, OnlyAByteMessagesOwnElementsAreBorrowed) {
  const Holder holder{std::vector<std::uint8_t>(100'000, 4)};
  expect_nothing_borrowed(holder);  // a member: not the message
  expect_nothing_borrowed(Packed{100'000});
  expect_nothing_borrowed(std::vector<std::uint8_t>(FrameBody::kBorrowFrom - 1, 6));  // small
  MessageEncoder encoder(HandlePassing::FdPassing);
  encoder.borrow_message_bytes(true);
  const EncodedFrame& frame = encoder.encode(holder);
  EXPECT_FALSE(refers_to(frame, holder.bytes.data(), holder.bytes.size()));
  encoder.rollback();
}

// ---- input archive: vectors and strings copied once ------------------------------------

struct Mixed {
  std::uint8_t tag = 0;  // puts the next fields at odd offsets of the body
  std::vector<float> floats;
  std::vector<std::uint8_t> bytes;
  std::string text;
  std::vector<std::int64_t> empty;
  std::vector<double> doubles;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(tag, floats, bytes, text, empty, doubles);
  }
  bool operator==(const Mixed&) const = default;
};

std::vector<std::byte> encode_body(const Mixed& message) {
  detail::MessageEncoder encoder(detail::HandlePassing::FdPassing);
  const detail::EncodedFrame& frame = encoder.encode(message);
  const iovec& body = frame.iovecs().back();
  const auto* begin = static_cast<const std::byte*>(body.iov_base);
  std::vector<std::byte> out(begin, begin + body.iov_len);
  encoder.rollback();
  return out;
}

Mixed sample() {
  Mixed message;
  message.tag = 9;
  message.floats.resize(1000);
  std::iota(message.floats.begin(), message.floats.end(), 0.5f);
  message.bytes.resize(70'000);
  for (std::size_t i = 0; i < message.bytes.size(); ++i) message.bytes[i] = static_cast<std::uint8_t>(i * 13);
  message.text = std::string(5000, 'x') + "end";
  message.doubles = {1.25, -2.5, 1e300};
  return message;
}

TEST(FrameBodyTest, VectorsAndStringsReadBackAtAnyAlignment) {
  const Mixed message = sample();
  const std::vector<std::byte> body = encode_body(message);
  // The same body at every offset modulo 8 of a buffer: the float and double arrays are
  // read both where they are aligned and where they are not.
  std::vector<std::byte> buffer(body.size() + 16);
  for (std::size_t shift = 0; shift < 8; ++shift) {
    std::memcpy(buffer.data() + shift, body.data(), body.size());
    const Mixed got = detail::read_body<Mixed>(std::span<const std::byte>(buffer.data() + shift, body.size()), {});
    EXPECT_EQ(got, message) << "body at offset " << shift;
  }
}

TEST(FrameBodyTest, TruncatedVectorIsAProtocolErrorNotAnOverread) {
  const std::vector<std::byte> body = encode_body(sample());
  // Cut inside the float array, inside the byte array and inside the string.
  for (const std::size_t cut : {std::size_t{30}, std::size_t{5000}, body.size() - 10}) {
    std::vector<std::byte> truncated(body.begin(), body.begin() + static_cast<std::ptrdiff_t>(cut));
    EXPECT_THROW(detail::read_body<Mixed>(truncated, {}), ProtocolError) << "cut at " << cut;
  }
}

TEST(FrameBodyTest, ElementCountBeyondTheBodyIsAProtocolError) {
  const std::vector<std::byte> body = encode_body(sample());
  // The float array's count sits right after the one-byte tag. More elements than bytes
  // left, and (the second) fewer elements than bytes but more than the bytes hold floats.
  for (const std::uint64_t count : {std::uint64_t{1} << 61, std::uint64_t{body.size() - 9}}) {
    std::vector<std::byte> lying = body;
    std::memcpy(lying.data() + 1, &count, sizeof count);
    EXPECT_THROW(detail::read_body<Mixed>(lying, {}), ProtocolError) << count;
  }
}

}  // namespace
}  // namespace ferry
