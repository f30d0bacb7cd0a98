#include "ferry/detail/size_classes.hpp"

#include <algorithm>
#include <bit>
#include <string>

#include "ferry/error.hpp"

namespace ferry {

using detail::kFirstSteppedExponent, detail::kPageBytes, detail::kPowerOfTwoClasses;

std::size_t detail::small_class_bytes(std::uint32_t index) {
  if (index < kPowerOfTwoClasses) return detail::kBlockAlignment << index;
  const std::uint32_t k = index - kPowerOfTwoClasses;
  const unsigned e = kFirstSteppedExponent + k / 4;
  const std::size_t step = k % 4 + 1;
  return (std::size_t{1} << e) + step * (std::size_t{1} << (e - 2));
}

std::size_t detail::small_block_limit(std::size_t segment_bytes) {
  const std::size_t eighth = segment_bytes / 8;
  if (eighth < detail::kBlockAlignment) return 0;
  // The largest class not above an eighth of the segment.
  detail::SizeClass candidate = detail::small_size_class(eighth);
  if (candidate.bytes == eighth) return eighth;
  return candidate.index == 0 ? 0 : detail::small_class_bytes(candidate.index - 1);
}

std::size_t detail::large_segment_bytes(std::size_t nbytes) {
  if (nbytes == 0 || nbytes > (std::size_t{1} << 62)) {
    throw Error("a shared tensor of " + std::to_string(nbytes) + " bytes cannot be allocated");
  }
  if (nbytes <= kPageBytes) return kPageBytes;
  const unsigned e = static_cast<unsigned>(std::bit_width(nbytes - 1)) - 1;
  const std::size_t granule = std::max(kPageBytes, std::size_t{1} << (e - 3));
  return (nbytes + granule - 1) / granule * granule;
}

}  // namespace ferry
