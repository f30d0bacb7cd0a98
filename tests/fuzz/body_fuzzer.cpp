// libFuzzer target: one message body holding tensors in nested containers, read by
// FrameInputArchive against a prepared table of heap storages (see BodyHarness).
#include <cstddef>
#include <cstdint>

#include "harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static ferry::fuzz::BodyHarness harness;
  harness.run({data, size});
  return 0;
}
