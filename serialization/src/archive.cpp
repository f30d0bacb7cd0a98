#include "ferry/detail/archive.hpp"

#include <string>

namespace ferry {

void FrameInputArchive::throw_truncated(std::uint64_t count, std::size_t element_size) const {
  throw ProtocolError("message body is truncated: needed " + std::to_string(count) +
                      (element_size == 1 ? " bytes" : " elements of " + std::to_string(element_size) + " bytes") +
                      " at offset " + std::to_string(position_) + " of " + std::to_string(body_.size()));
}

}  // namespace ferry
