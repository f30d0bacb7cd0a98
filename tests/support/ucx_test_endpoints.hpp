// What the ucx:// test files share: the endpoint options of a test that expects refusals
// (a secret, no refusal printed) and the small message type that most of their channels
// carry. Contract: quiet_ucx_options(secret) is the options every ucx:// test starts from;
// a test that waits on longer steps passes its own timeouts.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ferry/endpoint.hpp"
#include "ferry/tensor.hpp"

namespace ferry::test {

/// Options with `secret`, refusals not reported, `connect_timeout` for connecting and
/// `close_linger` for a closing end's last frames.
inline EndpointOptions quiet_ucx_options(std::string secret = "test secret",
                                         std::chrono::milliseconds connect_timeout = std::chrono::seconds(5),
                                         std::chrono::milliseconds close_linger = std::chrono::milliseconds(700)) {
  EndpointOptions options;
  options.secret = std::move(secret);
  options.connect_timeout = connect_timeout;
  options.on_refusal = [](const std::string&) {};
  options.channel.close_linger = close_linger;
  return options;
}

/// A numbered message with tensors (none where a test sends only numbers).
struct UcxBatch {
  std::int64_t index = 0;
  std::vector<Tensor> tensors;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(index, tensors);
  }
};

}  // namespace ferry::test
