// HandlePassing::Copying (a transport without shared memory, ucx://): every storage is a
// Copied entry whose bytes the transport carries; the decoder takes exactly the storages
// the transport delivered for them, and refuses a frame whose entries and deliveries
// disagree.
#include <gtest/gtest.h>

#include <cereal/types/vector.hpp>

#include "ferry/detail/message_decoder.hpp"
#include "ferry/detail/message_encoder.hpp"
#include "support/copied_frame.hpp"
#include "support/leak_check.hpp"

namespace ferry {
namespace {

struct Tensors {
  std::vector<Tensor> tensors;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(tensors);
  }
};

class CopiedStorageTest : public test::LeakCheckedTest {};

TEST_F(CopiedStorageTest, StoragesTravelAsTheirBytesReadInPlace) {
  detail::MessageEncoder encoder(detail::HandlePassing::Copying);
  detail::MessageDecoder decoder(detail::type_fingerprint<Tensors>(), detail::type_name<Tensors>());
  Tensor a = Tensor::from<std::int32_t>({1, 2, 3, 4});
  Tensor b = Tensor::from<float>({0.5f});
  Tensors message{{a, b, a}};  // a twice: one storage, one copy
  const test::CopiedFrame encoded = test::encode_copied(encoder, message);
  ASSERT_EQ(encoded.copies.size(), 2u);
  EXPECT_EQ(encoded.copies[0].iov_base, a.data_ptr());  // the sender's pages, not a copy
  EXPECT_EQ(encoded.header.segment_count, 0u);
  std::deque<detail::UniqueFd> fds;
  auto storages = test::deliver_copies(encoded.copies);
  decoder.decode(encoded.header, encoded.payload, fds, &storages);
  const Tensors received = decoder.read<Tensors>();
  ASSERT_EQ(received.tensors.size(), 3u);
  EXPECT_EQ(received.tensors[0].at<std::int32_t>({3}), 4);
  EXPECT_EQ(received.tensors[1].at<float>({0}), 0.5f);
  EXPECT_EQ(received.tensors[0].storage(), received.tensors[2].storage());
  EXPECT_NE(received.tensors[0].data_ptr(), a.data_ptr());  // the receiver's own memory
  EXPECT_EQ(a.device(), Device::Cpu);                       // not moved into shared memory
  EXPECT_EQ(encoder.pinned_storages(), 0u);                 // nothing to give back
}

TEST_F(CopiedStorageTest, AFrameWhoseDeliveriesDoNotMatchItsEntriesIsAProtocolError) {
  detail::MessageEncoder encoder(detail::HandlePassing::Copying);
  const Tensors message{{Tensor::from<std::int32_t>({1, 2})}};  // alive: the copies read its pages
  const test::CopiedFrame encoded = test::encode_copied(encoder, message);
  std::deque<detail::UniqueFd> fds;
  {
    detail::MessageDecoder decoder(detail::type_fingerprint<Tensors>(), detail::type_name<Tensors>());
    EXPECT_THROW(decoder.decode(encoded.header, encoded.payload, fds, nullptr), ProtocolError);  // no bytes at all
  }
  {
    detail::MessageDecoder decoder(detail::type_fingerprint<Tensors>(), detail::type_name<Tensors>());
    std::deque<std::shared_ptr<Storage>> wrong_size{Storage::allocate(3, Device::SharedCpu)};
    EXPECT_THROW(decoder.decode(encoded.header, encoded.payload, fds, &wrong_size), ProtocolError);
  }
  {
    detail::MessageDecoder decoder(detail::type_fingerprint<Tensors>(), detail::type_name<Tensors>());
    auto too_many = test::deliver_copies(encoded.copies);
    too_many.push_back(Storage::allocate(8, Device::SharedCpu));
    EXPECT_THROW(decoder.decode(encoded.header, encoded.payload, fds, &too_many), ProtocolError);
  }
}

}  // namespace
}  // namespace ferry
