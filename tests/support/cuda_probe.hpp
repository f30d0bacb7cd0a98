// Whether this machine has a GPU that CUDA tests can use, asked without initialising CUDA in
// the test process (CUDA does not survive fork(), and the tests fork their CUDA processes).
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace ferry::test {

/// "" when a forked child found at least one CUDA device; otherwise why not ("ferry was built
/// without CUDA", "cudaGetDeviceCount failed: ...", ...). Asked once per test process.
std::string gpu_unavailable_reason();

}  // namespace ferry::test

/// Skips the current test, naming the reason, when no GPU can be used.
#define FERRY_SKIP_WITHOUT_GPU()                                                               \
  do {                                                                                         \
    if (const std::string reason = ::ferry::test::gpu_unavailable_reason(); !reason.empty()) { \
      GTEST_SKIP() << "needs a CUDA device: " << reason;                                       \
    }                                                                                          \
  } while (false)
