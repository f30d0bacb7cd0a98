// Frames of HandlePassing::Copying (a transport without shared memory, ucx://) taken apart
// and put back together as a transport would, for tests of the encoder and decoder alone.
#pragma once

#include <gtest/gtest.h>
#include <sys/uio.h>

#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "ferry/detail/message_encoder.hpp"

namespace ferry::test {

/// One encoded frame: its header, the rest of its bytes, and its Copied storages' bytes
/// (where the transport reads them).
struct CopiedFrame {
  detail::FrameHeader header{};
  std::vector<std::byte> payload;
  std::vector<iovec> copies;
};

/// Encodes `message` with `encoder` (a Copying one) and commits the frame.
template <class T>
CopiedFrame encode_copied(detail::MessageEncoder& encoder, const T& message) {
  const detail::EncodedFrame& frame = encoder.encode(message);
  std::vector<std::byte> bytes;
  for (const iovec& part : frame.iovecs()) {
    const auto* begin = static_cast<const std::byte*>(part.iov_base);
    bytes.insert(bytes.end(), begin, begin + part.iov_len);
  }
  CopiedFrame encoded;
  std::memcpy(&encoded.header, bytes.data(), sizeof encoded.header);
  encoded.payload.assign(bytes.begin() + sizeof(detail::FrameHeader), bytes.end());
  encoded.copies.assign(frame.copies.begin(), frame.copies.end());
  EXPECT_TRUE(frame.fds.empty());
  encoder.commit();
  return encoded;
}

/// What a transport delivers for `copies`: storages of its own (shared CPU memory)
/// holding the bytes.
std::deque<std::shared_ptr<Storage>> deliver_copies(const std::vector<iovec>& copies);

}  // namespace ferry::test
