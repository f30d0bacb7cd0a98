// Typed channels between real processes over every transport: values, tensors of every
// dtype, views, zero copy, the cache hit, end of stream and timeouts.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <limits>
#include <numeric>
#include <thread>

#include "ferry/detail/frame_channel.hpp"
#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/syscall_fault.hpp"
#include "support/transports.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::child_succeeded;
using test::fork_child;

struct TrainingBatch {
  std::int64_t step = 0;
  std::string tag;
  Tensor images;
  std::vector<Tensor> extra;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(step, tag, images, extra);
  }
};

class ChannelTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {};

INSTANTIATE_TEST_SUITE_P(Transports, ChannelTest, ::testing::ValuesIn(test::interprocess_transports()),
                         test::transport_test_name);

// A tensor of `dtype` whose element i holds (i * 7 + seed) % 100, in shared memory.
Tensor patterned(DType dtype, const Shape& shape, int seed) {
  Tensor t = Tensor::empty(shape, dtype, Device::SharedCpu);
  auto* bytes = static_cast<std::byte*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const int v = static_cast<int>((i * 7 + seed) % 100);
    std::byte* at = bytes + static_cast<std::size_t>(i) * t.element_size();
    switch (dtype) {
      case DType::Bool: {
        const bool b = v % 2;
        std::memcpy(at, &b, 1);
        break;
      }
      case DType::UInt8: {
        const auto x = static_cast<std::uint8_t>(v);
        std::memcpy(at, &x, 1);
        break;
      }
      case DType::Int8: {
        const auto x = static_cast<std::int8_t>(v);
        std::memcpy(at, &x, 1);
        break;
      }
      case DType::Int16: {
        const auto x = static_cast<std::int16_t>(v);
        std::memcpy(at, &x, 2);
        break;
      }
      case DType::Int32: {
        const auto x = static_cast<std::int32_t>(v);
        std::memcpy(at, &x, 4);
        break;
      }
      case DType::Int64: {
        const auto x = static_cast<std::int64_t>(v);
        std::memcpy(at, &x, 8);
        break;
      }
      case DType::Float16: {
        const Half x(static_cast<float>(v));
        std::memcpy(at, &x, 2);
        break;
      }
      case DType::BFloat16: {
        const BFloat16 x(static_cast<float>(v));
        std::memcpy(at, &x, 2);
        break;
      }
      case DType::Float32: {
        const auto x = static_cast<float>(v);
        std::memcpy(at, &x, 4);
        break;
      }
      case DType::Float64: {
        const auto x = static_cast<double>(v);
        std::memcpy(at, &x, 8);
        break;
      }
    }
  }
  return t;
}

bool same_elements(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor x = a.contiguous();
  const Tensor y = b.contiguous();
  return x.nbytes() == 0 || std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

TEST_P(ChannelTest, PlainValuesArriveInOrderThenEndOfStream) {
  auto [tx, rx] = channel<std::string>(GetParam());
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    tx.detach();
    for (int i = 0; i < 100; ++i) {
      auto value = rx.recv();
      CHILD_CHECK(value.has_value());
      CHILD_CHECK(*value == "message " + std::to_string(i));
    }
    CHILD_CHECK(!rx.recv().has_value());
    CHILD_CHECK(!rx.recv().has_value());  // stays at end of stream
  });
  rx.close();
  for (int i = 0; i < 100; ++i) tx.send("message " + std::to_string(i));
  tx.close();
  EXPECT_TRUE(child_succeeded(child));
  EXPECT_THROW(tx.send("late"), ChannelClosed);
}

TEST_P(ChannelTest, EveryDTypeAndViewRoundTripsAcrossProcesses) {
  auto [tx, rx] = channel<TrainingBatch>(GetParam());
  std::vector<Tensor> originals;
  for (int raw = 0; raw < kDTypeCount; ++raw) originals.push_back(patterned(static_cast<DType>(raw), {6, 5}, raw));
  TrainingBatch batch{3, "dtypes", patterned(DType::Float32, {4, 6, 8}, 99), {}};
  for (const Tensor& t : originals) {
    batch.extra.push_back(t);
    batch.extra.push_back(t.transpose(0, 1));    // non-contiguous
    batch.extra.push_back(t.slice(0, 1, 5, 2));  // offset and step
    batch.extra.push_back(t.select(1, 3));       // offset, dimension removed
  }
  batch.extra.push_back(batch.images.slice(2, 1, 7).transpose(0, 2));
  const TrainingBatch expected = batch;

  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    tx.detach();
    auto got = rx.recv();
    CHILD_CHECK(got.has_value());
    CHILD_CHECK(got->step == 3 && got->tag == "dtypes");
    CHILD_CHECK(got->extra.size() == expected.extra.size());
    CHILD_CHECK(same_elements(got->images, expected.images));
    for (std::size_t i = 0; i < expected.extra.size(); ++i) {
      CHILD_CHECK(same_elements(got->extra[i], expected.extra[i]));
      CHILD_CHECK(got->extra[i].strides() == expected.extra[i].strides());
      CHILD_CHECK(got->extra[i].storage_offset() == expected.extra[i].storage_offset());
    }
    // Four views of each storage arrive as views of one storage.
    CHILD_CHECK(got->extra[0].shares_storage_with(got->extra[3]));
    CHILD_CHECK(got->extra.back().shares_storage_with(got->images));
    CHILD_CHECK(!got->extra[0].shares_storage_with(got->extra[4]));
  });
  rx.close();
  tx.send(batch);
  tx.close();
  EXPECT_TRUE(child_succeeded(child));
}

TEST_P(ChannelTest, SharedTensorIsZeroCopyInBothDirections) {
  auto [to_child, from_parent] = channel<TrainingBatch>(GetParam());
  auto [to_parent, from_child] = channel<int>(GetParam());
  Tensor shared = Tensor::zeros({1024}, DType::Int32, Device::SharedCpu);

  const pid_t child = fork_child(
      [&, &to_child = to_child, &from_parent = from_parent, &to_parent = to_parent, &from_child = from_child] {
        to_child.detach();
        from_child.close();
        to_parent.adopt();
        auto batch = from_parent.recv();
        CHILD_CHECK(batch.has_value());
        Tensor view_a = batch->extra.at(0);
        Tensor view_b = batch->extra.at(1);
        CHILD_CHECK(view_a.shares_storage_with(view_b));
        view_a.at<std::int32_t>({10}) = 77;                 // write through one view ...
        CHILD_CHECK(view_b.at<std::int32_t>({5}) == 77);    // ... seen through the other (offset 5)
        to_parent.send(1);                                  // parent: read 77, then write 42
        CHILD_CHECK(from_parent.recv().value().step == 2);  // parent wrote
        CHILD_CHECK(batch->images.at<std::int32_t>({1000}) == 42);
        to_parent.close();
      });
  from_parent.close();
  to_parent.detach();
  to_child.send(TrainingBatch{1, "", shared, {shared.slice(0, 0, 512), shared.slice(0, 5, 600)}});
  ASSERT_EQ(from_child.recv().value(), 1);
  EXPECT_EQ(shared.at<std::int32_t>({10}), 77);  // the child's write reached our memory
  shared.at<std::int32_t>({1000}) = 42;
  to_child.send(TrainingBatch{2, "", Tensor(), {}});
  EXPECT_FALSE(from_child.recv().has_value());
  to_child.close();
  EXPECT_TRUE(child_succeeded(child));
}

TEST_P(ChannelTest, SameStorageSentManyTimesIsMappedOnce) {
  auto [tx, rx] = channel<TrainingBatch>(GetParam());
  Tensor shared = patterned(DType::Float32, {256, 256}, 1);
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    tx.detach();
    const void* first_address = nullptr;
    for (int i = 0; i < 200; ++i) {
      auto got = rx.recv();  // dropped at once: the lease keeps the mapping
      CHILD_CHECK(got.has_value());
      if (i == 0) first_address = got->images.data_ptr();
      CHILD_CHECK(got->images.data_ptr() == first_address);
      CHILD_CHECK(got->images.at<float>({0, 1}) == 8.0f);
    }
    CHILD_CHECK(test::count_ferry_mappings() == 1);
    CHILD_CHECK(detail::EndAccess::core(rx).leased() == 1);
    CHILD_CHECK(!rx.recv().has_value());
  });
  rx.close();
  for (int i = 0; i < 200; ++i) tx.send(TrainingBatch{i, "", shared.slice(0, 0, 128 + i % 2), {}});
  EXPECT_EQ(detail::EndAccess::core(tx).tracked_storages(), 1u);
  tx.close();
  EXPECT_TRUE(child_succeeded(child));
}

// The handle cache: a segment that reaches a process over two channels is mapped once, and
// a storage of it arrives at the same address on both. (The tensor is made after the fork,
// so the child cannot have inherited a mapping of its segment.)
TEST_P(ChannelTest, SegmentReceivedOverTwoChannelsIsMappedOnce) {
  auto [tx, rx] = channel<TrainingBatch>(GetParam());
  auto [other_tx, other_rx] = channel<TrainingBatch>(GetParam());
  const pid_t child = fork_child([&, &rx = rx, &tx = tx, &other_rx = other_rx, &other_tx = other_tx] {
    tx.detach();
    other_tx.detach();
    auto first = rx.recv();
    auto second = other_rx.recv();
    CHILD_CHECK(first.has_value() && second.has_value());
    CHILD_CHECK(first->images.data_ptr() == second->images.data_ptr());
    CHILD_CHECK(second->images.at<float>({0, 1}) == 8.0f);
    CHILD_CHECK(test::count_ferry_mappings() == 1);
    CHILD_CHECK(!rx.recv().has_value() && !other_rx.recv().has_value());
  });
  rx.close();
  other_rx.close();
  Tensor shared = patterned(DType::Float32, {256, 256}, 1);  // a segment of its own
  tx.send(TrainingBatch{0, "", shared, {}});
  other_tx.send(TrainingBatch{0, "", shared, {}});
  tx.close();
  other_tx.close();
  EXPECT_TRUE(child_succeeded(child));
}

TEST_P(ChannelTest, EchoedStorageTravelsAsALeaseBothWays) {
  auto [ping_tx, ping_rx] = channel<TrainingBatch>(GetParam());
  auto [pong_tx, pong_rx] = channel<TrainingBatch>(GetParam());
  const pid_t child = fork_child([&, &ping_tx = ping_tx, &ping_rx = ping_rx, &pong_tx = pong_tx, &pong_rx = pong_rx] {
    ping_tx.detach();
    pong_rx.close();
    pong_tx.adopt();
    const void* first = nullptr;
    std::uint64_t first_id = 0;
    while (auto batch = ping_rx.recv()) {
      if (first == nullptr) {
        first = batch->images.data_ptr();
        first_id = batch->images.storage()->id();
      }
      // Dropped after each echo, yet the storage keeps its identity while the sender holds it.
      CHILD_CHECK(batch->images.data_ptr() == first);
      CHILD_CHECK(batch->images.storage()->id() == first_id);
      pong_tx.send(*batch);
    }
    CHILD_CHECK(detail::EndAccess::core(pong_tx).storages_passed() == 1);
    pong_tx.close();
  });
  ping_rx.close();
  pong_tx.detach();
  Tensor shared = patterned(DType::Int32, {64}, 3);
  for (int i = 0; i < 50; ++i) {
    ping_tx.send(TrainingBatch{i, "", shared, {shared.slice(0, 1, 9)}});
    auto back = pong_rx.recv();
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(back->images.storage(), shared.storage());  // our own storage came back
    EXPECT_TRUE(back->extra.at(0).shares_storage_with(shared));
  }
  EXPECT_EQ(detail::EndAccess::core(ping_tx).storages_passed(), 1u);
  ping_tx.close();
  EXPECT_FALSE(pong_rx.recv().has_value());
  EXPECT_TRUE(child_succeeded(child));
}

TEST_P(ChannelTest, NewStorageEachTimeIsReleasedWhenTheSenderDropsIt) {
  auto [tx, rx] = channel<TrainingBatch>(GetParam());
  auto [reply_tx, reply_rx] = channel<int>(GetParam());
  const pid_t child = fork_child([&, &rx = rx, &tx = tx, &reply_tx = reply_tx, &reply_rx = reply_rx] {
    tx.detach();
    reply_rx.close();
    reply_tx.adopt();
    for (int i = 0; i < 300; ++i) {
      auto got = rx.recv();
      CHILD_CHECK(got.has_value());
      CHILD_CHECK(got->images.at<std::int64_t>({0}) == i);
      // The sender dropped every earlier storage, so at most one earlier lease remains.
      CHILD_CHECK(detail::EndAccess::core(rx).leased() <= 2);
      reply_tx.send(i);
    }
    CHILD_CHECK(!rx.recv().has_value());
    CHILD_CHECK(detail::EndAccess::core(rx).leased() == 0);
    CHILD_CHECK(test::count_ferry_mappings() == 0);
  });
  rx.close();
  reply_tx.detach();
  for (int i = 0; i < 300; ++i) {
    Tensor t = Tensor::zeros({512}, DType::Int64, Device::SharedCpu);
    t.at<std::int64_t>({0}) = i;
    tx.send(TrainingBatch{i, "", t, {}});  // dropped right after send
    ASSERT_EQ(reply_rx.recv().value(), i);
  }
  tx.close();
  EXPECT_TRUE(child_succeeded(child));
}

TEST_P(ChannelTest, SenderRunningAheadLosesNothing) {
  auto [tx, rx] = channel<TrainingBatch>(GetParam());
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    tx.detach();
    for (int i = 0; i < 500; ++i) {
      auto got = rx.recv();
      CHILD_CHECK(got.has_value());
      CHILD_CHECK(got->images.at<std::int64_t>({100}) == i);
      if (i % 50 == 0) std::this_thread::sleep_for(2ms);  // fall behind now and then
    }
    CHILD_CHECK(!rx.recv().has_value());
    CHILD_CHECK(detail::EndAccess::core(rx).leased() == 0);
  });
  rx.close();
  for (int i = 0; i < 500; ++i) {
    Tensor t = Tensor::zeros({128}, DType::Int64, Device::SharedCpu);
    t.at<std::int64_t>({100}) = i;
    tx.send(TrainingBatch{i, "", t, {}});
  }
  tx.close();
  EXPECT_TRUE(child_succeeded(child));
}

TEST_P(ChannelTest, SenderMayExitRightAfterSending) {
  auto [tx, rx] = channel<TrainingBatch>(GetParam());
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    rx.close();
    tx.adopt();
    Tensor t = Tensor::from({1.0, 2.0, 3.0});
    tx.send(TrainingBatch{1, "bye", t, {}});
    tx.close();  // the process exits at once; the receiver must still get the tensor
  });
  tx.detach();
  std::this_thread::sleep_for(50ms);
  auto got = rx.recv();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->images.to_vector<double>(), (std::vector<double>{1.0, 2.0, 3.0}));
  EXPECT_FALSE(rx.recv().has_value());
  EXPECT_TRUE(child_succeeded(child));
}

TEST_P(ChannelTest, EmptyTensorsTravelWithoutMapping) {
  auto [tx, rx] = channel<TrainingBatch>(GetParam());
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    tx.detach();
    auto got = rx.recv();
    CHILD_CHECK(got.has_value());
    CHILD_CHECK(got->images.numel() == 0);
    CHILD_CHECK(got->images.shape() == (Shape{0, 3}));
    CHILD_CHECK(!got->extra.at(0).defined());
    CHILD_CHECK(test::count_ferry_mappings() == 0);
  });
  rx.close();
  tx.send(TrainingBatch{0, "", Tensor::empty({0, 3}, DType::Float32, Device::SharedCpu), {Tensor()}});
  tx.close();
  EXPECT_TRUE(child_succeeded(child));
}

// A message above the channel's FrameLimits (both ends share them) is refused by send(),
// naming the limit: the receiver would refuse the frame anyway, with a ProtocolError that
// breaks its channel for good, and the sender would only see ChannelClosed blaming the
// receiver. Nothing is sent, and the channel goes on.
TEST_P(ChannelTest, SendRefusesAMessageAboveTheChannelsLimitsAndStaysUsable) {
  ChannelOptions options;
  options.limits.max_handles = 4;
  auto [tx, rx] = channel<std::vector<Tensor>>(GetParam(), options);
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    tx.detach();
    auto got = rx.recv();
    CHILD_CHECK(got.has_value());
    CHILD_CHECK(got->size() == 3);
    CHILD_CHECK(got->at(2).to_vector<float>() == (std::vector<float>{2.0f}));
    CHILD_CHECK(!rx.recv().has_value());
  });
  rx.close();
  std::vector<Tensor> five;
  for (int i = 0; i < 5; ++i) five.push_back(Tensor::from<float>({static_cast<float>(i)}, Device::SharedCpu));
  try {
    tx.send(five);
    ADD_FAILURE() << "a message of 5 storages went out on a channel whose limit is 4";
  } catch (const ChannelClosed& error) {
    ADD_FAILURE() << "the sender's own oversized message was blamed on the receiver: " << error.what();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("max_handles"), std::string::npos) << error.what();
  }
  ASSERT_TRUE(tx.is_open());
  tx.send(std::vector<Tensor>(five.begin(), five.begin() + 3));
  tx.close();
  EXPECT_TRUE(child_succeeded(child));
}

// The same for a body above max_body_bytes (the check is one for every limit, shared with
// the receiver's: HostileFrameTest.HeaderCountsAboveTheirLimits).
TEST_P(ChannelTest, SendRefusesABodyAboveTheChannelsLimitAndStaysUsable) {
  ChannelOptions options;
  options.limits.max_body_bytes = 1024;
  auto [tx, rx] = channel<std::vector<std::uint8_t>>(GetParam(), options);
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    tx.detach();
    auto got = rx.recv();
    CHILD_CHECK(got.has_value() && got->size() == 10);
    CHILD_CHECK(!rx.recv().has_value());
  });
  rx.close();
  try {
    tx.send(std::vector<std::uint8_t>(2000, 1));
    ADD_FAILURE() << "a body of 2000 bytes went out on a channel whose limit is 1024";
  } catch (const ChannelClosed& error) {
    ADD_FAILURE() << "the sender's own oversized message was blamed on the receiver: " << error.what();
  } catch (const Error& error) {
    EXPECT_NE(
        std::string(error.what()).find("above the channel's limit of 1024 (ChannelOptions::limits.max_body_bytes"),
        std::string::npos)
        << error.what();
  }
  ASSERT_TRUE(tx.is_open());
  tx.send(std::vector<std::uint8_t>(10, 2));
  tx.close();
  EXPECT_TRUE(child_succeeded(child));
}

// Types whose names are longer than FrameLimits::max_type_name_bytes (4096): 100 levels of
// a template with a long name, around an int or a long.
template <class T>
struct NestedInATemplateWhoseLongNameMakesTheTypeNameGrowQuickly {
  T inner{};
  template <class Archive>
  void serialize(Archive& ar) {
    ar(inner);
  }
};
template <class T, int Levels>
struct Nesting {
  using type = NestedInATemplateWhoseLongNameMakesTheTypeNameGrowQuickly<typename Nesting<T, Levels - 1>::type>;
};
template <class T>
struct Nesting<T, 0> {
  using type = T;
};
using LongNamed = Nesting<int, 100>::type;
using OtherLongNamed = Nesting<long, 100>::type;  // the same name up to its last few bytes

template <class T>
T& innermost(T& value) {
  return value;
}
template <class T>
auto& innermost(NestedInATemplateWhoseLongNameMakesTheTypeNameGrowQuickly<T>& value) {
  return innermost(value.inner);
}

TEST_P(ChannelTest, ATypeWhoseNameIsLongerThanTheLimitIsStillSendable) {
  ASSERT_GT(detail::type_name<LongNamed>().size(), FrameLimits{}.max_type_name_bytes);
  auto [tx, rx] = channel<LongNamed>(GetParam());
  const pid_t child = fork_child([&, &rx = rx, &tx = tx] {
    rx.close();
    LongNamed value;
    for (int i = 0; i < 3; ++i) {
      innermost(value) = 40 + i;
      tx.send(value);
    }
    tx.close();
  });
  tx.detach();
  for (int i = 0; i < 3; ++i) {
    auto got = rx.recv();
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(innermost(*got), 40 + i);
  }
  EXPECT_FALSE(rx.recv().has_value());
  EXPECT_TRUE(child_succeeded(child));
}

TEST_P(ChannelTest, LongTypeNamesAreTruncatedButTheirFingerprintsStillTellThemApart) {
  // Both names are cut at the same length, where they are still equal: the full
  // fingerprint tells the types apart, and the message says the names are truncated.
  ChannelOptions options;
  options.limits.max_type_name_bytes = 512;
  auto [writer, reader] = detail::make_transport(GetParam(), options.limits, options.ring_capacity);
  Sender<LongNamed> tx = detail::sender_over<LongNamed>(std::move(writer), GetParam(), options);
  Receiver<OtherLongNamed> rx = detail::receiver_over<OtherLongNamed>(std::move(reader), GetParam(), options);
  tx.send(LongNamed{});
  try {
    (void)rx.recv();
    ADD_FAILURE() << "a Sender<LongNamed> reached a Receiver<OtherLongNamed>";
  } catch (const TypeMismatch& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find(std::string(detail::type_name<LongNamed>().substr(0, 300))), std::string::npos) << what;
    EXPECT_NE(what.find("truncated"), std::string::npos) << what;
    EXPECT_LT(what.size(), 4u * 1024) << "the error message carries the names in full";
  }
}

TEST_P(ChannelTest, RecvForTimesOutAndTryRecvDoesNotBlock) {
  auto [tx, rx] = channel<int>(GetParam());
  const auto start = std::chrono::steady_clock::now();
  auto result = rx.recv_for(50ms);
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_FALSE(result);
  EXPECT_TRUE(result.timed_out());
  EXPECT_GE(waited, 45ms);
  EXPECT_TRUE(rx.try_recv().timed_out());
  tx.send(5);
  auto ready = rx.recv_for(1s);
  ASSERT_TRUE(ready);
  EXPECT_EQ(*ready, 5);
  tx.close();
  EXPECT_TRUE(rx.recv_for(1s).closed());
  EXPECT_TRUE(rx.try_recv().closed());
}

// A timeout too long for nanoseconds (milliseconds::max() converted by hand would wrap to a
// negative count) means "as long as it takes", never "do not wait".
TEST_P(ChannelTest, TimeoutsBeyondNanosecondsWaitInsteadOfReturningAtOnce) {
  auto [tx, rx] = channel<int>(GetParam());
  std::thread late_sender([&tx = tx] {
    std::this_thread::sleep_for(50ms);
    tx.send(7);
    EXPECT_TRUE(tx.send_for(8, std::chrono::hours::max()));
    EXPECT_TRUE(tx.flush(std::chrono::milliseconds::max()));
  });
  auto first = rx.recv_for(std::chrono::milliseconds::max());
  ASSERT_TRUE(first) << (first.timed_out() ? "timed out at once" : "closed");
  EXPECT_EQ(*first, 7);
  EXPECT_EQ(rx.recv_for(std::chrono::duration<double>(1e300)).value(), 8);
  late_sender.join();
  EXPECT_EQ(saturating_nanoseconds(std::chrono::milliseconds::max()), std::chrono::nanoseconds::max());
  EXPECT_EQ(saturating_nanoseconds(std::chrono::milliseconds::min()), std::chrono::nanoseconds::min());
  EXPECT_EQ(saturating_nanoseconds(std::chrono::seconds(3)), std::chrono::nanoseconds(3'000'000'000));
  EXPECT_TRUE(detail::Deadline::after(std::chrono::hours::max()).is_never());
  EXPECT_FALSE(detail::Deadline::after(std::chrono::milliseconds::min()).is_never());
  EXPECT_TRUE(rx.recv_for(std::chrono::milliseconds::min()).timed_out());
  // Not a number: no wait (converting it to an integer count would be undefined behaviour).
  volatile double not_a_number = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(saturating_nanoseconds(std::chrono::duration<double>(not_a_number)), std::chrono::nanoseconds::zero());
  EXPECT_TRUE(rx.recv_for(std::chrono::duration<double>(not_a_number)).timed_out());
}

// A floating-point timeout just under what nanoseconds can hold (292 years in milliseconds
// as a double) rounds up to 2^63 ns when converted in double: it still means "wait".
TEST_P(ChannelTest, FloatingTimeoutsJustUnderTheNanosecondLimitWait) {
  volatile double milliseconds = 9223372036854.775;  // a run-time value, as a program's would be
  const std::chrono::duration<double, std::milli> almost_forever(milliseconds);
  EXPECT_GT(saturating_nanoseconds(almost_forever), std::chrono::hours(24 * 365 * 290));
  auto [tx, rx] = channel<int>(GetParam());
  std::thread late_sender([&tx = tx] {
    std::this_thread::sleep_for(50ms);
    tx.send(7);
  });
  auto value = rx.recv_for(almost_forever);
  late_sender.join();
  ASSERT_TRUE(value) << (value.timed_out() ? "timed out at once" : "closed");
  EXPECT_EQ(*value, 7);
}

TEST_P(ChannelTest, ClosedReceiverMakesSendFail) {
  auto [tx, rx] = channel<int>(GetParam());
  rx.close();
  // The closed Receiver itself reports end of stream (as documented), not ChannelClosed.
  EXPECT_FALSE(rx.recv().has_value());
  EXPECT_TRUE(rx.try_recv().closed());
  EXPECT_THROW(
      {
        for (int i = 0; i < 10; ++i) tx.send(i);
      },
      ChannelClosed);
  EXPECT_FALSE(tx.is_open());
}

TEST_P(ChannelTest, SendForTimesOutOnAFullTransport) {
  auto [tx, rx] = channel<std::vector<std::uint8_t>>(GetParam());
  const std::vector<std::uint8_t> chunk(4096, 1);
  int sent = 0;
  while (tx.send_for(chunk, 20ms)) ++sent;  // fills the pipe/socket buffer
  EXPECT_GT(sent, 0);
  // Everything accepted before the timeout arrives intact (the last one possibly only
  // after its tail was flushed), and the channel still works.
  for (int i = 0; i < sent; ++i) {
    auto got = rx.recv_for(100ms);
    if (!got) {
      ASSERT_TRUE(got.timed_out());
      ASSERT_TRUE(tx.flush(1s));
      got = rx.recv_for(1s);
    }
    ASSERT_TRUE(got) << i;
    ASSERT_EQ(got->size(), chunk.size());
    ASSERT_EQ((*got)[4095], 1);
  }
  EXPECT_TRUE(rx.try_recv().timed_out());
  EXPECT_TRUE(tx.send_for(chunk, 1s));
  EXPECT_TRUE(rx.recv_for(1s));
}

// Signals whose handlers interrupt system calls (installed without SA_RESTART, as a
// profiler's SIGPROF or a program's timer may be): every blocking call ferry makes resumes
// after EINTR, and a deadline still counts from where it was set.
class InterruptingTimer {
 public:
  // SIGALRM every `interval` to this process, handled without SA_RESTART.
  explicit InterruptingTimer(std::chrono::microseconds interval) {
    struct sigaction action {};
    action.sa_handler = [](int) { delivered.fetch_add(1, std::memory_order_relaxed); };
    sigemptyset(&action.sa_mask);
    action.sa_flags = 0;
    if (::sigaction(SIGALRM, &action, &previous_) != 0) throw std::runtime_error("sigaction(SIGALRM) failed");
    itimerval every{};
    every.it_interval.tv_usec = static_cast<suseconds_t>(interval.count());
    every.it_value = every.it_interval;
    if (::setitimer(ITIMER_REAL, &every, nullptr) != 0) throw std::runtime_error("setitimer failed");
  }
  ~InterruptingTimer() {
    const itimerval off{};
    ::setitimer(ITIMER_REAL, &off, nullptr);
    ::sigaction(SIGALRM, &previous_, nullptr);
  }
  InterruptingTimer(const InterruptingTimer&) = delete;
  InterruptingTimer& operator=(const InterruptingTimer&) = delete;
  static inline std::atomic<std::uint64_t> delivered{0};

 private:
  struct sigaction previous_ {};
};

struct Bulky {
  std::int64_t step = 0;
  std::vector<std::uint8_t> bytes;  // larger than a pipe's buffer: writes block part way
  Tensor tensor;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(step, bytes, tensor);
  }
};

TEST_P(ChannelTest, SignalsThatInterruptSystemCallsLoseNothing) {
  auto [tx, rx] = channel<Bulky>(GetParam());
  auto [reply_tx, reply_rx] = channel<std::int64_t>(GetParam());
  constexpr int kSteps = 150;
  constexpr std::size_t kBytes = 256 * 1024;
  const pid_t child = fork_child([&, &rx = rx, &tx = tx, &reply_tx = reply_tx, &reply_rx = reply_rx] {
    tx.detach();
    reply_rx.close();
    reply_tx.adopt();
    const InterruptingTimer timer(200us);  // timers are not inherited: the child's own
    for (int step = 0; step < kSteps; ++step) {
      auto got = rx.recv();
      CHILD_CHECK(got.has_value() && got->step == step && got->bytes.size() == kBytes);
      CHILD_CHECK(got->bytes[step] == static_cast<std::uint8_t>(step) && got->bytes.back() == 7);
      CHILD_CHECK(got->tensor.data<std::int32_t>()[0] == step);
      if (step % 10 == 0) std::this_thread::sleep_for(2ms);  // the parent blocks on a full transport
      reply_tx.send(step);
    }
    CHILD_CHECK(!rx.recv().has_value());
    CHILD_CHECK(InterruptingTimer::delivered.load() > 0);
  });
  rx.close();
  reply_tx.detach();
  const InterruptingTimer timer(200us);
  const std::uint64_t before = InterruptingTimer::delivered.load();
  std::vector<std::uint8_t> bytes(kBytes, 7);
  for (int step = 0; step < kSteps; ++step) {
    bytes[step] = static_cast<std::uint8_t>(step);
    Tensor tensor = Tensor::empty({16}, DType::Int32, Device::SharedCpu);  // a new block each step
    tensor.fill(step);
    tx.send(Bulky{step, bytes, std::move(tensor)});
    ASSERT_EQ(reply_rx.recv().value(), step);
  }
  // A timed wait keeps its deadline across interruptions: neither early nor for ever.
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(reply_rx.recv_for(50ms).has_value());
  auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, 50ms);
  EXPECT_LT(waited, 10s);
  Selector selector;
  selector.add(reply_rx);
  start = std::chrono::steady_clock::now();
  EXPECT_FALSE(selector.wait_for(50ms).has_value());
  waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, 50ms);
  EXPECT_LT(waited, 10s);
  tx.close();
  EXPECT_TRUE(child_succeeded(child));
  EXPECT_GT(InterruptingTimer::delivered.load(), before) << "no signal arrived: the test proved nothing";
}

TEST_P(ChannelTest, ChannelsWorkBetweenThreadsOfOneProcess) {
  auto [tx, rx] = channel<TrainingBatch>(GetParam());
  std::thread producer([&tx = tx] {
    for (int i = 0; i < 200; ++i) {
      Tensor t = Tensor::zeros({64}, DType::Int32, Device::SharedCpu);
      t.at<std::int32_t>({3}) = i;
      tx.send(TrainingBatch{i, "", t, {t.slice(0, 1, 4)}});
    }
    tx.close();
  });
  int received = 0;
  while (auto got = rx.recv()) {
    EXPECT_EQ(got->images.at<std::int32_t>({3}), got->step);
    EXPECT_EQ(got->extra.at(0).at<std::int32_t>({2}), got->step);
    ++received;
  }
  producer.join();
  EXPECT_EQ(received, 200);
}

// ---- streams grow to hold a large frame whole ------------------------------------

using Bytes = std::vector<std::uint8_t>;

Bytes numbered_bytes(std::size_t size) {
  Bytes bytes(size);
  for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<std::uint8_t>(i * 7 + i / 251);
  return bytes;
}

struct StreamEnds {
  Sender<Bytes> tx;
  Receiver<Bytes> rx;
  int writer_fd;
};

StreamEnds stream_ends(Transport transport) {
  ChannelOptions options;
  auto [writer, reader] =
      detail::make_transport(transport, options.limits, options.ring_capacity, options.ring_timing());
  const int writer_fd = writer->descriptors().at(0);
  return {detail::sender_over<Bytes>(std::move(writer), transport, options),
          detail::receiver_over<Bytes>(std::move(reader), transport, options), writer_fd};
}

TEST(StreamGrowthTest, APipeGrowsToHoldALargeMessageWhole) {
  StreamEnds ends = stream_ends(Transport::Pipe);
  const int before = ::fcntl(ends.writer_fd, F_GETPIPE_SZ);
  ASSERT_GT(before, 0);
  const Bytes message = numbered_bytes(static_cast<std::size_t>(before) * 3);
  // Nobody reads yet: the whole frame must fit in the pipe, or the send waits out its time.
  const auto started = std::chrono::steady_clock::now();
  ASSERT_TRUE(ends.tx.send_for(message, 2s));
  EXPECT_LT(std::chrono::steady_clock::now() - started, 1s);
  ASSERT_GE(::fcntl(ends.writer_fd, F_GETPIPE_SZ), static_cast<int>(message.size()));  // else recv() waits for the tail
  EXPECT_EQ(ends.rx.recv(), message);
}

TEST(StreamGrowthTest, APipeCarryingSmallMessagesKeepsItsSize) {
  StreamEnds ends = stream_ends(Transport::Pipe);
  const int before = ::fcntl(ends.writer_fd, F_GETPIPE_SZ);
  const Bytes message = numbered_bytes(4096);
  ends.tx.send(message);
  EXPECT_EQ(ends.rx.recv(), message);
  EXPECT_EQ(::fcntl(ends.writer_fd, F_GETPIPE_SZ), before);
}

TEST(StreamGrowthTest, ASocketsSendBufferGrowsToHoldALargeMessageWhole) {
  StreamEnds ends = stream_ends(Transport::UnixSocket);
  int doubled = 0;
  socklen_t size = sizeof doubled;
  ASSERT_EQ(::getsockopt(ends.writer_fd, SOL_SOCKET, SO_SNDBUF, &doubled, &size), 0);
  const Bytes message = numbered_bytes(static_cast<std::size_t>(doubled));  // twice what it holds
  ends.tx.send(message);
  ASSERT_EQ(::getsockopt(ends.writer_fd, SOL_SOCKET, SO_SNDBUF, &doubled, &size), 0);
  // The kernel caps what a process may ask for at net.core.wmem_max.
  std::size_t wmem_max = 0;
  std::ifstream("/proc/sys/net/core/wmem_max") >> wmem_max;
  if (wmem_max == 0) GTEST_SKIP() << "cannot read /proc/sys/net/core/wmem_max, the cap on SO_SNDBUF";
  EXPECT_GE(static_cast<std::size_t>(doubled) / 2, std::min(message.size(), wmem_max));
  EXPECT_EQ(ends.rx.recv(), message);
}

TEST(StreamGrowthTest, APipeThatCannotGrowStillCarriesLargeMessages) {
  FERRY_SKIP_WITHOUT_SYSCALL_FAULTS();
  const pid_t child = fork_child([] {
    CHILD_CHECK(test::fail_fcntl_command(F_SETPIPE_SZ, EPERM).empty());
    StreamEnds ends = stream_ends(Transport::Pipe);
    const int before = ::fcntl(ends.writer_fd, F_GETPIPE_SZ);
    const Bytes message = numbered_bytes(std::size_t{1} << 20);
    std::thread reader([&] {
      for (int i = 0; i < 3; ++i) CHILD_CHECK(ends.rx.recv() == message);
    });
    for (int i = 0; i < 3; ++i) ends.tx.send(message);
    reader.join();
    CHILD_CHECK(::fcntl(ends.writer_fd, F_GETPIPE_SZ) == before);
  });
  EXPECT_TRUE(child_succeeded(child));
}

}  // namespace
}  // namespace ferry
