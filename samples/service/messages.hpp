// What the loader service and its trainers exchange.
#pragma once

#include <cstdint>
#include <string>

#include "ferry/ferry.hpp"

namespace service {

/// A batch the loader prepares in shared memory; the trainer maps its pages (no copy).
struct Batch {
  std::int64_t step = 0;
  ferry::Tensor images;  // [batch, pixels], float32
  ferry::Tensor labels;  // [batch], int64
  template <class Archive>
  void serialize(Archive& ar) {
    ar(step, images, labels);
  }
};

/// What a trainer reports back.
struct Stats {
  std::string trainer;
  std::int64_t step = 0;
  double loss = 0;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(trainer, step, loss);
  }
};

}  // namespace service
