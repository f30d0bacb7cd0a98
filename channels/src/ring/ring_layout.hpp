// The layout of a shared-memory ring segment (Transport::ShmRing).
//
// A ring is one memfd, sealed against shrinking and growing, of
// kRingHeaderBytes + capacity bytes, mapped by the writing and the reading process:
//
//   offset    bytes  written by          contents
//   0         128    the creator, once   setup line: magic, version, header_bytes, capacity
//   128       128    the writer          producer line: tail; reader_sleeping
//   256       128    the reader          consumer line: head, acknowledged; writer_sleeping
//   384       3712   nobody              zero padding up to the data
//   4096      capacity                   data: the byte stream of frames
//
// - tail: bytes the writer has published since the ring was created; head: bytes the
//   reader has consumed. Byte n of the stream lives at data[n % capacity]. The invariant
//   head <= tail <= head + capacity holds; an end that reads a position breaking it (a
//   process scribbling in the segment) raises ProtocolError. Each end keeps its own copy
//   of its position and of the capacity and never trusts the shared copy of those.
// - Each process maps the data twice in a row (RingSegment), so a frame that wraps around
//   is still contiguous in memory and the reader decodes it where it lies.
// - Frames (serialization/frame.hpp) follow each other in the stream with no padding. A
//   frame no larger than the capacity is published whole; a larger one is written in
//   pieces as the reader makes room, so frames of any size pass (up to FrameLimits),
//   whatever the capacity.
// - Gaps: a frame may be preceded by a gap that the reader skips, which starts with a
//   RingSkip record giving its length (16 bytes to kRingBodyOffset). The writer leaves one
//   when it lent ring space to the encoder for a large body (FrameWriter::body_space): the
//   body was serialized at kRingBodyOffset past the tail, before the size of the frame's
//   header and tables was known, and the header and tables are then written to end right
//   where the body begins. A gap is published together with its frame, never alone.
// - reader_sleeping / writer_sleeping: futex words. An end that found nothing to do
//   (no data / no room / no acknowledgement) and spun for its spin budget stores 1 into
//   its word, re-checks, and sleeps on the word. The peer publishes a position, then
//   looks at the word (the sleeper's store and load sequentially consistent, the peer's
//   store and load separated by a sequentially consistent fence, so one of the two sees
//   the other) and, if it is 1, swaps it to 2 + the CPU the waker runs on (0 if unknown)
//   and wakes the sleeper, which so learns whether its peer runs on another CPU (its spin
//   policy uses that: SpinPolicy) and sets the word back to 0. Each word lives
//   on the line its waker writes anyway, so the waker's check costs no cache miss; the
//   sleeper writes it only on its slow path.
// - The producer and consumer lines are 128 bytes apart so that the adjacent-line
//   prefetcher does not couple them.
// - head after a lone small frame: the reader publishes its head with a release store and a
//   fence before it looks at writer_sleeping, like every position, except after a frame
//   that was all the ring held and is small (ring_unfenced_release_limit): then without the
//   fence, so that the reader's reply is not held up by it (a ping-pong's case). A writer
//   already asleep is still woken (its 1 is seen without the fence); one that announces its
//   sleep at that very moment may be missed: the reader pays the fence and the look at its
//   next read (or Selector check, or close), and a writer waiting for room sleeps at most
//   kRingRoomFirstSleep after announcing, by when the new head is visible to it.
// - acknowledged: the highest frame sequence whose segments (SegmentKind::NewProcFd) the
//   reader has opened, stored when the return board could not tell it or the writer asked
//   for it (see ring_transport.hpp); the writer keeps those segments open until then.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace ferry {

inline constexpr std::uint64_t kRingMagic = 0x474e495259525246ull;  // "FRRYRING"
inline constexpr std::uint32_t kRingVersion = 1;
inline constexpr std::size_t kRingHeaderBytes = 4096;
inline constexpr std::size_t kRingLineBytes = 128;
inline constexpr std::size_t kRingMinCapacity = 4096;
inline constexpr std::size_t kRingMaxCapacity = std::size_t{1} << 40;

inline constexpr std::uint64_t kRingSkipMagic = 0x50494b5359525246ull;  // "FRRYSKIP"
/// Where a body serialized into lent ring space starts, past the tail: room for the
/// frame's header and tables in front of it (the rest of those bytes is a gap).
inline constexpr std::size_t kRingBodyOffset = 1024;
// Values of the futex words reader_sleeping / writer_sleeping (see above): 0 awake, 1 asleep,
// kRingWokenOnCpu + n woken by a peer running on CPU n.
inline constexpr std::uint32_t kRingSleeping = 1;
inline constexpr std::uint32_t kRingWokenOnCpu = 2;

/// A frame that was all the ring held when it was read, and is no larger than this (and
/// than a sixteenth of the capacity), is released without the fence (see "head" above).
inline constexpr std::uint64_t ring_unfenced_release_limit(std::uint64_t capacity) noexcept {
  return std::min<std::uint64_t>(capacity / 16, 4096);
}
/// The longest first sleep of a writer waiting for room (see "head" above).
inline constexpr std::chrono::milliseconds kRingRoomFirstSleep{1};

/// The record at the start of a gap in the data (see the table above).
struct RingSkip {
  std::uint64_t magic = kRingSkipMagic;
  std::uint64_t bytes = 0;  ///< length of the whole gap, this record included
};
static_assert(sizeof(RingSkip) == 16);

/// The shared header at offset 0 of a ring segment (see the table above).
struct RingHeader {
  // Setup line: written by the creator before any other process maps the segment.
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t header_bytes;
  std::uint64_t capacity;

  // Producer line.
  alignas(kRingLineBytes) std::atomic<std::uint64_t> tail;
  std::atomic<std::uint32_t> reader_sleeping;

  // Consumer line.
  alignas(kRingLineBytes) std::atomic<std::uint64_t> head;
  std::atomic<std::uint64_t> acknowledged;
  std::atomic<std::uint32_t> writer_sleeping;
};

static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<std::uint32_t>::is_always_lock_free,
              "ring positions must be lock-free atomics to be shared between processes");
static_assert(offsetof(RingHeader, tail) == kRingLineBytes);
static_assert(offsetof(RingHeader, head) == 2 * kRingLineBytes);
static_assert(sizeof(RingHeader) <= kRingHeaderBytes);

/// The capacity a ring gets for a requested one: the next power of two, at least
/// kRingMinCapacity. Throws Error above kRingMaxCapacity.
std::size_t ring_capacity_for(std::size_t requested);

}  // namespace ferry
