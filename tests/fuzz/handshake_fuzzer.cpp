// libFuzzer target: one endpoint Hello or Reply as a peer sends it, through decode_prefix,
// decode_hello and decode_reply (see run_handshake).
#include <cstddef>
#include <cstdint>

#include "handshake_harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ferry::fuzz::run_handshake({data, size});
  return 0;
}
