#include "ferry/detail/body_reader.hpp"

#include <string>

namespace ferry::detail {

void throw_body_left_over(std::size_t remaining, std::string_view type) {
  throw ProtocolError("message body has " + std::to_string(remaining) + " bytes left over after reading a " +
                      std::string(type) + "; sender and receiver disagree on its layout");
}

void throw_body_invalid(std::string_view type, const char* what) {
  throw ProtocolError("message body is not a valid " + std::string(type) + ": " + what);
}

}  // namespace ferry::detail
