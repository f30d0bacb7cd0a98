#include "ring/ring_transport.hpp"

#include <sys/socket.h>

#include "ferry/error.hpp"

namespace ferry {

std::pair<std::unique_ptr<detail::FrameWriter>, std::unique_ptr<detail::FrameReader>> make_ring_transport(
    std::size_t capacity, const RingTiming& timing, const FrameLimits& limits) {
  auto segment = std::make_shared<const RingSegment>(RingSegment::create(capacity));
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) throw_errno("socketpair for a ring");
  detail::UniqueFd writer_side(ends[0]);
  detail::UniqueFd reader_side(ends[1]);
  return {std::make_unique<RingFrameWriter>(segment, std::move(writer_side), timing),
          std::make_unique<RingFrameReader>(segment, std::move(reader_side), timing, limits)};
}

}  // namespace ferry
