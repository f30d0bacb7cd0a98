// The text of `ferry --help`: every command, option and exit code.
#pragma once

#include <string>

namespace ferry::cli {

std::string usage_text();

}  // namespace ferry::cli
