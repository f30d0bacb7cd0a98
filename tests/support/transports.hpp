// The transports that carry frames between processes, for parameterized tests.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ferry/detail/transport.hpp"

namespace ferry::test {

/// Every inter-process transport this build offers.
inline std::vector<Transport> interprocess_transports() {
  return {Transport::Pipe, Transport::UnixSocket, Transport::ShmRing};
}

/// Test-name suffix for a transport ("Pipe", "UnixSocket", ...).
inline std::string transport_test_name(const ::testing::TestParamInfo<Transport>& info) {
  switch (info.param) {
    case Transport::Pipe: return "Pipe";
    case Transport::UnixSocket: return "UnixSocket";
    case Transport::ShmRing: return "ShmRing";
    case Transport::InProcess: return "InProcess";
    case Transport::Ucx: return "Ucx";
  }
  return "Unknown";
}

}  // namespace ferry::test
