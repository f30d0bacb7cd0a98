// libFuzzer target: the checks of a ucx:// connection's active messages (see run_ucx_am).
#include <cstddef>
#include <cstdint>

#include "ucx_wire_harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ferry::fuzz::run_ucx_am({data, size});
  return 0;
}
