// Encoding and decoding messages in one process, without a transport: the archive, the
// handle table and the lease protocol.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <cereal/types/map.hpp>
#include <cereal/types/memory.hpp>
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
  void serialize(Archive& ar) {
    ar(name, weights);
  }
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
  void serialize(Archive& ar) {
    ar(step, tag, images, extra, named, maybe, either, inner);
  }
};

// Moves a frame from an encoder to a decoder as a transport would, duplicating the fds
// the way SCM_RIGHTS does.
class Loopback {
 public:
  explicit Loopback(detail::HandlePassing passing) : encoder_(passing) {}

  template <class T>
  T round_trip(const T& message) {
    const detail::EncodedFrame& frame = encoder_.encode(message);
    std::vector<std::byte> bytes;
    for (const iovec& part : frame.iovecs()) {
      const auto* begin = static_cast<const std::byte*>(part.iov_base);
      bytes.insert(bytes.end(), begin, begin + part.iov_len);
    }
    for (int fd : frame.fds) fds_.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    encoder_.commit();
    detail::FrameHeader header;
    std::memcpy(&header, bytes.data(), sizeof header);
    detail::validate_header(header, FrameLimits{});
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

  detail::MessageEncoder encoder_;
  detail::MessageDecoder decoder_{detail::type_fingerprint<Batch>(), detail::type_name<Batch>()};
  std::deque<detail::UniqueFd> fds_;
  std::size_t last_frame_bytes_ = 0;
  std::size_t last_fd_count_ = 0;
  std::size_t last_handle_count_ = 0;
};

// A class with a versioned serialize function and two pointers to one string: what uses
// cereal's own per-archive state (versions written, shared pointers met).
struct Versioned {
  std::int32_t value = 0;
  std::uint32_t version_read = 0;
  template <class Archive>
  void serialize(Archive& ar, std::uint32_t version) {
    ar(value);
    version_read = version;
  }
};

struct WithArchiveState {
  std::shared_ptr<std::string> first;
  std::shared_ptr<std::string> second;
  Versioned versioned;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(first, second, versioned);
  }
};

class SerializationTest : public test::LeakCheckedTest {};

TEST_F(SerializationTest, NestedTensorsEverywhereRoundTrip) {
  Loopback loop(detail::HandlePassing::FdPassing);
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
  Loopback loop(detail::HandlePassing::FdPassing);
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
  Loopback loop(detail::HandlePassing::FdPassing);
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
  Loopback loop(detail::HandlePassing::FdPassing);
  Batch batch;
  batch.images = Tensor::from({1.0f, 2.0f});
  EXPECT_FALSE(batch.images.is_shared());
  Batch got = loop.round_trip(batch);
  EXPECT_TRUE(batch.images.is_shared());
  EXPECT_EQ(got.images.to_vector<float>(), (std::vector<float>{1.0f, 2.0f}));
}

TEST_F(SerializationTest, ProcFdPassingOpensTheSendersFd) {
  Loopback loop(detail::HandlePassing::ProcFd);
  Batch batch;
  batch.images = Tensor::zeros({8}, DType::Int16, Device::SharedCpu);
  Batch got = loop.round_trip(batch);
  EXPECT_EQ(loop.last_fd_count_, 0u);
  EXPECT_FALSE(loop.encoder_.awaiting_acknowledgement());
  EXPECT_EQ(got.images.storage(), batch.images.storage());
}

// An encoder and a decoder keep their archive from frame to frame only while cereal's
// state in it is untouched: a frame whose message uses versions or shared pointers is
// written whole every time (its body does not shrink to references into an earlier
// frame), so that any frame reads on its own, also after a frame that was rolled back.
TEST_F(SerializationTest, ArchiveStateNeverCrossesFrames) {
  detail::MessageEncoder encoder(detail::HandlePassing::FdPassing);
  std::vector<std::uint64_t> body_sizes;
  for (int round = 0; round < 3; ++round) {
    WithArchiveState message;
    message.first = std::make_shared<std::string>("shared " + std::to_string(round));
    message.second = message.first;
    message.versioned.value = round;
    const detail::EncodedFrame& frame = encoder.encode(message);
    std::vector<std::byte> bytes;
    for (const iovec& part : frame.iovecs()) {
      const auto* begin = static_cast<const std::byte*>(part.iov_base);
      bytes.insert(bytes.end(), begin, begin + part.iov_len);
    }
    if (round == 1) {
      encoder.rollback();  // never sent: the next frame must not lean on it
      continue;
    }
    encoder.commit();
    detail::FrameHeader header;
    std::memcpy(&header, bytes.data(), sizeof header);
    body_sizes.push_back(header.body_bytes);
    // A decoder that saw no earlier frame reads it: nothing refers back.
    detail::MessageDecoder decoder(detail::type_fingerprint<WithArchiveState>(), detail::type_name<WithArchiveState>());
    std::deque<detail::UniqueFd> fds;
    decoder.decode(header, std::span<const std::byte>(bytes).subspan(sizeof header), fds);
    const auto got = decoder.read<WithArchiveState>();
    ASSERT_TRUE(got.first && got.second);
    EXPECT_EQ(*got.first, *message.first);
    EXPECT_EQ(got.first.get(), got.second.get()) << "one pointee, as sent";
    EXPECT_EQ(got.versioned.value, round);
    EXPECT_EQ(got.versioned.version_read, 0u);
  }
  ASSERT_EQ(body_sizes.size(), 2u);
  EXPECT_EQ(body_sizes[0], body_sizes[1]);
  // One decoder reading frames in a row, plain and stateful mixed.
  detail::MessageDecoder decoder(detail::type_fingerprint<WithArchiveState>(), detail::type_name<WithArchiveState>());
  std::deque<detail::UniqueFd> fds;
  for (int round = 0; round < 4; ++round) {
    WithArchiveState message;
    if (round % 2 == 1) message.first = message.second = std::make_shared<std::string>("odd");
    const detail::EncodedFrame& frame = encoder.encode(message);
    std::vector<std::byte> bytes;
    for (const iovec& part : frame.iovecs()) {
      const auto* begin = static_cast<const std::byte*>(part.iov_base);
      bytes.insert(bytes.end(), begin, begin + part.iov_len);
    }
    encoder.commit();
    detail::FrameHeader header;
    std::memcpy(&header, bytes.data(), sizeof header);
    decoder.decode(header, std::span<const std::byte>(bytes).subspan(sizeof header), fds);
    const auto got = decoder.read<WithArchiveState>();
    EXPECT_EQ(static_cast<bool>(got.first), round % 2 == 1);
    EXPECT_EQ(got.first.get(), got.second.get());
  }
}

TEST_F(SerializationTest, TypeNameAndFingerprint) {
  EXPECT_EQ(detail::type_name<int>(), "int");
  EXPECT_NE(detail::type_name<Batch>().find("Batch"), std::string_view::npos) << detail::type_name<Batch>();
  EXPECT_EQ(detail::type_name<std::vector<int>>().substr(0, 11), "std::vector");
  EXPECT_NE(detail::type_fingerprint<int>(), detail::type_fingerprint<long>());
}

}  // namespace
}  // namespace ferry
