// The message of the benchmarks that send one tensor at a time.
#pragma once

#include "ferry/tensor.hpp"

namespace ferry::bench {

/// One tensor, as a user's message that carries nothing else.
struct TensorMessage {
  Tensor tensor;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(tensor);
  }
};

}  // namespace ferry::bench
