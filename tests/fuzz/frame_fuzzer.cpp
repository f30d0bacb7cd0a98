// libFuzzer target: streams of frames through header validation, MessageDecoder::decode and
// reading a FuzzMessage (see FrameHarness).
#include <cstddef>
#include <cstdint>

#include "harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static ferry::fuzz::FrameHarness harness;
  harness.run({data, size});
  return 0;
}
