#include "ferry/detail/body_reader.hpp"

#include <string>

#include <cereal/details/helpers.hpp>

#include "ferry/error.hpp"

namespace ferry {
namespace {

[[noreturn]] void throw_body_left_over(std::size_t remaining, std::string_view type) {
  throw ProtocolError("message body has " + std::to_string(remaining) + " bytes left over after reading a " +
                      std::string(type) + "; sender and receiver disagree on its layout");
}

[[noreturn]] void throw_body_invalid(std::string_view type, const char* what) {
  throw ProtocolError("message body is not a valid " + std::string(type) + ": " + what);
}

}  // namespace

void detail::read_message(detail::FrameInputArchive& archive, void* out, const detail::ReceivedType& type) {
  try {
    type.read(archive, out);
    if (archive.remaining() != 0) throw_body_left_over(archive.remaining(), type.name);
  } catch (const cereal::Exception& error) {
    throw_body_invalid(type.name, error.what());
  }
}

}  // namespace ferry
