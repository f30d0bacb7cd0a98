// libFuzzer target: scripts of sends, drops, corrupted frames and deaths through a
// MessageEncoder and a MessageDecoder joined in memory (see codec_harness.hpp).
#include <cstddef>
#include <cstdint>

#include "codec_harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ferry::fuzz::run_codec({data, size});
  return 0;
}
