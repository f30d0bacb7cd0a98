// libFuzzer target: a script of client connections, bytes, closes, pumps and accepts, run
// against a unix: listener's handshake state machine over socket pairs (see run_listener).
#include <cstddef>
#include <cstdint>

#include "handshake_harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ferry::fuzz::run_listener({data, size});
  return 0;
}
