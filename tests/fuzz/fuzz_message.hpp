// The message type the fuzz targets decode, and the storage sizes both the harness and the
// seed generator agree on. The message holds tensors in every container ferry's users put
// them in (vectors, maps, optionals, variants, nested structs), next to plain values.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ferry/ferry.hpp"

// The message types live outside namespace ferry, in a named namespace: g++ spells a type
// relative to the namespace of ferry::type_name ("fuzz::FuzzMessage") and clang spells it
// in full ("ferry::fuzz::FuzzMessage"), and seeds must decode in builds of either compiler.
namespace ferry_fuzz {

struct FuzzInner {
  std::string name;
  std::optional<ferry::Tensor> maybe;
  std::vector<std::int32_t> values;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(name, maybe, values);
  }
};

struct FuzzMessage {
  std::int64_t step = 0;
  bool flag = false;
  std::string tag;
  ferry::Tensor tensor;
  std::vector<ferry::Tensor> tensors;
  std::map<std::string, std::vector<ferry::Tensor>> named;
  std::variant<std::int32_t, ferry::Tensor, std::string> either;
  std::vector<FuzzInner> inner;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(step, flag, tag, tensor, tensors, named, either, inner);
  }
};

}  // namespace ferry_fuzz

namespace ferry::fuzz {

using ::ferry_fuzz::FuzzInner;
using ::ferry_fuzz::FuzzMessage;

/// Sizes of the heap storages the body target resolves handle indices to, in table order.
/// Odd sizes on purpose: AddressSanitizer catches a read one byte past any of them.
inline constexpr std::array<std::size_t, 5> kBodyStorageBytes = {128, 4096, 100, 1, 65536};

/// Segments the frame target hands to the decoder as fds (see FrameHarness): the i-th fd
/// of a frame with sequence s is a duplicate of segment (s + i) % kFrameSegmentCount, and
/// the i-th segment entry named by /proc path is pointed at the same segment. Wire version
/// 2: a frame's segment table starts with the connection's return board, then the data
/// segments in the order the message first uses them; data segments of small storages are
/// the caching allocator's slabs of kSegmentBytes.
enum class SegmentSource {
  ReturnBoard,     ///< a real return board (ReturnBoard::create)
  CachedShared,    ///< a slab of this process's caching allocator (in the handle cache)
  UncachedShared,  ///< a sealed memfd the decoder has never seen
  UnsealedMemfd,   ///< a memfd without seals
  NotAMemfd,       ///< a pipe
};
struct SegmentSpec {
  SegmentSource source;
  std::size_t bytes;  ///< CachedShared: the size of the block allocated in it
};
/// The default SharedAllocatorSettings::segment_bytes: the size of a slab.
inline constexpr std::size_t kSegmentBytes = std::size_t{2} << 20;
inline constexpr std::array<SegmentSpec, 7> kFrameSegments = {{
    {SegmentSource::CachedShared, 64},
    {SegmentSource::ReturnBoard, 0},  // the first fd of frame 1: its return board
    {SegmentSource::CachedShared, 4096},
    {SegmentSource::UncachedShared, kSegmentBytes},
    {SegmentSource::UncachedShared, kSegmentBytes},
    {SegmentSource::UnsealedMemfd, kSegmentBytes},
    {SegmentSource::NotAMemfd, 0},
}};
inline constexpr std::size_t kFrameSegmentCount = kFrameSegments.size();

/// Header flag bits the frame harness reads as instructions (the decoder ignores them):
/// hand one fd fewer, or one fd more, than the header's fd_count.
inline constexpr std::uint8_t kHarnessOneFdShort = 0x80;
inline constexpr std::uint8_t kHarnessOneFdExtra = 0x40;

}  // namespace ferry::fuzz
