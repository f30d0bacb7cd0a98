// A C++ loader (this test) and a Python trainer (tests/python/trainer.py, a separate
// process running /usr/bin/python3 with the ferry package) over real channels, made by
// address (ferry::listen / ferry.connect_*) or handed over by descriptors: torch sees
// the loader's pages and the loader sees the trainer's writes, the loader's pool keeps a
// block while torch views it, every dtype and non-contiguous view arrives right both ways,
// a received tensor sent back is the same storage, and type mismatches, hostile nesting, duplicate keys,
// invalid UTF-8 and a killed loader are errors in Python.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "ferry/channel.hpp"
#include "ferry/end_description.hpp"
#include "ferry/endpoint.hpp"
#include "ferry/shared_allocator.hpp"
#include "ferry/value.hpp"
#include "python/python_trainer.hpp"
#include "support/process.hpp"

namespace ferry {
namespace {

// The modules of `required` (space-separated) that the test's interpreter cannot import.
std::string missing_python_modules(const std::string& required) {
  const std::string command = std::string(FERRY_TEST_PYTHON_EXECUTABLE) +
                              " -c \"import importlib.util, sys; print(' '.join(m for m in sys.argv[1:] if "
                              "importlib.util.find_spec(m) is None))\" " +
                              required;
  const std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), &::pclose);
  if (!pipe) return "(the interpreter did not start)";
  std::string output;
  char buffer[256];
  while (std::fgets(buffer, sizeof buffer, pipe.get()) != nullptr) output += buffer;
  while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
  return output;
}

// Every trainer scenario imports numpy and torch: without them, each test is skipped,
// saying what is missing, instead of failing.
class PythonModules : public ::testing::Environment {
 public:
  void SetUp() override {
    const std::string missing = missing_python_modules("numpy torch");
    if (!missing.empty()) {
      GTEST_SKIP() << FERRY_TEST_PYTHON_EXECUTABLE << " has no " << missing
                   << "; install Debian's python3-numpy and python3-torch, or configure with "
                      "-DPython3_EXECUTABLE=/usr/bin/python3";
    }
  }
};
[[maybe_unused]] ::testing::Environment* const kPythonModules = ::testing::AddGlobalTestEnvironment(new PythonModules);

// A C++ message type that is not Value.
struct Batch {
  std::int64_t step = 0;
  Tensor images;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(step, images);
  }
};

// A message that claims to be a Value and nests `depth` one-element lists: what a hostile
// peer would send.
struct HostileNesting {
  std::uint64_t depth = 0;
};

// A map that holds the key "step" twice (a C++ ValueMap cannot): what a lying peer sends.
struct HostileDuplicateKey {};

// A Value whose string or map key is not valid UTF-8 (a C++ Value sends whatever bytes its
// std::string holds): what a lying peer sends.
struct HostileText {
  bool in_key = false;  // else a string, the last element of a list
  std::string text;
};

}  // namespace

template <>
constexpr std::string_view detail::type_name<HostileNesting>() {
  return "ferry::Value";
}
template <>
constexpr std::string_view detail::type_name<HostileDuplicateKey>() {
  return "ferry::Value";
}
template <>
constexpr std::string_view detail::type_name<HostileText>() {
  return "ferry::Value";
}

namespace {

void CEREAL_SAVE_FUNCTION_NAME(detail::FrameOutputArchive& archive, const HostileNesting& message) {
  for (std::uint64_t i = 0; i < message.depth; ++i) {
    archive(static_cast<std::uint8_t>(ValueKind::List));
    archive(std::uint64_t{1});
  }
  archive(static_cast<std::uint8_t>(ValueKind::None));
}

void CEREAL_SAVE_FUNCTION_NAME(detail::FrameOutputArchive& archive, const HostileDuplicateKey&) {
  archive(static_cast<std::uint8_t>(ValueKind::Map));
  archive(std::uint64_t{2});
  for (std::int64_t step = 0; step < 2; ++step) {
    const std::string key = "step";
    archive(static_cast<std::uint64_t>(key.size()));
    archive.save_bytes(key.data(), key.size());
    archive(static_cast<std::uint8_t>(ValueKind::Int));
    archive(step);
  }
}

void save_text(detail::FrameOutputArchive& archive, const std::string& text) {
  archive(static_cast<std::uint64_t>(text.size()));
  archive.save_bytes(text.data(), text.size());
}

// A valid key and string first (the trainer's key cache holds "step" then), then the
// invalid text.
void CEREAL_SAVE_FUNCTION_NAME(detail::FrameOutputArchive& archive, const HostileText& message) {
  archive(static_cast<std::uint8_t>(ValueKind::Map));
  archive(std::uint64_t{2});
  save_text(archive, "step");
  archive(static_cast<std::uint8_t>(ValueKind::String));
  save_text(archive, "train/0/0.jpg");
  save_text(archive, message.in_key ? message.text : std::string("names"));
  if (message.in_key) {
    archive(static_cast<std::uint8_t>(ValueKind::None));
    return;
  }
  archive(static_cast<std::uint8_t>(ValueKind::List));
  archive(std::uint64_t{2});
  archive(static_cast<std::uint8_t>(ValueKind::String));
  save_text(archive, "train/0/1.jpg");
  archive(static_cast<std::uint8_t>(ValueKind::String));
  save_text(archive, message.text);
}

// The loader's ends, by address: the loader listens, the trainer connects a Receiver (to
// `data_tx`) and a Sender (to `reply_rx`), as ferry.connect_receiver/connect_sender.
struct LoaderEnds {
  pid_t start(const std::string& scenario) {
    static int counter = 0;
    const std::string address =
        "unix:@ferry-python-test-" + std::to_string(::getpid()) + "-" + std::to_string(++counter);
    Listener listener = listen(address);
    listener.serve_sender<Value>();  // both kinds connect: neither is refused for coming first
    listener.serve_receiver<Value>();
    const pid_t pid = test::start_python_trainer(scenario, {}, address);
    auto tx = listener.accept_sender_for<Value>(std::chrono::seconds(60));
    auto rx = tx ? listener.accept_receiver_for<Value>(std::chrono::seconds(60)) : std::nullopt;
    if (!tx || !rx) throw Error("the Python trainer did not connect to " + address);
    data_tx = std::move(*tx);
    reply_rx = std::move(*rx);
    return pid;
  }
  Sender<Value> data_tx;
  Receiver<Value> reply_rx;
};

bool trainer_succeeded(pid_t pid) {
  const test::ChildExit exit = test::wait_child(pid, std::chrono::seconds(60));
  EXPECT_TRUE(exit.exited && exit.code == 0) << "the Python trainer " << exit.describe();
  return exit.exited && exit.code == 0;
}

Value receive(Receiver<Value>& rx) {
  std::optional<Value> value = rx.recv();
  if (!value) throw Error("the trainer closed its end early");
  return std::move(*value);
}

TEST(PythonTrainerTest, TorchSeesTheLoadersPagesAndTheLoaderSeesTheTrainersWrites) {
  SharedAllocator pool;
  LoaderEnds ends;
  const pid_t trainer = ends.start("shared_pages");
  Tensor images = Tensor::empty({4, 256}, DType::Float32, pool);
  images.fill(1.5f);
  ends.data_tx.send(ValueMap{{"images", images}, {"step", 0}});
  const Value reply = receive(ends.reply_rx);
  EXPECT_DOUBLE_EQ(reply["sum"].as_float(), 1.5 * 1024) << "torch read other values than the loader wrote";
  EXPECT_EQ(images.at<float>({0, 0}), 42.f) << "the trainer's write through torch did not reach the loader's pages";
  EXPECT_EQ(images.at<float>({3, 255}), 43.f) << "the trainer's write through NumPy did not reach the loader's pages";
  ends.data_tx.close();
  EXPECT_TRUE(trainer_succeeded(trainer));
}

TEST(PythonTrainerTest, AReceivedTensorSentBackIsTheSameStorage) {
  SharedAllocator pool;
  LoaderEnds ends;
  const pid_t trainer = ends.start("send_back");
  const Tensor sent = Tensor::from<std::int64_t>({0, 1, 2, 3, 4, 5, 6, 7});
  Tensor pooled = Tensor::empty({8}, DType::Int64, pool);
  pooled.copy_from(sent);
  ends.data_tx.send(ValueMap{{"t", pooled}});
  const Value reply = receive(ends.reply_rx);
  const Tensor& torch_view = reply["torch"].as_tensor();  // torch.from_dlpack(t)[2:]
  EXPECT_TRUE(torch_view.shares_storage_with(pooled)) << torch_view.to_string();
  EXPECT_EQ(torch_view.data_ptr(), pooled.data<std::int64_t>() + 2);
  EXPECT_EQ(torch_view.to_vector<std::int64_t>(), (std::vector<std::int64_t>{2, 3, 4, 5, 6, 7}));
  const Tensor& numpy_view = reply["numpy"].as_tensor();  // numpy.asarray(t)[::2]
  EXPECT_TRUE(numpy_view.shares_storage_with(pooled)) << numpy_view.to_string();
  EXPECT_EQ(numpy_view.strides(), (Shape{2}));
  EXPECT_EQ(numpy_view.to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 2, 4, 6}));
  ends.data_tx.close();
  EXPECT_TRUE(trainer_succeeded(trainer));
}

Tensor filled(const SharedAllocator& pool, std::int32_t value) {
  Tensor t = Tensor::empty({1024}, DType::Int32, pool);
  t.fill(value);
  return t;
}

TEST(PythonTrainerTest, ThePoolDoesNotReuseABlockWhileATorchTensorViewsItAndDoesOnceItDies) {
  SharedAllocator pool;
  LoaderEnds ends;
  const pid_t trainer = ends.start("hold_then_drop");
  const void* kept_address = nullptr;
  {
    const Tensor first = filled(pool, 7);
    kept_address = first.data_ptr();
    ends.data_tx.send(ValueMap{{"cmd", "hold"}, {"t", first}});
  }  // the loader's last reference: only the trainer's torch tensor holds the block now
  ASSERT_EQ(receive(ends.reply_rx).as_string(), "holding");
  for (int i = 0; i < 20; ++i) {
    const Tensor next = filled(pool, 9);  // the same size class: the held block would fit
    EXPECT_NE(next.data_ptr(), kept_address) << "a block a torch tensor views was recycled";
    ends.data_tx.send(ValueMap{{"cmd", "probe"}, {"t", next}});
    ASSERT_EQ(receive(ends.reply_rx).as_string(), "ok");
    release_cached_shared_memory();  // collecting returns and trimming must not free it either
  }
  ends.data_tx.send(ValueMap{{"cmd", "drop"}});
  ASSERT_EQ(receive(ends.reply_rx).as_string(), "dropped");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {  // the return reaches the loader through its return board
    release_cached_shared_memory();
    if (pool.stats().blocks_in_use == 0 || std::chrono::steady_clock::now() > deadline) break;
    ends.data_tx.send(ValueMap{{"cmd", "ping"}});
    ASSERT_EQ(receive(ends.reply_rx).as_string(), "ok");
  }
  EXPECT_EQ(pool.stats().blocks_in_use, 0u) << "the block did not come back after the torch tensor died";
  std::vector<Tensor> again;
  bool reused = false;
  for (int i = 0; i < 4 && !reused; ++i) {
    again.push_back(filled(pool, 1));
    reused = again.back().data_ptr() == kept_address;
  }
  EXPECT_TRUE(reused) << "the pool did not reuse the block once the torch tensor died";
  ends.data_tx.close();
  EXPECT_TRUE(trainer_succeeded(trainer));
}

// Element i of a dtype pattern tensor: i, or i % 2 for bool.
double pattern(DType dtype, std::int64_t i) {
  return dtype == DType::Bool ? static_cast<double>(i % 2) : static_cast<double>(i);
}

double element_as_double(const Tensor& t, std::int64_t row, std::int64_t column) {
  const auto* base = static_cast<const std::byte*>(t.data_ptr()) +
                     (row * t.stride(0) + column * t.stride(1)) * static_cast<std::int64_t>(t.element_size());
  const auto read = [base](auto sample) {
    decltype(sample) value;
    std::memcpy(&value, base, sizeof value);
    return static_cast<double>(static_cast<float>(value));
  };
  switch (t.dtype()) {
    case DType::Bool: return read(std::uint8_t{});
    case DType::UInt8: return read(std::uint8_t{});
    case DType::Int8: return read(std::int8_t{});
    case DType::Int16: return read(std::int16_t{});
    case DType::Int32: return read(std::int32_t{});
    case DType::Int64:
      return static_cast<double>([base] {
        std::int64_t v;
        std::memcpy(&v, base, 8);
        return v;
      }());
    case DType::Float16: return read(Half{});
    case DType::BFloat16: return read(BFloat16{});
    case DType::Float32: return read(float{});
    case DType::Float64:
      return [base] {
        double v;
        std::memcpy(&v, base, 8);
        return v;
      }();
  }
  return NAN;
}

void write_pattern(Tensor& t) {  // contiguous {3, 4}
  for (std::int64_t i = 0; i < 12; ++i) {
    std::byte* at = static_cast<std::byte*>(t.data_ptr()) + i * static_cast<std::int64_t>(t.element_size());
    const double value = pattern(t.dtype(), i);
    const auto write = [at](auto typed) { std::memcpy(at, &typed, sizeof typed); };
    switch (t.dtype()) {
      case DType::Bool: write(static_cast<std::uint8_t>(value)); break;
      case DType::UInt8: write(static_cast<std::uint8_t>(value)); break;
      case DType::Int8: write(static_cast<std::int8_t>(value)); break;
      case DType::Int16: write(static_cast<std::int16_t>(value)); break;
      case DType::Int32: write(static_cast<std::int32_t>(value)); break;
      case DType::Int64: write(static_cast<std::int64_t>(value)); break;
      case DType::Float16: write(Half(static_cast<float>(value))); break;
      case DType::BFloat16: write(BFloat16(static_cast<float>(value))); break;
      case DType::Float32: write(static_cast<float>(value)); break;
      case DType::Float64: write(value); break;
    }
  }
}

TEST(PythonTrainerTest, EveryDtypeAndNonContiguousViewsArriveRightBothWays) {
  LoaderEnds ends;
  const pid_t trainer = ends.start("dtypes");
  ValueMap message;
  for (int raw = 0; raw < kDTypeCount; ++raw) {
    const auto dtype = static_cast<DType>(raw);
    Tensor t = Tensor::empty({3, 4}, dtype, Device::SharedCpu);
    write_pattern(t);
    const std::string name(dtype_name(dtype));
    message.insert_or_assign(name, t);
    message.insert_or_assign(name + "_t", t.transpose(0, 1));    // strides {1, 4}
    message.insert_or_assign(name + "_s", t.slice(1, 1, 4, 2));  // offset 1, strides {4, 2}
  }
  ends.data_tx.send(message);
  // The trainer answers with, per dtype, torch.arange(12).reshape(3, 4).t() (a torch
  // tensor, copied once) and for NumPy's dtypes numpy.arange(12).reshape(3, 4)[:, ::2].
  const Value reply = receive(ends.reply_rx);
  ASSERT_EQ(reply["error"].is_none(), true) << reply["error"].as_string();
  for (int raw = 0; raw < kDTypeCount; ++raw) {
    const auto dtype = static_cast<DType>(raw);
    const std::string name(dtype_name(dtype));
    const Tensor& transposed = reply["torch_" + name].as_tensor();
    EXPECT_EQ(transposed.dtype(), dtype) << name;
    EXPECT_TRUE(transposed.is_shared()) << name;
    ASSERT_EQ(transposed.shape(), (Shape{4, 3})) << name;
    for (std::int64_t r = 0; r < 4; ++r) {
      for (std::int64_t c = 0; c < 3; ++c) {
        EXPECT_EQ(element_as_double(transposed, r, c), pattern(dtype, c * 4 + r)) << name << " at " << r << "," << c;
      }
    }
    if (const Value* strided = reply.as_map().find("numpy_" + name)) {
      const Tensor& columns = strided->as_tensor();
      EXPECT_EQ(columns.dtype(), dtype) << name;
      ASSERT_EQ(columns.shape(), (Shape{3, 2})) << name;
      for (std::int64_t r = 0; r < 3; ++r) {
        for (std::int64_t c = 0; c < 2; ++c) {
          EXPECT_EQ(element_as_double(columns, r, c), pattern(dtype, r * 4 + c * 2)) << name << " at " << r << "," << c;
        }
      }
    } else {
      EXPECT_EQ(dtype, DType::BFloat16) << "only bfloat16 has no NumPy type";
    }
  }
  ends.data_tx.close();
  EXPECT_TRUE(trainer_succeeded(trainer));
}

TEST(PythonTrainerTest, ACppBatchAgainstAPythonValueIsTypeMismatchBothWays) {
  // As if a handshake had let a mismatched pair through: the descriptions claim Value, and
  // the frames' type fingerprints are what must refuse.
  auto [batch_tx, batch_rx] = channel<Batch>(Transport::UnixSocket);  // C++ Batch -> Python Value
  auto [value_tx, value_rx] = channel<Batch>(Transport::UnixSocket);  // Python Value -> C++ Batch
  EndDescription to_python = describe_end(batch_rx);
  EndDescription from_python = describe_end(value_tx);
  for (EndDescription* description : {&to_python, &from_python}) {
    description->type_fingerprint = detail::type_fingerprint<Value>();
    description->type_name = std::string(detail::type_name<Value>());
  }
  const pid_t trainer = test::start_python_trainer("type_mismatch", {to_python, from_python});
  batch_rx.detach();
  value_tx.detach();
  batch_tx.send(Batch{1, Tensor::zeros({2}, DType::Float32)});
  try {
    (void)value_rx.recv();
    ADD_FAILURE() << "a Receiver<Batch> accepted a Python Value";
  } catch (const TypeMismatch& error) {
    EXPECT_NE(std::string(error.what()).find("'ferry::Value'"), std::string::npos) << error.what();
  }
  batch_tx.close();
  EXPECT_TRUE(trainer_succeeded(trainer));
}

TEST(PythonTrainerTest, APythonReceiverConnectingToACppBatchListenerIsTypeMismatch) {
  const std::string address = "unix:@ferry-python-test-" + std::to_string(::getpid()) + "-mismatch";
  Listener listener = listen(address);
  listener.serve_sender<Batch>();
  const pid_t trainer = test::start_python_trainer("connect_mismatch", {}, address);
  int status = 0;
  pid_t done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (done == 0 && std::chrono::steady_clock::now() < deadline) {
    // Handshakes make progress while the listener is inside accept: the refusal goes out here.
    EXPECT_FALSE(listener.accept_sender_for<Batch>(std::chrono::milliseconds(20)).has_value());
    done = ::waitpid(trainer, &status, WNOHANG);
  }
  ASSERT_EQ(done, trainer) << "the Python trainer did not finish";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

TEST(PythonTrainerTest, HostileNestingIsAProtocolErrorInPython) {
  auto [tx, rx] = channel<HostileNesting>(Transport::UnixSocket);
  const pid_t trainer = test::start_python_trainer("hostile_nesting", {describe_end(rx)});
  rx.detach();
  tx.send(HostileNesting{10'000});
  tx.close();
  EXPECT_TRUE(trainer_succeeded(trainer));
}

TEST(PythonTrainerTest, ADuplicateMapKeyIsAProtocolErrorInPython) {
  auto [tx, rx] = channel<HostileDuplicateKey>(Transport::UnixSocket);
  const pid_t trainer = test::start_python_trainer("duplicate_key", {describe_end(rx)});
  rx.detach();
  tx.send(HostileDuplicateKey{});
  tx.close();
  EXPECT_TRUE(trainer_succeeded(trainer));
}

// The invalid forms of is_valid_utf8's test, in ASCII text and alone, short and long (past
// the trainer's key cache and its word-at-a-time ASCII check), as strings and as keys: each
// a ProtocolError in Python (tests/python/trainer.py, invalid_text, checks the order).
TEST(PythonTrainerTest, InvalidUtf8InAStringOrKeyIsAProtocolErrorInPython) {
  const std::string long_ascii(60, 'k');
  const std::vector<std::string> texts = {
      "\xc3",                            // truncated
      "train/\xc0\xaf.jpg",              // overlong '/'
      "train/0/\xed\xa0\x80.jpg",        // a surrogate
      "\xf4\x90\x80\x80",                // above U+10FFFF
      "01234567\xff",                    // after a whole ASCII word
      long_ascii + "\xc3" + long_ascii,  // long, truncated in the middle
      "st\xffp",                         // one byte off a cached key
  };
  std::vector<std::pair<Sender<HostileText>, Receiver<HostileText>>> channels;
  std::vector<EndDescription> descriptions;
  for (std::size_t i = 0; i < 2 * texts.size(); ++i) {
    channels.push_back(channel<HostileText>(Transport::UnixSocket));  // one each: an error breaks a receiver
    descriptions.push_back(describe_end(channels.back().second));
  }
  const pid_t trainer = test::start_python_trainer("invalid_text", descriptions);
  for (std::size_t i = 0; i < channels.size(); ++i) {
    auto& [tx, rx] = channels[i];
    rx.detach();
    tx.send(HostileText{i % 2 == 1, texts[i / 2]});
    tx.close();
  }
  EXPECT_TRUE(trainer_succeeded(trainer));
}

TEST(PythonTrainerTest, APythonTrainerSeesPeerDiedWhenTheLoaderIsKilled) {
  auto ends = channel<Value>(Transport::UnixSocket);
  Sender<Value>& tx = ends.first;
  Receiver<Value>& rx = ends.second;
  const pid_t loader = test::fork_child([&] {
    tx.adopt();
    tx.send(ValueMap{{"hello", 1}});
    ::kill(::getpid(), SIGKILL);  // dies without closing its end
  });
  tx.detach();
  const pid_t trainer = test::start_python_trainer("peer_died", {describe_end(rx)});
  rx.detach();
  EXPECT_TRUE(trainer_succeeded(trainer));
  const test::ChildExit exit = test::wait_child(loader);
  EXPECT_EQ(exit.signal, SIGKILL) << exit.describe();
}

}  // namespace
}  // namespace ferry
