// The compile-time floor of samples/quickstart.cpp: the same Batch, written and read back
// with cereal's binary archives alone (tensors as shape + data vectors), no ferry header.
// bench/compile-time compiles it and the sample side by side.
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <cereal/archives/binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

struct PlainTensor {
  std::vector<std::int64_t> shape;
  std::vector<float> data;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(shape, data);
  }
};

struct Batch {
  std::int64_t step = 0;
  std::string tag;
  PlainTensor images;
  std::vector<PlainTensor> extra;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(step, tag, images, extra);
  }
};

int main() {
  PlainTensor images{{64, 3, 224, 224}, std::vector<float>(64 * 3 * 224 * 224)};
  std::stringstream stream;
  for (std::int64_t step = 0; step < 3; ++step) {
    {
      cereal::BinaryOutputArchive out(stream);
      out(Batch{step, "train", images, {PlainTensor{{3, 224, 224}, {}}}});
    }
    Batch batch;
    cereal::BinaryInputArchive in(stream);
    in(batch);
    std::printf("step %lld: %zu elements\n", static_cast<long long>(batch.step), batch.images.data.size());
  }
}
