#include "ferry/error.hpp"

#include <cerrno>
#include <cstring>

#include "ferry/detail/errno_text.hpp"

namespace ferry {

SystemError::SystemError(const std::string& what, int code)
    : Error(what + ": " + detail::errno_text(code)), code_(code) {}

void throw_system_error(const std::string& what, int code) { throw SystemError(what, code); }

void throw_errno(const std::string& what) { throw_system_error(what, errno); }

}  // namespace ferry
