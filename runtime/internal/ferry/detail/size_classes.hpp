// Size classes of the caching shared-memory allocator: how a request is rounded up to the
// block that serves it. Rounding makes blocks interchangeable, so a freed block serves the
// next request of about the same size.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace ferry::detail {

/// Alignment and smallest size of every block: a cache line, enough for any vector load.
inline constexpr std::size_t kBlockAlignment = 64;

inline constexpr std::size_t kPageBytes = 4096;
inline constexpr std::uint32_t kPowerOfTwoClasses = 7;  // 64 B ... 4 KiB
inline constexpr unsigned kFirstSteppedExponent = 12;   // classes above 2^12 come in quarter steps

/// A small request's class: the block size that serves it and its index (0, 1, ...).
struct SizeClass {
  std::size_t bytes = 0;
  std::uint32_t index = 0;
};

/// The small class of a request of `nbytes` (> 0): powers of two from 64 bytes to 4 KiB,
/// then four steps per power of two (5, 6, 7, 8, 10, 12, 14, 16 KiB, ...), so at most a
/// fifth of a block above 4 KiB is unused. Inline: every allocation asks.
inline SizeClass small_size_class(std::size_t nbytes) {
  using detail::kFirstSteppedExponent, detail::kPageBytes, detail::kPowerOfTwoClasses;
  if (nbytes <= kBlockAlignment) return SizeClass{kBlockAlignment, 0};
  if (nbytes <= kPageBytes) {
    const std::size_t bytes = std::bit_ceil(nbytes);
    return SizeClass{bytes, static_cast<std::uint32_t>(std::countr_zero(bytes) - std::countr_zero(kBlockAlignment))};
  }
  // 2^e < nbytes <= 2^(e+1); round up to a quarter of 2^e.
  const unsigned e = static_cast<unsigned>(std::bit_width(nbytes - 1)) - 1;
  const std::size_t quarter = std::size_t{1} << (e - 2);
  const std::size_t bytes = (nbytes + quarter - 1) / quarter * quarter;
  const auto step = static_cast<std::uint32_t>(bytes / quarter - 4);  // 1 ... 4
  return SizeClass{bytes, kPowerOfTwoClasses + (e - kFirstSteppedExponent) * 4 + (step - 1)};
}

/// Block size of the small class with index `index`.
std::size_t small_class_bytes(std::uint32_t index);

/// Largest request carved from a shared slab of `segment_bytes` bytes: the largest class
/// that fits eight times in it. Larger requests get a segment of their own.
std::size_t small_block_limit(std::size_t segment_bytes);

/// Size of the segment that serves a large request of `nbytes`: `nbytes` rounded up to a
/// multiple of an eighth of the power of two below it (and of the 4 KiB page), so at most
/// an eighth of it is unused. Throws Error when the size cannot be represented.
std::size_t large_segment_bytes(std::size_t nbytes);

}  // namespace ferry::detail
