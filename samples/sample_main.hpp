// The samples' main(): starts ferry, runs the program, and turns an exception into a message
// on stderr and exit status 1.
#pragma once

#include <cstdio>
#include <exception>

#include "ferry/init.hpp"

namespace samples {

/// ferry::init() (which runs the worker instead when this process is one), then
/// `run(argc, argv)`, whose result is the exit status; an exception is printed as
/// "PROGRAM: what" and gives 1.
inline int main_of(const char* program, int (*run)(int, char**), int argc, char** argv) {
  ferry::init(argc, argv);
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s\n", program, error.what());
    return 1;
  }
}

}  // namespace samples
