// A MessageEncoder and a MessageDecoder joined in memory: frames move from one to the other
// as a transport moves them (bytes copied, fds duplicated as SCM_RIGHTS does), with no
// transport, so that a test or fuzz target can cut, patch or drop a frame on the way.
// Used by codec_test and the codec fuzz harness; needs no GoogleTest.
#pragma once

#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <span>
#include <system_error>
#include <vector>

#include "ferry/detail/message_decoder.hpp"
#include "ferry/detail/message_encoder.hpp"

namespace ferry::test {

using namespace ferry::detail;  // the codecs and their wire types

/// One frame on its way: the bytes a transport carries (header first) and its fds.
struct WireFrame {
  std::vector<std::byte> bytes;
  std::vector<UniqueFd> fds;

  FrameHeader header() const { return load<FrameHeader>(0); }
  void set_header(const FrameHeader& header) { store(0, header); }
  std::span<const std::byte> payload() const { return std::span(bytes).subspan(sizeof(FrameHeader)); }
  /// Where the tables start (after the header and the type name).
  std::size_t segments_at() const { return sizeof(FrameHeader) + header().type_name_bytes; }
  std::size_t handles_at() const { return segments_at() + header().segment_count * sizeof(SegmentEntry); }
  std::size_t releases_at() const { return handles_at() + header().handle_count * sizeof(HandleEntry); }
  SegmentEntry segment(std::size_t i) const { return load<SegmentEntry>(segments_at() + i * sizeof(SegmentEntry)); }
  void set_segment(std::size_t i, const SegmentEntry& entry) { store(segments_at() + i * sizeof(SegmentEntry), entry); }
  HandleEntry handle(std::size_t i) const { return load<HandleEntry>(handles_at() + i * sizeof(HandleEntry)); }
  void set_handle(std::size_t i, const HandleEntry& entry) { store(handles_at() + i * sizeof(HandleEntry), entry); }
  std::vector<std::uint32_t> releases() const {
    std::vector<std::uint32_t> out(header().release_count);
    if (!out.empty()) std::memcpy(out.data(), bytes.data() + releases_at(), out.size() * sizeof(std::uint32_t));
    return out;
  }
  /// Appends a storage release of `slot` to the frame, as a lying sender would.
  void add_release(std::uint32_t slot) {
    const std::size_t at = releases_at() + header().release_count * sizeof(std::uint32_t);
    const auto* raw = reinterpret_cast<const std::byte*>(&slot);
    bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(at), raw, raw + sizeof slot);
    FrameHeader h = header();
    ++h.release_count;
    set_header(h);
  }

 private:
  template <class T>
  T load(std::size_t at) const {
    T value;
    std::memcpy(&value, bytes.data() + at, sizeof value);
    return value;
  }
  template <class T>
  void store(std::size_t at, const T& value) {
    std::memcpy(bytes.data() + at, &value, sizeof value);
  }
};

template <class T>
class CodecLoop {
 public:
  explicit CodecLoop(HandlePassing passing = HandlePassing::FdPassing) : encoder(passing) {}

  /// Encodes `message` and commits it as sent: the frame a transport would carry.
  WireFrame send(const T& message) {
    const EncodedFrame& encoded = encoder.encode(message);
    WireFrame frame;
    for (const iovec& part : encoded.iovecs()) {
      const auto* begin = static_cast<const std::byte*>(part.iov_base);
      frame.bytes.insert(frame.bytes.end(), begin, begin + part.iov_len);
    }
    for (const int fd : encoded.fds) frame.fds.push_back(duplicate(fd));
    encoder.commit();
    return frame;
  }
  /// Hands `frame` to the decoder and reads its message; then, as a channel does, gives the
  /// encoder the acknowledgements. Throws what the decoder throws.
  T deliver(WireFrame frame) {
    for (UniqueFd& fd : frame.fds) queued.push_back(std::move(fd));
    const FrameHeader header = frame.header();
    validate_header(header, FrameLimits{});
    decoder.decode(header, frame.payload(), queued);
    if (decoder.wants_acknowledgement()) encoder.acknowledge(header.sequence);
    encoder.acknowledge(encoder.resolved_on_board());
    return decoder.read<T>();
  }
  T round_trip(const T& message) { return deliver(send(message)); }

  MessageEncoder encoder;
  MessageDecoder decoder{type_fingerprint<T>(), type_name<T>()};
  std::deque<UniqueFd> queued;  // fds that arrived and no frame took yet

 private:
  static UniqueFd duplicate(int fd) {
    const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) throw std::system_error(errno, std::generic_category(), "fcntl(F_DUPFD_CLOEXEC)");
    return UniqueFd(copy);
  }
};

}  // namespace ferry::test
