// libFuzzer target: the body of one ferry::Value message, read by the Value decoder against a
// prepared table of heap storages (see ValueHarness).
#include <cstddef>
#include <cstdint>

#include "harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static ferry::fuzz::ValueHarness harness;
  harness.run({data, size});
  return 0;
}
