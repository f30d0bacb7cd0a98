// HandlePassing::Copying (a transport without shared memory, ucx://): every storage is a
// Copied entry whose bytes the transport carries (a CUDA storage's from a copy in host
// memory); the decoder takes exactly the storages the transport delivered for them, and
// refuses a frame whose entries and deliveries disagree.
#include <gtest/gtest.h>

#include <cereal/types/vector.hpp>
#include <cstring>

#include "ferry/detail/message_decoder.hpp"
#include "ferry/detail/message_encoder.hpp"
#include "support/cuda_probe.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"

namespace ferry {
namespace {

struct Tensors {
  std::vector<Tensor> tensors;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(tensors);
  }
};

struct Encoded {
  FrameHeader header{};
  std::vector<std::byte> payload;
  std::vector<iovec> copies;
};

Encoded encode(MessageEncoder& encoder, const Tensors& message) {
  const EncodedFrame& frame = encoder.encode(message);
  std::vector<std::byte> bytes;
  for (const iovec& part : frame.iovecs()) {
    const auto* begin = static_cast<const std::byte*>(part.iov_base);
    bytes.insert(bytes.end(), begin, begin + part.iov_len);
  }
  Encoded encoded;
  std::memcpy(&encoded.header, bytes.data(), sizeof encoded.header);
  encoded.payload.assign(bytes.begin() + sizeof(FrameHeader), bytes.end());
  encoded.copies.assign(frame.copies.begin(), frame.copies.end());
  EXPECT_TRUE(frame.fds.empty());
  encoder.commit();
  return encoded;
}

// What a transport delivers: storages of its own holding the bytes.
std::deque<std::shared_ptr<Storage>> deliver(const std::vector<iovec>& copies) {
  std::deque<std::shared_ptr<Storage>> storages;
  for (const iovec& copy : copies) {
    auto storage = Storage::allocate(copy.iov_len, Device::SharedCpu);
    if (copy.iov_len > 0) std::memcpy(storage->data(), copy.iov_base, copy.iov_len);
    storages.push_back(std::move(storage));
  }
  return storages;
}

class CopiedStorageTest : public test::LeakCheckedTest {};

TEST_F(CopiedStorageTest, StoragesTravelAsTheirBytesReadInPlace) {
  MessageEncoder encoder(HandlePassing::Copying);
  MessageDecoder decoder(type_fingerprint<Tensors>(), type_name<Tensors>());
  Tensor a = Tensor::from<std::int32_t>({1, 2, 3, 4});
  Tensor b = Tensor::from<float>({0.5f});
  Tensors message{{a, b, a}};  // a twice: one storage, one copy
  const Encoded encoded = encode(encoder, message);
  ASSERT_EQ(encoded.copies.size(), 2u);
  EXPECT_EQ(encoded.copies[0].iov_base, a.data_ptr());  // the sender's pages, not a copy
  EXPECT_EQ(encoded.header.segment_count, 0u);
  std::deque<UniqueFd> fds;
  auto storages = deliver(encoded.copies);
  decoder.decode(encoded.header, encoded.payload, fds, &storages);
  const Tensors received = decoder.read<Tensors>();
  ASSERT_EQ(received.tensors.size(), 3u);
  EXPECT_EQ(received.tensors[0].at<std::int32_t>({3}), 4);
  EXPECT_EQ(received.tensors[1].at<float>({0}), 0.5f);
  EXPECT_EQ(received.tensors[0].storage(), received.tensors[2].storage());
  EXPECT_NE(received.tensors[0].data_ptr(), a.data_ptr());  // the receiver's own memory
  EXPECT_EQ(a.device(), Device::Cpu);                        // not moved into shared memory
  EXPECT_EQ(encoder.pinned_storages(), 0u);                  // nothing to give back
}

TEST_F(CopiedStorageTest, AFrameWhoseDeliveriesDoNotMatchItsEntriesIsAProtocolError) {
  MessageEncoder encoder(HandlePassing::Copying);
  const Tensors message{{Tensor::from<std::int32_t>({1, 2})}};  // alive: the copies read its pages
  const Encoded encoded = encode(encoder, message);
  std::deque<UniqueFd> fds;
  {
    MessageDecoder decoder(type_fingerprint<Tensors>(), type_name<Tensors>());
    EXPECT_THROW(decoder.decode(encoded.header, encoded.payload, fds, nullptr), ProtocolError);  // no bytes at all
  }
  {
    MessageDecoder decoder(type_fingerprint<Tensors>(), type_name<Tensors>());
    std::deque<std::shared_ptr<Storage>> wrong_size{Storage::allocate(3, Device::SharedCpu)};
    EXPECT_THROW(decoder.decode(encoded.header, encoded.payload, fds, &wrong_size), ProtocolError);
  }
  {
    MessageDecoder decoder(type_fingerprint<Tensors>(), type_name<Tensors>());
    auto too_many = deliver(encoded.copies);
    too_many.push_back(Storage::allocate(8, Device::SharedCpu));
    EXPECT_THROW(decoder.decode(encoded.header, encoded.payload, fds, &too_many), ProtocolError);
  }
}

// A CUDA tensor travels as a copy of its storage's bytes in host memory (staged at the
// sender: UCX as Debian builds it has no CUDA transport) and arrives on the receiver's CPU,
// each view with its layout. CUDA does not survive fork(): the child uses it, not the test.
TEST(CopiedStorageCudaTest, ACudaStorageTravelsAsAHostCopyOfItsBytes) {
  FERRY_SKIP_WITHOUT_GPU();
  const pid_t child = test::fork_child([] {
    std::vector<float> values(6 * 5);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
    const Tensor host = Tensor::from(values, {6, 5}, Device::Cpu);
    const Tensor device = host.clone(Device::Cuda(0));
    MessageEncoder encoder(HandlePassing::Copying);
    const Tensors message{{device, device.transpose(0, 1), device.slice(1, 1, 5, 2)}};
    const Encoded encoded = encode(encoder, message);
    CHILD_CHECK(encoded.copies.size() == 1);  // one storage, staged once
    CHILD_CHECK(encoded.copies[0].iov_len == device.nbytes());
    CHILD_CHECK(encoded.copies[0].iov_base != device.data_ptr());
    CHILD_CHECK(std::memcmp(encoded.copies[0].iov_base, host.data_ptr(), host.nbytes()) == 0);
    MessageDecoder decoder(type_fingerprint<Tensors>(), type_name<Tensors>());
    std::deque<UniqueFd> fds;
    auto storages = deliver(encoded.copies);
    decoder.decode(encoded.header, encoded.payload, fds, &storages);
    const Tensors received = decoder.read<Tensors>();
    CHILD_CHECK(received.tensors.size() == 3);
    CHILD_CHECK(received.tensors[0].device() == Device::SharedCpu);
    CHILD_CHECK(received.tensors[0].to_vector<float>() == values);
    CHILD_CHECK(received.tensors[1].to_vector<float>() == host.transpose(0, 1).to_vector<float>());
    CHILD_CHECK(received.tensors[2].to_vector<float>() == host.slice(1, 1, 5, 2).to_vector<float>());
    CHILD_CHECK(received.tensors[1].storage() == received.tensors[0].storage());
    CHILD_CHECK(device.device() == Device::Cuda(0));  // the sender's tensor stays where it was
  });
  EXPECT_TRUE(test::child_succeeded(child));
}

}  // namespace
}  // namespace ferry
