// ferry::Value, the cross-language message type: its accessors, its round trip over every
// transport (also as a member of a C++ struct), and what a decoder refuses from a hostile
// or broken body (deep nesting, lying counts, bad kind bytes, invalid UTF-8).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include "ferry/channel.hpp"
#include "ferry/detail/body_reader.hpp"
#include "ferry/detail/frame_channel.hpp"
#include "ferry/value.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/transports.hpp"

namespace ferry {
namespace {

Value sample_message() {
  ValueMap map{{"step", 3}, {"loss", 0.25}, {"name", "résumé"}, {"ok", true}, {"nothing", nullptr}};
  map.insert_or_assign("raw", Bytes{std::string("\0\x01\xff", 3)});
  map.insert_or_assign("grads", Tensor::from<float>({1.f, 2.f, 3.f, 4.f}).view({2, 2}));
  map.insert_or_assign("list", ValueList{1, "two", ValueList{3.5, ValueMap{{"deep", false}}}});
  return map;
}

void expect_sample(const Value& value) {
  ASSERT_TRUE(value.is_map());
  const ValueMap& map = value.as_map();
  std::vector<std::string> keys;
  for (const auto& entry : map) keys.push_back(entry.first);
  EXPECT_EQ(keys, (std::vector<std::string>{"step", "loss", "name", "ok", "nothing", "raw", "grads", "list"}))
      << "a map keeps insertion order";
  EXPECT_EQ(value["step"].as_int(), 3);
  EXPECT_DOUBLE_EQ(value["loss"].as_float(), 0.25);
  EXPECT_EQ(value["name"].as_string(), "résumé");
  EXPECT_TRUE(value["ok"].as_bool());
  EXPECT_TRUE(value["nothing"].is_none());
  EXPECT_EQ(value["raw"].as_bytes().data, std::string("\0\x01\xff", 3));
  const Tensor& grads = value["grads"].as_tensor();
  EXPECT_EQ(grads.shape(), (Shape{2, 2}));
  EXPECT_EQ(grads.to_vector<float>(), (std::vector<float>{1.f, 2.f, 3.f, 4.f}));
  const Value& list = value["list"];
  ASSERT_EQ(list.as_list().size(), 3u);
  EXPECT_EQ(list[0].as_int(), 1);
  EXPECT_EQ(list[1].as_string(), "two");
  EXPECT_DOUBLE_EQ(list[2][0].as_float(), 3.5);
  EXPECT_FALSE(list[2][1]["deep"].as_bool());
}

TEST(ValueTest, AccessorsNameTheKindTheyFound) {
  const Value number = 7;
  EXPECT_EQ(number.kind(), ValueKind::Int);
  EXPECT_DOUBLE_EQ(number.as_float(), 7.0);  // an int reads as a float
  try {
    (void)number.as_string();
    FAIL() << "as_string() of an int must throw";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "the Value holds int, not string");
  }
  EXPECT_THROW((void)Value(ValueMap{})["absent"], Error);
  EXPECT_THROW((void)Value(ValueList{})[0], Error);
  EXPECT_THROW(Value(std::uint64_t{1} << 63), Error);
  ValueMap map;
  map["a"] = 1;
  map["b"] = 2;
  map["a"] = 3;  // in place: order stays a, b
  EXPECT_EQ(map.begin()->first, "a");
  EXPECT_EQ(map.at("a").as_int(), 3);
  EXPECT_EQ(map.size(), 2u);
}

TEST(ValueTest, ItsWireNameIsTheSameForEveryCompiler) {
  EXPECT_EQ(detail::type_name<Value>(), "ferry::Value");
  EXPECT_EQ(detail::type_fingerprint<Value>(), detail::fnv1a64("ferry::Value"));
}

TEST(ValueTest, Utf8Validation) {
  EXPECT_TRUE(is_valid_utf8("plain ascii"));
  EXPECT_TRUE(is_valid_utf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));  // é € 😀
  EXPECT_FALSE(is_valid_utf8("\xc3"));                                 // truncated
  EXPECT_FALSE(is_valid_utf8("\xc0\xaf"));                             // overlong '/'
  EXPECT_FALSE(is_valid_utf8("\xed\xa0\x80"));                         // a surrogate
  EXPECT_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));                     // above U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xff"));
  // Past the 8-byte ASCII steps: a character across a step's edge, a bad byte after several.
  EXPECT_TRUE(is_valid_utf8("train/12/3456\xc3\xa9.jpg and more ascii"));
  EXPECT_TRUE(
      is_valid_utf8("1234567\xe2\x82\xac"
                    "890123456"));
  EXPECT_FALSE(is_valid_utf8("0123456789abcdef0123\xff"));
  EXPECT_FALSE(is_valid_utf8("01234567\xc3"));
}

class ValueChannelTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {};

TEST_P(ValueChannelTest, MessageRoundTripsKeepingOrderAndSharingTensors) {
  auto [tx, rx] = channel<Value>(GetParam());
  Value message = sample_message();
  tx.send(message);
  auto received = rx.recv();
  ASSERT_TRUE(received.has_value());
  expect_sample(*received);
  EXPECT_TRUE((*received)["grads"].as_tensor().is_shared()) << "a tensor inside a Value travels as shared memory";
  tx.close();
  EXPECT_FALSE(rx.recv().has_value());
}

struct Step {
  std::int64_t index = 0;
  Value metadata;
  Tensor images;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(index, metadata, images);
  }
};

TEST_P(ValueChannelTest, ValueMembersMixWithCppFields) {
  auto [tx, rx] = channel<Step>(GetParam());
  tx.send(Step{5, sample_message(), Tensor::zeros({4}, DType::UInt8)});
  auto received = rx.recv();
  ASSERT_TRUE(received.has_value());
  EXPECT_EQ(received->index, 5);
  expect_sample(received->metadata);
  EXPECT_EQ(received->images.numel(), 4);
}

TEST_P(ValueChannelTest, AValueReceiverRefusesAStructSenderWithTypeMismatch) {
  const ChannelOptions options;
  auto [writer, reader] =
      detail::make_transport(GetParam(), options.limits, options.ring_capacity, options.ring_timing());
  auto tx = detail::sender_over<Step>(std::move(writer), GetParam(), options);
  auto rx = detail::receiver_over<Value>(std::move(reader), GetParam(), options);
  tx.send(Step{1, Value(), Tensor()});
  try {
    (void)rx.recv();
    FAIL() << "a Receiver<Value> must refuse a Sender<Step>'s frame";
  } catch (const TypeMismatch& error) {
    EXPECT_NE(std::string(error.what()).find("ferry::Value"), std::string::npos) << error.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, ValueChannelTest, ::testing::ValuesIn(test::interprocess_transports()),
                         test::transport_test_name);

// ---- hostile bodies -------------------------------------------------------------------------

class BodyBuilder {
 public:
  BodyBuilder& kind(ValueKind kind) { return u8(static_cast<std::uint8_t>(kind)); }
  BodyBuilder& u8(std::uint8_t value) { return raw(&value, 1); }
  BodyBuilder& u64(std::uint64_t value) { return raw(&value, sizeof value); }
  BodyBuilder& text(std::string_view text) {
    u64(text.size());
    return raw(text.data(), text.size());
  }
  BodyBuilder& raw(const void* data, std::size_t size) {
    const auto* bytes = static_cast<const std::byte*>(data);
    bytes_.insert(bytes_.end(), bytes, bytes + size);
    return *this;
  }
  std::span<const std::byte> body() const { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

std::string decode_error(const BodyBuilder& body) {
  try {
    (void)detail::read_body<Value>(body.body(), {});
  } catch (const ProtocolError& error) {
    return error.what();
  }
  return "no error";
}

TEST(ValueWireTest, NestingDeeperThanTheLimitIsAProtocolError) {
  BodyBuilder at_limit;
  for (std::size_t i = 1; i < kMaxValueDepth; ++i) at_limit.kind(ValueKind::List).u64(1);
  at_limit.kind(ValueKind::None);
  EXPECT_NO_THROW((void)detail::read_body<Value>(at_limit.body(), {})) << "depth " << kMaxValueDepth << " is allowed";

  BodyBuilder hostile;  // a million nested one-element lists: without the limit, a stack overflow
  for (int i = 0; i < 1'000'000; ++i) hostile.kind(ValueKind::List).u64(1);
  hostile.kind(ValueKind::None);
  EXPECT_NE(decode_error(hostile).find("nests deeper than 64 levels"), std::string::npos) << decode_error(hostile);
}

TEST(ValueWireTest, SendingTooDeepAValueFailsOnTheSenderFirst) {
  Value deep;
  for (std::size_t i = 0; i < kMaxValueDepth; ++i) deep = Value(ValueList{std::move(deep)});
  auto [tx, rx] = channel<Value>(Transport::Pipe);
  EXPECT_THROW(tx.send(deep), Error);
  tx.send(Value(1));  // nothing of the refused value went out
  EXPECT_EQ(rx.recv()->as_int(), 1);
}

TEST(ValueWireTest, LyingCountsAndBadBytesAreProtocolErrors) {
  EXPECT_NE(decode_error(BodyBuilder().kind(ValueKind::List).u64(std::uint64_t{1} << 40)).find("claims"),
            std::string::npos);
  EXPECT_NE(decode_error(BodyBuilder().kind(ValueKind::Map).u64(1000).text("k")).find("claims"), std::string::npos);
  EXPECT_NE(decode_error(BodyBuilder().kind(ValueKind::String).u64(100).raw("ab", 2)).find("claims"),
            std::string::npos);
  EXPECT_NE(decode_error(BodyBuilder().u8(9)).find("invalid kind byte 9"), std::string::npos);
  EXPECT_NE(decode_error(BodyBuilder().kind(ValueKind::Bool).u8(2)).find("bool byte 2"), std::string::npos);
  EXPECT_NE(decode_error(BodyBuilder().kind(ValueKind::String).text("\xc0\xaf")).find("UTF-8"), std::string::npos);
  EXPECT_NE(decode_error(BodyBuilder().kind(ValueKind::Map).u64(1).text("\xff").kind(ValueKind::None)).find("UTF-8"),
            std::string::npos);
  EXPECT_NE(
      decode_error(
          BodyBuilder().kind(ValueKind::Map).u64(2).text("k").kind(ValueKind::None).text("k").kind(ValueKind::None))
          .find("key 'k' twice"),
      std::string::npos);
  EXPECT_NE(decode_error(BodyBuilder().kind(ValueKind::Int).u8(1)).find("truncated"), std::string::npos)
      << decode_error(BodyBuilder().kind(ValueKind::Int).u8(1));
  // A tensor naming a storage the frame does not have.
  BodyBuilder tensor;
  tensor.kind(ValueKind::Tensor).u8(2).u8(static_cast<std::uint8_t>(DType::Float32)).u8(1);
  const std::uint32_t ndim = 1;
  const std::int64_t size = 4, stride = 1, offset = 0;
  const std::uint32_t handle = 0;
  tensor.raw(&ndim, 4).raw(&size, 8).raw(&stride, 8).raw(&offset, 8).raw(&handle, 4);
  EXPECT_NE(decode_error(tensor).find("handle index 0 is out of range"), std::string::npos) << decode_error(tensor);
}

TEST(ValueWireTest, DuplicateKeysAreFoundInSmallAndLargeMaps) {
  // Up to 16 entries a key is compared with those before it, above through a hash set.
  for (const std::size_t count : {std::size_t{16}, std::size_t{17}, std::size_t{1000}}) {
    BodyBuilder map;
    map.kind(ValueKind::Map).u64(count);
    for (std::size_t i = 0; i + 1 < count; ++i) map.text("key" + std::to_string(i)).kind(ValueKind::None);
    BodyBuilder distinct = map;
    distinct.text("last").kind(ValueKind::None);
    EXPECT_EQ(detail::read_body<Value>(distinct.body(), {}).as_map().size(), count);
    map.text("key0").kind(ValueKind::None);
    EXPECT_NE(decode_error(map).find("key 'key0' twice"), std::string::npos) << count << ": " << decode_error(map);
  }
}

TEST(ValueWireTest, TooManyElementsIsAProtocolError) {
  BodyBuilder wide;  // a list of kMaxValueElements Nones: one more value than the limit with the list itself
  wide.kind(ValueKind::List).u64(kMaxValueElements);
  for (std::size_t i = 0; i < kMaxValueElements; ++i) wide.kind(ValueKind::None);
  EXPECT_NE(decode_error(wide).find("more than"), std::string::npos) << decode_error(wide);
}

#if defined(__SANITIZE_ADDRESS__)
#define FERRY_VALUE_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FERRY_VALUE_TEST_UNDER_ASAN 1
#endif
#endif
#ifndef FERRY_VALUE_TEST_UNDER_ASAN
#define FERRY_VALUE_TEST_UNDER_ASAN 0
#endif

#if !FERRY_VALUE_TEST_UNDER_ASAN
// This process's address space (VmSize), in bytes.
std::size_t address_space_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7)) * 1024;
  }
  return 0;
}
#endif

TEST(ValueWireTest, AHugeClaimedCountReservesNoMoreThanTheBudgetAllows) {
  // 200 MB: a list that claims one None per byte left (a count the body could hold). Room
  // reserved for the claim would be gigabytes; the budget allows 2^20 values.
  const pid_t child = test::fork_child([] {
    std::vector<std::byte> body(200'000'000);
    body[0] = static_cast<std::byte>(ValueKind::List);
    const std::uint64_t count = body.size() - 9;
    std::memcpy(body.data() + 1, &count, sizeof count);
#if !FERRY_VALUE_TEST_UNDER_ASAN
    // 1 GiB more address space than the body takes (ASan's shadow mappings need the
    // whole address space, so its build checks the error alone).
    const rlimit tight{address_space_bytes() + (std::size_t{1} << 30), RLIM_INFINITY};
    CHILD_CHECK(::setrlimit(RLIMIT_AS, &tight) == 0);
#endif
    try {
      (void)detail::read_body<Value>(body, {});
      CHILD_CHECK(!"a list of 200 million values decoded");
    } catch (const ProtocolError& error) {
      CHILD_CHECK(std::string(error.what()).find("more than the 1048576 elements") != std::string::npos);
    }
  });
  EXPECT_TRUE(test::child_succeeded(child, std::chrono::seconds(60)));
}

TEST(ValueWireTest, ClaimsOfNestedContainersShareOneBudget) {
  // Each level claims almost the whole budget: every level alone is within it, their sum is
  // not. Without the shared count, 64 such levels reserve 64 times 2^20 values.
  BodyBuilder nested;
  nested.kind(ValueKind::List).u64(kMaxValueElements - 1).kind(ValueKind::List).u64(2);
  nested.kind(ValueKind::None).kind(ValueKind::None);
  for (std::size_t i = 0; i < kMaxValueElements; ++i) nested.kind(ValueKind::None);
  EXPECT_NE(decode_error(nested).find("claims 2 elements: with the values claimed before it"), std::string::npos)
      << decode_error(nested);
  BodyBuilder full;  // exactly kMaxValueElements values: accepted
  full.kind(ValueKind::List).u64(kMaxValueElements - 1);
  for (std::size_t i = 0; i + 1 < kMaxValueElements; ++i) full.kind(ValueKind::None);
  EXPECT_EQ(detail::read_body<Value>(full.body(), {}).as_list().size(), kMaxValueElements - 1);
}

}  // namespace
}  // namespace ferry
