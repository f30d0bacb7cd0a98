// Frames over the pipe and Unix socket transports as the reader meets them: split at every
// place, back to back in one stream, cut short by a dying writer, lying about their length.
// A frame of up to kMaxStagedFrameBytes is read whole into the reader's buffer and handed
// out in place (read_view); a larger one is read into a payload of its own. Both are tested
// on each side of that size and of the buffer's initial 64 KiB. An untimed read hands a
// large byte message out before its body arrived (pending_body()): tested split wherever
// the reader changes how it reads, released unread, cut short, lying, and next to fds.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "ferry/detail/frame_channel.hpp"
#include "ferry/detail/transport.hpp"
#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "transport/stream_transport.hpp"

namespace ferry {
namespace {

using namespace ferry::detail;  // frames, fds and deadlines

using namespace std::chrono_literals;

// Body sizes on each side of the places where the reader changes how it reads: its initial
// buffer (64 KiB), and the largest frame it reads in place.
const std::vector<std::size_t> kBodySizes = {
    0,
    1,
    100,
    64 * 1024 - sizeof(FrameHeader),
    64 * 1024 - sizeof(FrameHeader) + 1,
    64 * 1024,
    200 * 1024 + 3,
    kMaxStagedFrameBytes - sizeof(FrameHeader),
    kMaxStagedFrameBytes - sizeof(FrameHeader) + 1,
    kMaxStagedFrameBytes + 4099,
};

// A valid frame header followed by `body` bytes numbered from `seed` (the reader checks the
// header only; what the body says is the decoder's business).
std::vector<std::byte> make_frame(std::size_t body, unsigned seed) {
  FrameHeader header;
  header.sequence = seed;
  header.body_bytes = body;
  std::vector<std::byte> bytes(sizeof header + body);
  std::memcpy(bytes.data(), &header, sizeof header);
  for (std::size_t i = 0; i < body; ++i) bytes[sizeof header + i] = static_cast<std::byte>((i * 13 + seed) % 251);
  return bytes;
}

bool same_body(std::span<const std::byte> payload, const std::vector<std::byte>& frame) {
  return payload.size() == frame.size() - sizeof(FrameHeader) &&
         std::memcmp(payload.data(), frame.data() + sizeof(FrameHeader), payload.size()) == 0;
}

// Writes all of `bytes` on `fd` (the writer end's stream, written around its FrameWriter),
// waiting for room while the stream is full.
void write_raw(int fd, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0 && errno == EINTR) continue;
    if (written < 0 && errno == EAGAIN) {
      pollfd entry{fd, POLLOUT, 0};
      ::poll(&entry, 1, -1);
      continue;
    }
    if (written < 0) throw std::runtime_error(std::string("test write: ") + std::strerror(errno));
    bytes = bytes.subspan(static_cast<std::size_t>(written));
  }
}

class StreamFrameTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {
 protected:
  void SetUp() override {
    test::LeakCheckedTest::SetUp();
    connect();
  }
  // A new connection (the test's earlier one, if any, is let go of).
  void connect() {
    auto [writer, reader] = make_transport(GetParam(), FrameLimits{}, 0);
    writer_ = std::move(writer);
    reader_ = std::move(reader);
    fd_ = writer_->descriptors().at(0);
  }
  void TearDown() override {
    writer_.reset();
    reader_.reset();
    test::LeakCheckedTest::TearDown();
  }

  // A writer in a child process that writes `prefix` of a frame and waits to be killed,
  // with the rest unwritten. `written` (a pipe's read end, the caller closes it) gets one
  // byte once the prefix is out. The test's own writer end is let go of.
  struct StoppedWriter {
    pid_t pid;
    int written;
  };
  StoppedWriter fork_writer_stopping_after(std::span<const std::byte> prefix) {
    int ready[2];
    if (::pipe(ready) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
    const pid_t child = test::fork_child([&] {
      reader_.reset();
      write_raw(fd_, prefix);
      const char byte = 'w';
      CHILD_CHECK(::write(ready[1], &byte, 1) == 1);
      ::pause();  // killed here, with the rest of the frame unwritten
    });
    ::close(ready[1]);
    writer_.reset();
    return {child, ready[0]};
  }

  // A read that finds less than a whole frame: it keeps what it read and times out.
  void expect_incomplete() {
    std::span<const std::byte> payload;
    ASSERT_EQ(reader_->read_view(header_, payload, buffer_, fds_, Deadline::now()), ReadStatus::Timeout);
  }
  // Writes `frame` in pieces that end at `cuts` (increasing, inside the frame) and at most
  // 16 KiB long (what a pipe holds while nobody reads), reading after each piece.
  void deliver_in_pieces(const std::vector<std::byte>& frame, const std::vector<std::size_t>& cuts) {
    std::size_t at = 0;
    std::size_t next_cut = 0;
    while (at < frame.size()) {
      std::size_t end = std::min(frame.size(), at + 16 * 1024);
      while (next_cut < cuts.size() && cuts[next_cut] <= at) ++next_cut;
      if (next_cut < cuts.size()) end = std::min(end, cuts[next_cut]);
      write_raw(fd_, std::span(frame).subspan(at, end - at));
      at = end;
      if (at < frame.size()) expect_incomplete();
    }
  }
  void expect_frame(const std::vector<std::byte>& frame) {
    std::span<const std::byte> payload;
    ASSERT_EQ(reader_->read_view(header_, payload, buffer_, fds_, Deadline::after(5s)), ReadStatus::Frame);
    FrameHeader sent;
    std::memcpy(&sent, frame.data(), sizeof sent);
    EXPECT_EQ(header_.sequence, sent.sequence);
    EXPECT_TRUE(same_body(payload, frame)) << "body of " << payload.size() << " bytes differs";
    reader_->release();
  }

  std::unique_ptr<FrameWriter> writer_;
  std::unique_ptr<FrameReader> reader_;
  int fd_ = -1;
  FrameHeader header_{};
  std::vector<std::byte> buffer_;
  std::deque<UniqueFd> fds_;
};

INSTANTIATE_TEST_SUITE_P(Transports, StreamFrameTest, ::testing::Values(Transport::Pipe, Transport::UnixSocket),
                         [](const ::testing::TestParamInfo<Transport>& info) {
                           return info.param == Transport::Pipe ? std::string("Pipe") : std::string("UnixSocket");
                         });

TEST_P(StreamFrameTest, ASmallFrameSplitAtEveryByteArrivesWhole) {
  const std::vector<std::byte> frame = make_frame(40, 1);
  for (std::size_t cut = 1; cut < frame.size(); ++cut) {
    SCOPED_TRACE("cut at byte " + std::to_string(cut));
    deliver_in_pieces(frame, {cut});
    expect_frame(frame);
  }
}

TEST_P(StreamFrameTest, FramesOfEverySizeSplitAroundTheHeaderAndTheBufferArriveWhole) {
  unsigned seed = 2;
  for (const std::size_t body : kBodySizes) {
    const std::vector<std::byte> frame = make_frame(body, seed++);
    const std::size_t header = sizeof(FrameHeader);
    const std::vector<std::vector<std::size_t>> cut_sets = {
        {},                                         // in 16 KiB pieces
        {1},                                        // one byte of the header first
        {header - 1},                               // all but one byte of the header
        {header},                                   // the header alone
        {header + 1},                               // the header and one byte of the body
        {64 * 1024 - 1, 64 * 1024, 64 * 1024 + 1},  // around the initial buffer
        {frame.size() - 1},                         // all but the last byte
    };
    for (const auto& cuts : cut_sets) {
      SCOPED_TRACE("body of " + std::to_string(body) + " bytes, first cut at " +
                   (cuts.empty() ? std::string("none") : std::to_string(cuts.front())));
      std::vector<std::size_t> inside;
      for (const std::size_t cut : cuts) {
        if (cut > 0 && cut < frame.size()) inside.push_back(cut);
      }
      deliver_in_pieces(frame, inside);
      expect_frame(frame);
    }
  }
}

TEST_P(StreamFrameTest, ReadCopiesWhatReadViewHandsOutInPlace) {
  for (const std::size_t body : {std::size_t{100}, std::size_t{300 * 1024}, kMaxStagedFrameBytes + 1}) {
    const std::vector<std::byte> frame = make_frame(body, 7);
    deliver_in_pieces(frame, {});
    std::vector<std::byte> payload(3, std::byte{9});  // what it held before is replaced
    ASSERT_EQ(reader_->read(header_, payload, fds_, Deadline::after(5s)), ReadStatus::Frame);
    EXPECT_TRUE(same_body(payload, frame));
  }
}

TEST_P(StreamFrameTest, AFrameUpToTheLargestReadInPlaceIsNotCopiedOutOfTheReadersBuffer) {
  for (const std::size_t body :
       {std::size_t{100}, std::size_t{300 * 1024}, kMaxStagedFrameBytes - sizeof(FrameHeader)}) {
    const std::vector<std::byte> frame = make_frame(body, 8);
    deliver_in_pieces(frame, {});
    std::span<const std::byte> payload;
    ASSERT_EQ(reader_->read_view(header_, payload, buffer_, fds_, Deadline::after(5s)), ReadStatus::Frame);
    EXPECT_TRUE(same_body(payload, frame));
    EXPECT_TRUE(buffer_.empty()) << "the payload was copied into the caller's buffer";
    reader_->release();
  }
}

// A writer process sends frames of every size back to back, through the transport's own
// writer; the reader meets them wherever the kernel cuts the stream, and frames that follow
// a large one in the buffer must survive the buffer growing and moving its bytes.
TEST_P(StreamFrameTest, FramesOfMixedSizesBackToBackFromAnotherProcessArriveInOrder) {
  std::vector<std::vector<std::byte>> frames;
  unsigned seed = 20;
  for (int round = 0; round < 2; ++round) {
    for (const std::size_t body : kBodySizes) {
      frames.push_back(make_frame(body, seed++));
      frames.push_back(make_frame(5, seed++));  // a small one right behind it
    }
  }
  const pid_t child = test::fork_child([&] {
    reader_.reset();
    for (const auto& frame : frames) {
      const iovec part{const_cast<std::byte*>(frame.data()), frame.size()};
      CHILD_CHECK(writer_->write({&part, 1}, {}, Deadline::never()));
    }
    writer_->close();
  });
  writer_.reset();
  for (const auto& frame : frames) {
    ASSERT_NO_FATAL_FAILURE(expect_frame(frame));
  }
  std::span<const std::byte> payload;
  EXPECT_THROW(reader_->read_view(header_, payload, buffer_, fds_, Deadline::after(5s)), PeerDied);
  EXPECT_TRUE(test::child_succeeded(child));
}

// A writer killed after the header and part of the body: the reader reports the sender gone
// in the middle of a frame, for frames read in place and for larger ones.
TEST_P(StreamFrameTest, AWriterKilledInTheMiddleOfABodyIsPeerDeathMidFrame) {
  for (const std::size_t body : {std::size_t{300}, std::size_t{200 * 1024}, kMaxStagedFrameBytes + 4099}) {
    SCOPED_TRACE("body of " + std::to_string(body) + " bytes");
    connect();
    const std::vector<std::byte> frame = make_frame(body, 3);
    const std::size_t sent = sizeof(FrameHeader) + body / 2;
    const auto [child, written] = fork_writer_stopping_after(std::span(frame).first(sent));
    // What the writer sends is read (each read times out waiting for the rest) until it
    // says it sent all it will, and once more after that.
    std::span<const std::byte> payload;
    pollfd done{written, POLLIN, 0};
    while (::poll(&done, 1, 0) == 0) {
      ASSERT_EQ(reader_->read_view(header_, payload, buffer_, fds_, Deadline::after(10ms)), ReadStatus::Timeout);
    }
    ::close(written);
    EXPECT_EQ(reader_->read_view(header_, payload, buffer_, fds_, Deadline::after(10ms)), ReadStatus::Timeout);
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    EXPECT_EQ(test::wait_child(child).signal, SIGKILL);
    try {
      reader_->read_view(header_, payload, buffer_, fds_, Deadline::after(5s));
      ADD_FAILURE() << "expected PeerDied";
    } catch (const PeerDied& error) {
      EXPECT_NE(std::string(error.what()).find("middle of a frame"), std::string::npos) << error.what();
    }
    reader_.reset();
  }
}

// A header that claims fewer bytes than its body has: the frame ends early, and what follows
// is read as the next header, which is refused; one that claims more waits for bytes that
// never come, and the writer's end is peer death.
TEST_P(StreamFrameTest, LyingLengthsAreRefusedOrEndInPeerDeath) {
  for (const std::size_t body : {std::size_t{100}, std::size_t{100 * 1024}, kMaxStagedFrameBytes + 100}) {
    SCOPED_TRACE("body of " + std::to_string(body) + " bytes");
    connect();
    std::vector<std::byte> shorter = make_frame(body, 4);
    FrameHeader header;
    std::memcpy(&header, shorter.data(), sizeof header);
    header.body_bytes = body - 64;
    std::memcpy(shorter.data(), &header, sizeof header);
    const pid_t child = test::fork_child([&] {
      reader_.reset();
      write_raw(fd_, shorter);
    });
    writer_.reset();
    std::span<const std::byte> payload;
    ASSERT_EQ(reader_->read_view(header_, payload, buffer_, fds_, Deadline::after(5s)), ReadStatus::Frame);
    EXPECT_EQ(payload.size(), body - 64);
    reader_->release();
    try {
      reader_->read_view(header_, payload, buffer_, fds_, Deadline::after(5s));
      ADD_FAILURE() << "expected a ProtocolError for the body's bytes read as a header";
    } catch (const ProtocolError& error) {
      EXPECT_NE(std::string(error.what()).find("magic"), std::string::npos) << error.what();
    }
    EXPECT_TRUE(test::child_succeeded(child));
    reader_.reset();

    // The longer one, on a fresh connection.
    connect();
    const pid_t liar = test::fork_child([&] {
      reader_.reset();
      std::vector<std::byte> longer = make_frame(body, 5);
      std::memcpy(&header, longer.data(), sizeof header);
      header.body_bytes = body + 64;
      std::memcpy(longer.data(), &header, sizeof header);
      write_raw(fd_, longer);
    });
    writer_.reset();
    EXPECT_THROW(reader_->read_view(header_, payload, buffer_, fds_, Deadline::after(5s)), PeerDied);
    EXPECT_TRUE(test::child_succeeded(liar));
    reader_.reset();
  }
}

// ---- an untimed read hands a large byte message out before its body arrived ------------

// Writes `frame` from another process in pieces that end at `cuts`, pausing after each so
// that the reader meets the stream cut there, then `after` (a frame that follows).
pid_t write_in_pieces(int fd, const std::vector<std::byte>& frame, const std::vector<std::size_t>& cuts,
                      const std::vector<std::byte>& after) {
  return test::fork_child([&] {
    std::size_t at = 0;
    for (const std::size_t cut : cuts) {
      if (cut <= at || cut >= frame.size()) continue;
      write_raw(fd, std::span(frame).subspan(at, cut - at));
      at = cut;
      std::this_thread::sleep_for(2ms);
    }
    write_raw(fd, std::span(frame).subspan(at));
    write_raw(fd, after);
  });
}

// Reads the body of the frame just viewed through pending_body(): the bytes ready in place
// first, some more into place, most of the rest straight into `out`, the last ones into
// place; true when every byte matches `frame`.
bool read_pending_body(PendingBody& pending, std::span<const std::byte> payload, const std::vector<std::byte>& frame) {
  const std::size_t body = payload.size();
  const std::byte* sent = frame.data() + sizeof(FrameHeader);
  std::size_t ready = pending.ready();
  if (ready > body || std::memcmp(payload.data(), sent, ready) != 0) return false;
  const std::size_t some_more = std::min(body, ready + 100);
  ready = pending.fill(some_more);
  if (ready < some_more || std::memcmp(payload.data(), sent, ready) != 0) return false;
  const std::size_t last = std::min<std::size_t>(10, body - ready);
  std::vector<std::byte> out(body - ready - last);  // empty when fill() read all but `last`
  pending.read_out(out.data(), out.size());
  if (pending.ready() != body - last) return false;
  if (!out.empty() && std::memcmp(out.data(), sent + ready, out.size()) != 0) return false;
  if (pending.fill(body) != body) return false;
  return std::memcmp(payload.data() + body - last, sent + body - last, last) == 0;
}

TEST_P(StreamFrameTest, AnUntimedReadHandsOutALargeByteMessageBeforeItsBodyAndReadsItThrough) {
  const std::size_t header = sizeof(FrameHeader);
  unsigned seed = 40;
  for (const std::size_t body : {kFirstReadBytes + kPendingBodyFrom, std::size_t{64 * 1024},
                                 std::size_t{200 * 1024 + 3}, kMaxStagedFrameBytes - sizeof(FrameHeader)}) {
    const std::vector<std::vector<std::size_t>> cut_sets = {
        {},                                                           // all at once
        {1},                                                          // one byte of the header first
        {header},                                                     // the header alone
        {header + 1},                                                 // and one byte of the body
        {kFirstReadBytes - 1, kFirstReadBytes, kFirstReadBytes + 1},  // around the first read
        {header + body / 2},                                          // half the body
        {header + body - 1},                                          // all but the last byte
    };
    for (const auto& cuts : cut_sets) {
      SCOPED_TRACE("body of " + std::to_string(body) + " bytes, first cut at " +
                   (cuts.empty() ? std::string("none") : std::to_string(cuts.front())));
      const std::vector<std::byte> frame = make_frame(body, seed++);
      const std::vector<std::byte> after = make_frame(5, seed++);
      const pid_t child = write_in_pieces(fd_, frame, cuts, after);
      std::span<const std::byte> payload;
      ASSERT_EQ(reader_->read_view(header_, payload, buffer_, fds_, Deadline::never()), ReadStatus::Frame);
      EXPECT_EQ(header_.body_bytes, body);
      ASSERT_EQ(payload.size(), body);
      PendingBody* pending = reader_->pending_body();
      ASSERT_NE(pending, nullptr) << "the body was read before the frame was handed out";
      EXPECT_LE(pending->ready(), kFirstReadBytes);
      EXPECT_TRUE(read_pending_body(*pending, payload, frame));
      reader_->release();
      EXPECT_EQ(reader_->pending_body(), nullptr);
      ASSERT_NO_FATAL_FAILURE(expect_frame(after));
      EXPECT_TRUE(test::child_succeeded(child));
    }
  }
}

TEST_P(StreamFrameTest, SmallFramesAndTimedReadsAreNeverHandedOutBeforeTheirBody) {
  // Below kPendingBodyFrom still in the stream, a frame with a table, and any timed read.
  FrameHeader with_release;
  with_release.release_count = 1;
  with_release.body_bytes = 100 * 1024;
  std::vector<std::byte> tabled(sizeof with_release + sizeof(std::uint32_t) + with_release.body_bytes, std::byte{3});
  std::memcpy(tabled.data(), &with_release, sizeof with_release);
  const std::vector<std::vector<std::byte>> frames = {make_frame(4096, 50), make_frame(kPendingBodyFrom, 51), tabled};
  for (const auto& frame : frames) {
    for (const bool timed : {false, true}) {
      const pid_t child = write_in_pieces(fd_, frame, {}, {});
      std::span<const std::byte> payload;
      ASSERT_EQ(reader_->read_view(header_, payload, buffer_, fds_, timed ? Deadline::after(5s) : Deadline::never()),
                ReadStatus::Frame);
      EXPECT_EQ(reader_->pending_body(), nullptr) << "frame of " << frame.size() << " bytes, timed " << timed;
      EXPECT_TRUE(same_body(payload, frame));
      reader_->release();
      EXPECT_TRUE(test::child_succeeded(child));
    }
  }
}

TEST_P(StreamFrameTest, ALargeByteMessageReleasedBeforeItsBodyWasReadIsSkipped) {
  // Released with none of the rest read, with part of it read, then read by a timed read
  // (which skips the rest within its deadline) and by an untimed one.
  for (const std::size_t read_first : {std::size_t{0}, std::size_t{40 * 1024}}) {
    for (const bool timed_next : {false, true}) {
      const std::vector<std::byte> frame = make_frame(300 * 1024, 60);
      const std::vector<std::byte> after = make_frame(70 * 1024, 61);
      const pid_t child = write_in_pieces(fd_, frame, {sizeof(FrameHeader) + 100 * 1024}, after);
      std::span<const std::byte> payload;
      ASSERT_EQ(reader_->read_view(header_, payload, buffer_, fds_, Deadline::never()), ReadStatus::Frame);
      PendingBody* pending = reader_->pending_body();
      ASSERT_NE(pending, nullptr);
      if (read_first > 0) {
        std::vector<std::byte> out(read_first);
        pending->read_out(out.data(), out.size());
      }
      reader_->release();
      if (timed_next) {
        ASSERT_NO_FATAL_FAILURE(expect_frame(after));
      } else {
        ASSERT_EQ(reader_->read_view(header_, payload, buffer_, fds_, Deadline::never()), ReadStatus::Frame);
        ASSERT_NE(reader_->pending_body(), nullptr);
        EXPECT_TRUE(read_pending_body(*reader_->pending_body(), payload, after));
        reader_->release();
      }
      EXPECT_TRUE(test::child_succeeded(child));
    }
  }
}

TEST_P(StreamFrameTest, AWriterKilledInTheMiddleOfAPendingBodyIsPeerDeathMidFrame) {
  for (const bool read_out : {false, true}) {
    SCOPED_TRACE(read_out ? "read out" : "filled in place");
    connect();
    const std::size_t body = 500 * 1024;
    const std::vector<std::byte> frame = make_frame(body, 70);
    // Less than a pipe holds (64 KiB), so that it all goes out before anything is read.
    const auto [child, written] = fork_writer_stopping_after(std::span(frame).first(sizeof(FrameHeader) + 40 * 1024));
    std::span<const std::byte> payload;
    ASSERT_EQ(reader_->read_view(header_, payload, buffer_, fds_, Deadline::never()), ReadStatus::Frame);
    PendingBody* pending = reader_->pending_body();
    ASSERT_NE(pending, nullptr);
    char byte = 0;
    ASSERT_EQ(::read(written, &byte, 1), 1);
    ::close(written);
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    EXPECT_EQ(test::wait_child(child).signal, SIGKILL);
    try {
      std::vector<std::byte> out(body);
      if (read_out) {
        pending->read_out(out.data(), body - pending->ready());
      } else {
        pending->fill(body);
      }
      ADD_FAILURE() << "expected PeerDied";
    } catch (const PeerDied& error) {
      EXPECT_NE(std::string(error.what()).find("middle of a frame"), std::string::npos) << error.what();
    }
    reader_->release();
    // The next read finds the stream ended in the middle of the frame too.
    EXPECT_THROW(reader_->read_view(header_, payload, buffer_, fds_, Deadline::never()), PeerDied);
    reader_.reset();
  }
}

TEST_P(StreamFrameTest, PendingBodiesThatLieAboutTheirLengthAreRefusedOrEndInPeerDeath) {
  const std::size_t body = 100 * 1024;
  // Shorter than its body: the reads stop at the end it claims, and the rest of the body is
  // read as the next header.
  std::vector<std::byte> shorter = make_frame(body, 80);
  FrameHeader header;
  std::memcpy(&header, shorter.data(), sizeof header);
  header.body_bytes = body - 64;
  std::memcpy(shorter.data(), &header, sizeof header);
  pid_t child = write_in_pieces(fd_, shorter, {}, {});
  std::span<const std::byte> payload;
  ASSERT_EQ(reader_->read_view(header_, payload, buffer_, fds_, Deadline::never()), ReadStatus::Frame);
  ASSERT_NE(reader_->pending_body(), nullptr);
  EXPECT_EQ(reader_->pending_body()->fill(body), body - 64);
  std::vector<std::byte> out(64);
  reader_->pending_body()->read_out(out.data(), out.size());  // nothing left of the frame to read
  EXPECT_EQ(reader_->pending_body()->ready(), body - 64);
  reader_->release();
  try {
    reader_->read_view(header_, payload, buffer_, fds_, Deadline::never());
    ADD_FAILURE() << "expected a ProtocolError for the body's bytes read as a header";
  } catch (const ProtocolError& error) {
    EXPECT_NE(std::string(error.what()).find("magic"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(test::child_succeeded(child));

  // Longer than its body, on a fresh connection: the writer's end is peer death.
  connect();
  std::vector<std::byte> longer = make_frame(body, 81);
  std::memcpy(&header, longer.data(), sizeof header);
  header.body_bytes = body + 64;
  std::memcpy(longer.data(), &header, sizeof header);
  child = test::fork_child([&] {
    reader_.reset();
    write_raw(fd_, longer);
  });
  writer_.reset();
  ASSERT_EQ(reader_->read_view(header_, payload, buffer_, fds_, Deadline::never()), ReadStatus::Frame);
  ASSERT_NE(reader_->pending_body(), nullptr);
  EXPECT_THROW(reader_->pending_body()->fill(body + 64), PeerDied);
  reader_->release();
  EXPECT_TRUE(test::child_succeeded(child));
  reader_.reset();
}

// Only a socket carries fds with a frame's bytes.
class PendingBodyFdsTest : public test::LeakCheckedTest {};

TEST_F(PendingBodyFdsTest, FdsSentInTheMiddleOfAPendingBodyAreRefusedAndClosed) {
  auto [writer, reader] = make_transport(Transport::UnixSocket, FrameLimits{}, 0);
  std::unique_ptr<FrameReader> reader_ = std::move(reader);
  const int fd_ = writer->descriptors().at(0);
  FrameHeader header_{};
  std::vector<std::byte> buffer_;
  std::deque<UniqueFd> fds_;
  const std::size_t body = 100 * 1024;
  const std::vector<std::byte> frame = make_frame(body, 90);
  const std::size_t first = sizeof(FrameHeader) + 40 * 1024;
  const pid_t child = test::fork_child([&] {
    reader_.reset();
    write_raw(fd_, std::span(frame).first(first));
    std::this_thread::sleep_for(20ms);  // the reader is past the header: these bytes are mid-body
    int pipe_ends[2];
    CHILD_CHECK(::pipe(pipe_ends) == 0);
    iovec part{const_cast<std::byte*>(frame.data() + first), frame.size() - first};
    alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
    msghdr message{};
    message.msg_iov = &part;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof control;
    cmsghdr* entry = CMSG_FIRSTHDR(&message);
    entry->cmsg_level = SOL_SOCKET;
    entry->cmsg_type = SCM_RIGHTS;
    entry->cmsg_len = CMSG_LEN(2 * sizeof(int));
    std::memcpy(CMSG_DATA(entry), pipe_ends, sizeof pipe_ends);
    CHILD_CHECK(::sendmsg(fd_, &message, MSG_NOSIGNAL) > 0);
  });
  std::span<const std::byte> payload;
  ASSERT_EQ(reader_->read_view(header_, payload, buffer_, fds_, Deadline::never()), ReadStatus::Frame);
  ASSERT_NE(reader_->pending_body(), nullptr);
  std::vector<std::byte> out(body);
  try {
    reader_->pending_body()->read_out(out.data(), body - reader_->pending_body()->ready());
    ADD_FAILURE() << "expected a ProtocolError for fds in the middle of a frame";
  } catch (const ProtocolError& error) {
    EXPECT_NE(std::string(error.what()).find("declares none"), std::string::npos) << error.what();
  }
  reader_->release();
  EXPECT_TRUE(fds_.empty());
  EXPECT_TRUE(test::child_succeeded(child));
  writer.reset();
  reader_.reset();
  // TearDown checks that the two fds were closed.
}

// ---- typed byte messages read straight into their vectors --------------------------------

std::vector<std::uint8_t> numbered(std::size_t size, unsigned seed) {
  std::vector<std::uint8_t> out(size);
  for (std::size_t i = 0; i < size; ++i) out[i] = static_cast<std::uint8_t>((i * 31 + seed) % 253);
  return out;
}

// A large vector followed by more fields: the archive reads the vector's elements out of
// the stream and the fields after them into place. load() refuses the message when asked to,
// before reading the vector, leaving most of the body in the stream.
struct BytesThenFields {
  std::uint32_t refuse = 0;
  std::vector<std::uint8_t> bytes;
  std::uint64_t tail = 0;
  std::string name;
  template <class Archive>
  void save(Archive& ar) const {
    ar(refuse, bytes, tail, name);
  }
  template <class Archive>
  void load(Archive& ar) {
    ar(refuse);
    if (refuse != 0) throw std::runtime_error("this receiver refuses the message");
    ar(bytes, tail, name);
  }
};

TEST_P(StreamFrameTest, ByteMessagesReadStraightIntoTheirStorageArriveWhole) {
  const std::vector<std::size_t> sizes = {100,
                                          kFirstReadBytes - 100,
                                          kFirstReadBytes + kPendingBodyFrom,
                                          64 * 1024,
                                          1 << 20,
                                          kMaxStagedFrameBytes - 100,
                                          kMaxStagedFrameBytes + 1};
  auto [bytes_tx, bytes_rx] = channel<std::vector<std::uint8_t>>(GetParam());
  auto [floats_tx, floats_rx] = channel<std::vector<float>>(GetParam());
  auto [text_tx, text_rx] = channel<std::string>(GetParam());
  auto [fields_tx, fields_rx] = channel<BytesThenFields>(GetParam());
  const pid_t child = test::fork_child([&, &bytes_rx = bytes_rx, &floats_rx = floats_rx, &text_rx = text_rx,
                                        &fields_rx = fields_rx, &bytes_tx = bytes_tx, &floats_tx = floats_tx,
                                        &text_tx = text_tx, &fields_tx = fields_tx] {
    bytes_tx.detach();
    floats_tx.detach();
    text_tx.detach();
    fields_tx.detach();
    unsigned seed = 0;
    for (const std::size_t size : sizes) {
      const auto bytes = bytes_rx.recv();
      CHILD_CHECK(bytes.has_value() && *bytes == numbered(size, seed));
      const auto timed = bytes_rx.recv_for(5s);  // a timed read of the same size, read whole first
      CHILD_CHECK(timed.has_value() && *timed == numbered(size, seed + 1));
      const auto floats = floats_rx.recv();
      CHILD_CHECK(floats.has_value() && floats->size() == size / 4 + 1 && floats->back() == static_cast<float>(seed));
      const auto text = text_rx.recv();
      CHILD_CHECK(text.has_value() && text->size() == size && text->front() == 'a' && text->back() == 'z');
      bool refused = false;
      try {
        (void)fields_rx.recv();
      } catch (const std::runtime_error&) {
        refused = true;
      }
      CHILD_CHECK(refused);  // the rest of that body is skipped: the next message is whole
      const auto fields = fields_rx.recv();
      CHILD_CHECK(fields.has_value() && fields->bytes == numbered(size, seed + 2) && fields->tail == size &&
                  fields->name == "after the bytes");
      ++seed;
    }
    CHILD_CHECK(!bytes_rx.recv().has_value());
  });
  bytes_rx.close();
  floats_rx.close();
  text_rx.close();
  fields_rx.close();
  unsigned seed = 0;
  for (const std::size_t size : sizes) {
    bytes_tx.send(numbered(size, seed));
    bytes_tx.send(numbered(size, seed + 1));
    std::vector<float> floats(size / 4 + 1, 0.5f);
    floats.back() = static_cast<float>(seed);
    floats_tx.send(floats);
    std::string text(size, 'm');
    text.front() = 'a';
    text.back() = 'z';
    text_tx.send(text);
    fields_tx.send(BytesThenFields{1, numbered(size, seed + 2), size, "after the bytes"});
    fields_tx.send(BytesThenFields{0, numbered(size, seed + 2), size, "after the bytes"});
    ++seed;
  }
  bytes_tx.close();
  EXPECT_TRUE(test::child_succeeded(child, std::chrono::seconds(60)));
}

// ---- typed messages: large bodies next to tensors whose fds travel with the frame -------

struct BytesAndTensors {
  std::vector<std::uint8_t> bytes;
  std::vector<Tensor> tensors;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(bytes, tensors);
  }
};

TEST_P(StreamFrameTest, LargeBodiesTravelWithNewTensorsAndTheirFds) {
  // More new tensors than one sendmsg passes fds for (253), next to bodies on each side of
  // the sizes the reader reads in place.
  const std::vector<std::pair<std::size_t, int>> shapes = {
      {100 * 1024, 1}, {kMaxStagedFrameBytes, 3}, {300 * 1024, 300}, {kMaxStagedFrameBytes + 1, 260}, {64, 2}};
  auto [tx, rx] = channel<BytesAndTensors>(GetParam());
  const pid_t child = test::fork_child([&, &rx = rx, &tx = tx] {
    tx.detach();
    unsigned seed = 0;
    for (const auto& [size, count] : shapes) {
      const auto got = rx.recv();
      CHILD_CHECK(got.has_value());
      CHILD_CHECK(got->bytes == numbered(size, seed));
      CHILD_CHECK(got->tensors.size() == static_cast<std::size_t>(count));
      for (int i = 0; i < count; ++i) CHILD_CHECK(got->tensors[i].at<std::int32_t>({0}) == i + static_cast<int>(seed));
      ++seed;
    }
    CHILD_CHECK(!rx.recv().has_value());
  });
  rx.close();
  unsigned seed = 0;
  for (const auto& [size, count] : shapes) {
    BytesAndTensors message{numbered(size, seed), {}};
    for (int i = 0; i < count; ++i) {
      message.tensors.push_back(Tensor::zeros({4}, DType::Int32, Device::SharedCpu));
      message.tensors.back().at<std::int32_t>({0}) = i + static_cast<int>(seed);
    }
    tx.send(message);
    ++seed;
  }
  tx.close();
  EXPECT_TRUE(test::child_succeeded(child));
}

}  // namespace
}  // namespace ferry
