// Encoding and decoding messages in one process, without a transport: the archive, the
// handle table and the lease protocol.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <cereal/types/map.hpp>
#include <cereal/types/optional.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/variant.hpp>
#include <cereal/types/vector.hpp>

#include "ferry/detail/message_decoder.hpp"
#include "ferry/detail/message_encoder.hpp"
#include "support/leak_check.hpp"

namespace ferry {
namespace {

struct Inner {
  std::string name;
  Tensor weights;
  template <class Archive>
  void serialize(Archive& ar) { ar(name, weights); }
};

struct Batch {
  std::int64_t step = 0;
  std::string tag;
  Tensor images;
  std::vector<Tensor> extra;
  std::map<std::string, Tensor> named;
  std::optional<Tensor> maybe;
  std::variant<int, Tensor> either;
  Inner inner;
  template <class Archive>
  void serialize(Archive& ar) { ar(step, tag, images, extra, named, maybe, either, inner); }
};

// Moves a frame from an encoder to a decoder as a transport would, duplicating the fds
// the way SCM_RIGHTS does.
class Loopback {
 public:
  explicit Loopback(HandlePassing passing) : encoder_(passing) {}

  template <class T>
  T round_trip(const T& message) {
    const EncodedFrame& frame = encoder_.encode(message);
    std::vector<std::byte> bytes;
    for (const iovec& part : frame.iovecs()) {
      const auto* begin = static_cast<const std::byte*>(part.iov_base);
      bytes.insert(bytes.end(), begin, begin + part.iov_len);
    }
    for (int fd : frame.fds) fds_.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    encoder_.commit();
    FrameHeader header;
    std::memcpy(&header, bytes.data(), sizeof header);
    validate_header(header, FrameLimits{});
    const std::span<const std::byte> payload(bytes.data() + sizeof header, bytes.size() - sizeof header);
    last_frame_bytes_ = bytes.size();
    last_fd_count_ = frame.fds.size();
    last_handle_count_ = header.handle_count;
    decoder_.decode(header, payload, fds_);
    // As a channel does: the transport's acknowledgement when the decoder asks for one,
    // and the return board's resolved frame, which the sender reads at its next send.
    if (decoder_.wants_acknowledgement()) encoder_.acknowledge(header.sequence);
    encoder_.acknowledge(encoder_.resolved_on_board());
    return decoder_.read<T>();
  }

  MessageEncoder encoder_;
  MessageDecoder decoder_{type_fingerprint<Batch>(), type_name<Batch>()};
  std::deque<UniqueFd> fds_;
  std::size_t last_frame_bytes_ = 0;
  std::size_t last_fd_count_ = 0;
  std::size_t last_handle_count_ = 0;
};

class SerializationTest : public test::LeakCheckedTest {};

TEST_F(SerializationTest, NestedTensorsEverywhereRoundTrip) {
  Loopback loop(HandlePassing::FdPassing);
  Batch batch;
  batch.step = 7;
  batch.tag = "train";
  batch.images = Tensor::zeros({2, 3}, DType::Float32, Device::SharedCpu);
  batch.images.at<float>({1, 2}) = 3.5f;
  batch.extra = {batch.images.select(0, 1), Tensor::from({1, 2, 3}, Device::SharedCpu)};
  batch.named["mask"] = Tensor::zeros({4}, DType::Bool, Device::SharedCpu);
  batch.maybe = batch.images.transpose(0, 1);
  batch.either = Tensor::zeros({2}, DType::Int64, Device::SharedCpu);
  batch.inner = Inner{"w", Tensor::zeros({0}, DType::Float16, Device::SharedCpu)};

  Batch got = loop.round_trip(batch);
  EXPECT_EQ(got.step, 7);
  EXPECT_EQ(got.tag, "train");
  EXPECT_EQ(got.images.at<float>({1, 2}), 3.5f);
  // Four storages (images, the int tensor, the mask, the variant's tensor): views of
  // images share one entry of the handle table. All four are small blocks of one shared
  // segment, so two fds travel: the segment's and the connection's return board's.
  EXPECT_EQ(loop.last_handle_count_, 4u);
  EXPECT_EQ(loop.last_fd_count_, 2u);
  EXPECT_EQ(got.extra[0].at<float>({2}), 3.5f);
  EXPECT_EQ(got.extra[1].to_vector<int>(), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(got.named.at("mask").dtype(), DType::Bool);
  ASSERT_TRUE(got.maybe.has_value());
  EXPECT_EQ(got.maybe->strides(), (Shape{1, 3}));
  EXPECT_EQ(std::get<Tensor>(got.either).dtype(), DType::Int64);
  EXPECT_EQ(got.inner.weights.numel(), 0);
  EXPECT_EQ(got.inner.weights.dtype(), DType::Float16);
  // Same process: the handle cache maps the received fd to the original storage.
  EXPECT_EQ(got.images.storage(), batch.images.storage());
}

TEST_F(SerializationTest, RepeatedStorageTravelsAsLeaseOnly) {
  Loopback loop(HandlePassing::FdPassing);
  Batch batch;
  batch.images = Tensor::zeros({1024}, DType::Float32, Device::SharedCpu);
  loop.round_trip(batch);
  EXPECT_EQ(loop.last_fd_count_, 2u);  // the segment and the return board
  EXPECT_EQ(loop.encoder_.tracked_storages(), 1u);
  EXPECT_EQ(loop.decoder_.leased(), 1u);
  for (int i = 0; i < 10; ++i) {
    Batch again = loop.round_trip(batch);
    EXPECT_EQ(loop.last_fd_count_, 0u);
    EXPECT_TRUE(again.images.shares_storage_with(batch.images));
  }
}

TEST_F(SerializationTest, DeadStorageIsReleasedOnTheNextFrame) {
  Loopback loop(HandlePassing::FdPassing);
  {
    Batch batch;
    batch.images = Tensor::zeros({16}, DType::Float32, Device::SharedCpu);
    loop.round_trip(batch);
  }
  EXPECT_EQ(loop.decoder_.leased(), 1u);
  Batch next;
  next.images = Tensor::zeros({16}, DType::Float32, Device::SharedCpu);
  loop.round_trip(next);
  EXPECT_EQ(loop.encoder_.tracked_storages(), 1u);
  EXPECT_EQ(loop.decoder_.leased(), 1u);  // old lease dropped, new one added in its slot
}

TEST_F(SerializationTest, HeapTensorMovesIntoSharedMemoryWhenSent) {
  Loopback loop(HandlePassing::FdPassing);
  Batch batch;
  batch.images = Tensor::from({1.0f, 2.0f});
  EXPECT_FALSE(batch.images.is_shared());
  Batch got = loop.round_trip(batch);
  EXPECT_TRUE(batch.images.is_shared());
  EXPECT_EQ(got.images.to_vector<float>(), (std::vector<float>{1.0f, 2.0f}));
}

TEST_F(SerializationTest, ProcFdPassingOpensTheSendersFd) {
  Loopback loop(HandlePassing::ProcFd);
  Batch batch;
  batch.images = Tensor::zeros({8}, DType::Int16, Device::SharedCpu);
  Batch got = loop.round_trip(batch);
  EXPECT_EQ(loop.last_fd_count_, 0u);
  EXPECT_FALSE(loop.encoder_.awaiting_acknowledgement());
  EXPECT_EQ(got.images.storage(), batch.images.storage());
}

TEST_F(SerializationTest, TypeNameAndFingerprint) {
  EXPECT_EQ(type_name<int>(), "int");
  EXPECT_NE(type_name<Batch>().find("Batch"), std::string_view::npos) << type_name<Batch>();
  EXPECT_EQ(type_name<std::vector<int>>().substr(0, 11), "std::vector");
  EXPECT_NE(type_fingerprint<int>(), type_fingerprint<long>());
}

}  // namespace
}  // namespace ferry
