// main() for test binaries that start workers with the spawn start method: a re-executed
// test binary must become the worker before GoogleTest parses its arguments.
#include <gtest/gtest.h>

#include "ferry/init.hpp"

int main(int argc, char** argv) {
  ferry::init(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
