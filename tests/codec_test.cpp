// The encoder and decoder as frame codecs over their connection state, with no transport:
// frames move in memory (test::CodecLoop), so that a test can cut, patch or lose them.
// Slot numbering and reuse, releases, the return path, lying and truncated frames, and the
// death of either end.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cereal/types/vector.hpp>
#include <string>
#include <vector>

#include "support/codec_loop.hpp"
#include "support/leak_check.hpp"

namespace ferry {
namespace {

using namespace ferry::detail;  // the codecs and their wire types

struct CodecTensors {
  std::vector<Tensor> tensors;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(tensors);
  }
};

Tensor filled(std::int64_t n, float value) {
  Tensor t = Tensor::zeros({n}, DType::Float32, Device::SharedCpu);
  for (std::int64_t i = 0; i < n; ++i) t.at<float>({i}) = value;
  return t;
}

// Delivers `frame`, which must be refused; returns the error's message. As a channel, the
// broken receiver then closes, and its sender sees it gone.
std::string protocol_error_of(test::CodecLoop<CodecTensors>& loop, test::WireFrame frame) {
  std::string message = "no ProtocolError";
  try {
    loop.deliver(std::move(frame));
  } catch (const ProtocolError& error) {
    message = error.what();
  }
  loop.encoder.receiver_gone();
  return message;
}

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

class CodecTest : public test::LeakCheckedTest {};

TEST_F(CodecTest, BothEndsCountTheSameLeasesFrameByFrame) {
  test::CodecLoop<CodecTensors> loop;
  Tensor a = filled(8, 1), b = filled(8, 2);
  CodecTensors got = loop.round_trip({{a, b}});
  EXPECT_EQ(got.tensors[1].at<float>({7}), 2.0f);
  EXPECT_EQ(loop.encoder.tracked_storages(), 2u);
  EXPECT_EQ(loop.decoder.leased(), 2u);
  EXPECT_EQ(loop.encoder.tracked_segments(), loop.decoder.leased_segments());
  // Sent again: the same slots, as leases only.
  const test::WireFrame again = loop.send({{b, a}});
  EXPECT_EQ(again.header().handle_count, 2u);
  EXPECT_EQ(again.handle(0).kind, static_cast<std::uint32_t>(HandleKind::Leased));
  EXPECT_EQ(again.handle(0).slot, 1u);
  EXPECT_EQ(again.handle(1).slot, 0u);
  EXPECT_TRUE(again.fds.empty());
  loop.deliver(test::WireFrame{again.bytes, {}});
  EXPECT_EQ(loop.decoder.leased(), 2u);
}

TEST_F(CodecTest, ADeadStorageIsReleasedOnceAndItsSlotReusedAfterTheReturn) {
  test::CodecLoop<CodecTensors> loop;
  {
    Tensor a = filled(8, 1);
    loop.round_trip({{a}});  // slot 0; the received tensor is `a` itself (same process)
  }
  // `a` died on both sides: the next frame announces slot 0's release exactly once.
  const test::WireFrame releasing = loop.send({});
  EXPECT_EQ(releasing.releases(), std::vector<std::uint32_t>{0});
  loop.deliver(test::WireFrame{releasing.bytes, {}});
  EXPECT_EQ(loop.decoder.leased(), 0u);
  EXPECT_EQ(loop.encoder.tracked_storages(), 0u);
  // The lease's block gave the slot back on the return board: a new storage takes it.
  Tensor c = filled(8, 3);
  const test::WireFrame reusing = loop.send({{c}});
  EXPECT_TRUE(reusing.releases().empty());
  ASSERT_EQ(reusing.header().handle_count, 1u);
  EXPECT_EQ(reusing.handle(0).kind, static_cast<std::uint32_t>(HandleKind::NewBlock));
  EXPECT_EQ(reusing.handle(0).slot, 0u);
  EXPECT_EQ(loop.deliver(test::WireFrame{reusing.bytes, {}}).tensors[0].at<float>({0}), 3.0f);
  EXPECT_EQ(loop.encoder.pinned_storages(), 1u);  // c's only: a's pin went with its return
}

// A new reference on the same Storage object, with its own control block (as a receiver's
// handle on a storage it leases): the sender's slot records one reference at a time.
Tensor through_new_reference(const Tensor& tensor) {
  const std::shared_ptr<Storage>& storage = tensor.storage();
  // The deleter lets go at once: its object lives on with the control block while weak
  // references (the sender's slot) remain.
  std::shared_ptr<Storage> handle(storage.get(), [keep = storage](Storage*) mutable { keep.reset(); });
  return Tensor::from_storage(std::move(handle), tensor.dtype(), tensor.shape(), tensor.strides(),
                              tensor.storage_offset());
}

TEST_F(CodecTest, AStorageSentAgainThroughANewReferenceStaysLeasedAfterTheOldOneDied) {
  test::CodecLoop<CodecTensors> loop;
  Tensor a = filled(8, 1), other = filled(8, 2);
  loop.round_trip({{through_new_reference(a), other}});  // slots 0 and 1; slot 0 records the first reference
  other = Tensor();                                      // a death: the next frame looks for dead slots
  // The first reference died, the Storage did not: sent through a second one, `a` keeps its
  // slot (the frame records the new reference before it looks for dead ones).
  const test::WireFrame again = loop.send({{through_new_reference(a)}});
  EXPECT_EQ(again.releases(), std::vector<std::uint32_t>{1});
  ASSERT_EQ(again.header().handle_count, 1u);
  EXPECT_EQ(again.handle(0).kind, static_cast<std::uint32_t>(HandleKind::Leased));
  EXPECT_EQ(again.handle(0).slot, 0u);
  EXPECT_EQ(loop.deliver(test::WireFrame{again.bytes, {}}).tensors[0].at<float>({7}), 1.0f);
  // Sent again and again through one reference, the slot keeps recording it: once that
  // reference dies, its release is announced once.
  {
    const Tensor held = through_new_reference(a);
    for (int i = 0; i < 3; ++i) {
      const test::WireFrame leased = loop.send({{held}});
      EXPECT_EQ(leased.handle(0).kind, static_cast<std::uint32_t>(HandleKind::Leased));
      EXPECT_TRUE(leased.releases().empty());
      EXPECT_EQ(loop.deliver(test::WireFrame{leased.bytes, {}}).tensors[0].at<float>({0}), 1.0f);
    }
  }
  // A death to make the next frame look (dropping a reference to a Storage that lives counts as
  // none).
  Tensor dying = filled(8, 3);
  const test::WireFrame introducing = loop.send({{dying}});
  const std::uint32_t dying_slot = introducing.handle(0).slot;
  loop.deliver(test::WireFrame{introducing.bytes, {}});
  dying = Tensor();
  const test::WireFrame releasing = loop.send({});
  std::vector<std::uint32_t> released = releasing.releases();
  std::sort(released.begin(), released.end());
  EXPECT_EQ(released, (std::vector<std::uint32_t>{0, dying_slot}));
  loop.deliver(test::WireFrame{releasing.bytes, {}});
  EXPECT_EQ(loop.encoder.tracked_storages(), 0u);
  EXPECT_EQ(loop.decoder.leased(), 0u);
}

TEST_F(CodecTest, ViewsOfOneStorageShareItWhenTheLastTakesTheFramesReference) {
  test::CodecLoop<CodecTensors> loop;
  Tensor whole = Tensor::zeros({3, 4}, DType::Float32, Device::SharedCpu);
  for (std::int64_t i = 0; i < 3; ++i) whole.at<float>({i, 0}) = static_cast<float>(i + 1);
  for (int round = 0; round < 2; ++round) {  // a new block, then a lease
    CodecTensors got = loop.round_trip({whole.unbind()});
    ASSERT_EQ(got.tensors.size(), 3u);
    // The last record's tensor took the frame's reference; the others share the storage.
    for (std::int64_t i = 0; i < 3; ++i) {
      ASSERT_NE(got.tensors[i].storage(), nullptr);
      EXPECT_EQ(got.tensors[i].storage(), got.tensors[0].storage());
      EXPECT_EQ(got.tensors[i].at<float>({0}), static_cast<float>(i + 1));
    }
    got.tensors.erase(got.tensors.begin(), got.tensors.begin() + 2);  // the last one lives on
    EXPECT_EQ(got.tensors[0].at<float>({0}), 3.0f);
  }
  EXPECT_EQ(loop.decoder.leased(), 1u);
}

TEST_F(CodecTest, AFrameNotSentGivesItsSlotsBackAndKeepsItsReleasesForTheNext) {
  test::CodecLoop<CodecTensors> loop;
  { loop.round_trip({{filled(4, 1)}}); }
  Tensor b = filled(4, 2);
  loop.encoder.encode(CodecTensors{{b}});
  loop.encoder.rollback();  // the transport failed before the frame left
  EXPECT_EQ(loop.encoder.tracked_storages(), 0u);
  EXPECT_EQ(loop.encoder.pinned_storages(), 1u);  // the first storage's, until its slot comes back
  const test::WireFrame next = loop.send({{b}});
  EXPECT_EQ(next.releases(), std::vector<std::uint32_t>{0});  // still announced
  EXPECT_EQ(next.handle(0).slot, 1u);                         // slot 0 waits for its release and return
  EXPECT_EQ(loop.deliver(test::WireFrame{next.bytes, {}}).tensors[0].at<float>({3}), 2.0f);
  EXPECT_EQ(loop.decoder.leased(), 1u);
}

TEST_F(CodecTest, ATruncatedFrameIsRefusedAndItsFdsAreClosed) {
  test::CodecLoop<CodecTensors> loop;
  test::WireFrame frame = loop.send({{filled(16, 1)}});
  ASSERT_FALSE(frame.fds.empty());
  std::vector<int> handed;
  for (const UniqueFd& fd : frame.fds) handed.push_back(fd.get());
  frame.bytes.pop_back();
  EXPECT_EQ(protocol_error_of(loop, std::move(frame)), "frame is shorter than its header claims");
  for (const int fd : handed) EXPECT_FALSE(is_open(fd)) << "fd " << fd << " outlived its refused frame";
  EXPECT_EQ(loop.decoder.leased(), 0u);
  EXPECT_EQ(loop.encoder.pinned_storages(), 0u);  // the frame was never resolved
}

TEST_F(CodecTest, AFrameWithFewerFdsThanItClaimsIsRefused) {
  test::CodecLoop<CodecTensors> loop;
  test::WireFrame frame = loop.send({{filled(16, 1)}});
  frame.fds.pop_back();
  EXPECT_EQ(protocol_error_of(loop, std::move(frame)), "frame claims 2 file descriptors but 1 arrived");
  EXPECT_EQ(loop.encoder.pinned_storages(), 0u);
}

TEST_F(CodecTest, ReleasingASlotThatHoldsNothingIsRefused) {
  test::CodecLoop<CodecTensors> loop;
  test::WireFrame frame = loop.send({});
  frame.add_release(9);
  EXPECT_EQ(protocol_error_of(loop, std::move(frame)), "frame releases slot 9 which holds no lease");
}

TEST_F(CodecTest, ANewBlockOnAHeldSlotIsRefused) {
  test::CodecLoop<CodecTensors> loop;
  Tensor a = filled(8, 1);
  loop.round_trip({{a}});
  test::WireFrame frame = loop.send({{filled(8, 2)}});
  HandleEntry entry = frame.handle(0);
  ASSERT_EQ(entry.slot, 1u);
  entry.slot = 0;
  frame.set_handle(0, entry);
  EXPECT_EQ(protocol_error_of(loop, std::move(frame)), "handle 0 reuses slot 0 before releasing it");
}

TEST_F(CodecTest, ALeaseOfAnEmptySlotOrAnotherSizeIsRefused) {
  test::CodecLoop<CodecTensors> loop;
  Tensor a = filled(8, 1);
  loop.round_trip({{a}});
  test::WireFrame frame = loop.send({{a}});
  HandleEntry entry = frame.handle(0);
  ASSERT_EQ(entry.kind, static_cast<std::uint32_t>(HandleKind::Leased));
  entry.slot = 5;
  frame.set_handle(0, entry);
  EXPECT_EQ(protocol_error_of(loop, test::WireFrame{frame.bytes, {}}),
            "handle 0 refers to slot 5 which holds no lease");
  entry.slot = 0;
  entry.nbytes = 4;
  frame.set_handle(0, entry);
  EXPECT_EQ(protocol_error_of(loop, test::WireFrame{frame.bytes, {}}),
            "handle 0 field nbytes claims 4 bytes but the storage leased at slot 0 has 32");
}

TEST_F(CodecTest, SlotsAboveTheLimitAreRefused) {
  test::CodecLoop<CodecTensors> loop;
  test::WireFrame frame = loop.send({{filled(8, 1)}});
  HandleEntry entry = frame.handle(0);
  entry.slot = MessageDecoder::kMaxSlots;
  frame.set_handle(0, entry);
  EXPECT_EQ(protocol_error_of(loop, std::move(frame)),
            "handle 0 asks for slot " + std::to_string(MessageDecoder::kMaxSlots) + ", above the limit of " +
                std::to_string(MessageDecoder::kMaxSlots));
}

TEST_F(CodecTest, ASegmentSlotReusedBeforeItsReleaseIsRefused) {
  test::CodecLoop<CodecTensors> loop;
  // Two segments: a slab of small blocks, then a large block in a segment of its own.
  loop.round_trip({{filled(8, 1)}});
  test::WireFrame frame = loop.send({{filled(1 << 20, 2)}});
  std::size_t data = frame.header().segment_count;
  for (std::size_t i = 0; i < frame.header().segment_count; ++i) {
    if (frame.segment(i).role == static_cast<std::uint32_t>(SegmentRole::Data)) data = i;
  }
  ASSERT_LT(data, frame.header().segment_count);
  SegmentEntry entry = frame.segment(data);
  ASSERT_EQ(entry.slot_or_reclaims, 1u);
  entry.slot_or_reclaims = 0;
  frame.set_segment(data, entry);
  EXPECT_EQ(protocol_error_of(loop, std::move(frame)),
            "segment " + std::to_string(data) + " reuses segment slot 0 before releasing it");
}

TEST_F(CodecTest, AReceiverThatDiesUnresolvedLetsEveryPinGo) {
  test::CodecLoop<CodecTensors> loop;
  Tensor a = filled(8, 1);
  test::WireFrame lost = loop.send({{a}});  // never delivered
  EXPECT_EQ(loop.encoder.pinned_storages(), 1u);
  loop.encoder.receiver_gone();
  EXPECT_EQ(loop.encoder.pinned_storages(), 0u);
}

TEST_F(CodecTest, AReceiverThatDropsItsLeasesGivesEverySlotBack) {
  test::CodecLoop<CodecTensors> loop;
  Tensor a = filled(8, 1), b = filled(8, 2);
  CodecTensors got = loop.round_trip({{a, b}});
  // The sender's end closed (or died): the receiver drops every lease; what its caller still
  // holds stays readable.
  loop.decoder.release_all();
  EXPECT_EQ(loop.decoder.leased(), 0u);
  EXPECT_EQ(got.tensors[0].at<float>({0}), 1.0f);
  // The blocks gave their slots back: the sender frees them although both storages live.
  loop.encoder.encode(CodecTensors{});
  loop.encoder.rollback();
  EXPECT_EQ(loop.encoder.tracked_storages(), 0u);
  EXPECT_EQ(loop.encoder.pinned_storages(), 0u);
}

}  // namespace
}  // namespace ferry
