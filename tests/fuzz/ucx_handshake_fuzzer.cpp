// libFuzzer target: the ucx:// handshake's state machines (see run_ucx_handshake).
#include <cstddef>
#include <cstdint>

#include "ucx_wire_harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ferry::fuzz::run_ucx_handshake({data, size});
  return 0;
}
