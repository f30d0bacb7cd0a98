#include "ferry/size_classes.hpp"

#include <algorithm>
#include <bit>
#include <string>

#include "ferry/error.hpp"

namespace ferry {
namespace {

constexpr std::size_t kPageBytes = 4096;
constexpr std::uint32_t kPowerOfTwoClasses = 7;  // 64 B ... 4 KiB
constexpr unsigned kFirstSteppedExponent = 12;   // classes above 2^12 come in quarter steps

}  // namespace

SizeClass small_size_class(std::size_t nbytes) {
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

std::size_t small_class_bytes(std::uint32_t index) {
  if (index < kPowerOfTwoClasses) return kBlockAlignment << index;
  const std::uint32_t k = index - kPowerOfTwoClasses;
  const unsigned e = kFirstSteppedExponent + k / 4;
  const std::size_t step = k % 4 + 1;
  return (std::size_t{1} << e) + step * (std::size_t{1} << (e - 2));
}

std::size_t small_block_limit(std::size_t segment_bytes) {
  const std::size_t eighth = segment_bytes / 8;
  if (eighth < kBlockAlignment) return 0;
  // The largest class not above an eighth of the segment.
  SizeClass candidate = small_size_class(eighth);
  if (candidate.bytes == eighth) return eighth;
  return candidate.index == 0 ? 0 : small_class_bytes(candidate.index - 1);
}

std::size_t large_segment_bytes(std::size_t nbytes) {
  if (nbytes == 0 || nbytes > (std::size_t{1} << 62)) {
    throw Error("a shared tensor of " + std::to_string(nbytes) + " bytes cannot be allocated");
  }
  if (nbytes <= kPageBytes) return kPageBytes;
  const unsigned e = static_cast<unsigned>(std::bit_width(nbytes - 1)) - 1;
  const std::size_t granule = std::max(kPageBytes, std::size_t{1} << (e - 3));
  return (nbytes + granule - 1) / granule * granule;
}

}  // namespace ferry
