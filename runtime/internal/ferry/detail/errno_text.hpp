#pragma once
// errno_text(code): the system's text for an errno value, as std::strerror() gives it, but
// safe from any thread: std::strerror may format an unknown code into one buffer shared by
// every thread (glibc documents it MT-Unsafe); strerror_r writes into the caller's.

#include <string.h>

#include <string>

namespace ferry::detail {

inline std::string errno_text(int code) {
  char buffer[128];
  return ::strerror_r(code, buffer, sizeof buffer);  // GNU's: the text, in `buffer` or static
}

}  // namespace ferry::detail
