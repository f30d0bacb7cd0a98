// ucx:// endpoints (ferry/ucx.hpp) on loopback over UCX's TCP transport (ctest sets
// UCX_TLS=tcp): tensors of every size both ways, the handshake's checks (type, direction,
// secret), hostile clients, peer death, and fds back to their start counts.
//
// A process forked after it used UCX must not touch UCX, so every test forks its child
// before the parent's first UCX call and passes the listener's port through a pipe.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.hpp"
#include "ferry/ucx.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::fork_child;
using test::wait_child;

struct Batch {
  std::int64_t index = 0;
  std::vector<Tensor> tensors;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(index, tensors);
  }
};
struct Other {
  std::int32_t value = 0;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(value);
  }
};

Tensor pattern(std::size_t bytes, std::uint8_t seed, Device device = Device::Cpu) {
  Tensor tensor = Tensor::empty({static_cast<std::int64_t>(bytes)}, DType::UInt8, device);
  auto* data = static_cast<std::uint8_t*>(tensor.data_ptr());
  for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<std::uint8_t>(i * 31 + seed);
  return tensor;
}

bool has_pattern(const Tensor& tensor, std::size_t bytes, std::uint8_t seed) {
  if (tensor.nbytes() != bytes) return false;
  const auto* data = static_cast<const std::uint8_t*>(tensor.data_ptr());
  for (std::size_t i = 0; i < bytes; ++i) {
    if (data[i] != static_cast<std::uint8_t>(i * 31 + seed)) return false;
  }
  return true;
}

// A pipe that carries the listener's address from the process that listens to the other.
class AddressPipe {
 public:
  AddressPipe() {
    int ends[2];
    if (::pipe(ends) != 0) throw std::runtime_error("pipe");
    read_ = UniqueFd(ends[0]);
    write_ = UniqueFd(ends[1]);
  }
  void put(const std::string& address) {
    const std::uint32_t size = static_cast<std::uint32_t>(address.size());
    if (::write(write_.get(), &size, sizeof size) != sizeof size ||
        ::write(write_.get(), address.data(), size) != static_cast<ssize_t>(size)) {
      throw std::runtime_error("write to the address pipe");
    }
  }
  std::string get() {
    std::uint32_t size = 0;
    if (::read(read_.get(), &size, sizeof size) != sizeof size) throw std::runtime_error("read the address pipe");
    std::string address(size, '\0');
    if (::read(read_.get(), address.data(), size) != static_cast<ssize_t>(size)) {
      throw std::runtime_error("read the address pipe");
    }
    return address;
  }

 private:
  UniqueFd read_;
  UniqueFd write_;
};

ucx::Options quiet_options(std::string secret = "test secret") {
  ucx::Options options;
  options.secret = std::move(secret);
  options.connect_timeout = 5s;
  options.on_refusal = [](const std::string&) {};
  options.channel.close_linger = 700ms;
  return options;
}

const std::vector<std::size_t> kSizes = {0, 1, 7, 4096, (16u << 10), (16u << 10) + 1, 1u << 20, 8u << 20};

class UcxEndpointTest : public test::LeakCheckedTest {};

// The listener in a child echoes every batch back with each byte's seed raised by one;
// the parent checks what comes back, for every size, inline and by rendezvous.
TEST_F(UcxEndpointTest, TensorsOfEverySizeTravelBothWaysWithTheirContents) {
  AddressPipe pipe;
  const pid_t child = fork_child([&] {
    auto listener = ucx::listen("ucx://127.0.0.1:0", quiet_options());
    pipe.put(listener.address());
    listener.serve_sender<Batch>();
    auto in = listener.accept_receiver_for<Batch>(10s);
    auto out = listener.accept_sender_for<Batch>(10s);
    CHILD_CHECK(in && out);
    while (auto batch = in->recv()) {
      Batch reply;
      reply.index = batch->index;
      for (const Tensor& tensor : batch->tensors) {
        // Received straight into the caching allocator's shared memory.
        CHILD_CHECK(tensor.nbytes() == 0 || tensor.device() == Device::SharedCpu);
        CHILD_CHECK(has_pattern(tensor, tensor.nbytes(), static_cast<std::uint8_t>(batch->index)));
        reply.tensors.push_back(pattern(tensor.nbytes(), static_cast<std::uint8_t>(batch->index + 1)));
      }
      out->send(reply);
    }
  });
  {
    const std::string address = pipe.get();
    Sender<Batch> to_child = ucx::connect_sender<Batch>(address, quiet_options());
    Receiver<Batch> from_child = ucx::connect_receiver<Batch>(address, quiet_options());
    EXPECT_EQ(to_child.transport(), Transport::Ucx);
    for (std::size_t round = 0; round < kSizes.size(); ++round) {
      Batch batch;
      batch.index = static_cast<std::int64_t>(round);
      batch.tensors.push_back(pattern(kSizes[round], static_cast<std::uint8_t>(round)));
      batch.tensors.push_back(pattern(kSizes[kSizes.size() - 1 - round], static_cast<std::uint8_t>(round)));
      to_child.send(batch);
      auto reply = from_child.recv_for(10s);
      ASSERT_TRUE(reply.has_value()) << "no reply for round " << round;
      ASSERT_EQ(reply->tensors.size(), 2u);
      EXPECT_TRUE(has_pattern(reply->tensors[0], kSizes[round], static_cast<std::uint8_t>(round + 1)));
      EXPECT_TRUE(has_pattern(reply->tensors[1], kSizes[kSizes.size() - 1 - round], static_cast<std::uint8_t>(round + 1)));
    }
    to_child.close();
    EXPECT_FALSE(from_child.recv_for(10s).has_value());  // the child's end of stream
  }
  EXPECT_TRUE(wait_child(child).exited);
}

TEST_F(UcxEndpointTest, TypeAndDirectionMismatchesAreRefusedAndTheListenerGoesOn) {
  auto listener = ucx::listen("ucx://127.0.0.1:0", quiet_options());
  listener.serve_sender<Batch>();
  const std::string address = listener.address();
  std::thread clients([&] {
    EXPECT_THROW(ucx::connect_receiver<Other>(address, quiet_options()), TypeMismatch);   // type
    EXPECT_THROW(ucx::connect_sender<Batch>(address, quiet_options()), TypeMismatch);     // direction
    Receiver<Batch> good = ucx::connect_receiver<Batch>(address, quiet_options());
    auto batch = good.recv_for(5s);
    EXPECT_TRUE(batch.has_value() && batch->index == 7);
  });
  // Accepting pumps the handshakes of the refused clients too.
  auto sender = listener.accept_sender_for<Batch>(10s);
  ASSERT_TRUE(sender.has_value());
  sender->send(Batch{7, {}});
  clients.join();
}

TEST_F(UcxEndpointTest, AWrongOrMissingSecretIsRefused) {
  std::vector<std::string> refusals;
  ucx::Options options = quiet_options("right");
  options.on_refusal = [&](const std::string& why) { refusals.push_back(why); };
  auto listener = ucx::listen("ucx://127.0.0.1:0", options);
  const std::string address = listener.address();
  std::thread clients([&] {
    try {
      ucx::connect_receiver<Batch>(address, quiet_options("wrong"));
      ADD_FAILURE() << "a wrong secret was accepted";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("secret"), std::string::npos) << error.what();
    }
    EXPECT_THROW(ucx::connect_receiver<Batch>(address, quiet_options("")), Error);
    Receiver<Batch> good = ucx::connect_receiver<Batch>(address, quiet_options("right"));
  });
  auto sender = listener.accept_sender_for<Batch>(10s);
  clients.join();
  EXPECT_TRUE(sender.has_value());
  ASSERT_EQ(refusals.size(), 2u);
  EXPECT_NE(refusals[0].find("secret"), std::string::npos) << refusals[0];
}

TEST_F(UcxEndpointTest, NoSecretOnANonLoopbackAddressIsAnErrorAtListen) {
  ::unsetenv("FERRY_SECRET");
  try {
    ucx::listen("ucx://0.0.0.0:0", quiet_options(""));
    ADD_FAILURE() << "listened on every interface without a secret";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("secret"), std::string::npos) << error.what();
  }
}

TEST_F(UcxEndpointTest, MalformedAddressesNameTheAcceptedForms) {
  for (const char* address : {"ucx://127.0.0.1", "ucx://::1:7000", "tcp://127.0.0.1:1", "ucx://127.0.0.1:99999"}) {
    try {
      ucx::listen(address, quiet_options());
      ADD_FAILURE() << address;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("accepted forms"), std::string::npos) << error.what();
    }
  }
}

TEST_F(UcxEndpointTest, SilentAndGarbageClientsDelayNoOther) {
  ucx::Options options = quiet_options();
  options.handshake_timeout = 3s;
  std::vector<std::string> refusals;
  options.on_refusal = [&](const std::string& why) { refusals.push_back(why); };
  auto listener = ucx::listen("ucx://127.0.0.1:0", options);
  const std::string address = listener.address();
  const auto port = static_cast<std::uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
  // A raw TCP client that sends garbage, and one that says nothing.
  auto raw_client = [port](bool garbage) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
    if (garbage) {
      const char junk[] = "GET / HTTP/1.0\r\n\r\nnot a ucx client at all";
      EXPECT_GT(::send(fd.get(), junk, sizeof junk, MSG_NOSIGNAL), 0);
    }
    return fd;
  };
  UniqueFd silent = raw_client(false);
  UniqueFd garbage = raw_client(true);
  const auto start = std::chrono::steady_clock::now();
  std::thread good([&] { Receiver<Batch> rx = ucx::connect_receiver<Batch>(address, quiet_options()); });
  auto sender = listener.accept_sender_for<Batch>(10s);
  good.join();
  EXPECT_TRUE(sender.has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s) << "a silent or garbage client delayed the good one";
}

TEST_F(UcxEndpointTest, ASenderKilledIsPeerDiedWithin100ms) {
  AddressPipe pipe;
  const pid_t child = fork_child([&] {
    Sender<Batch> tx = ucx::connect_sender<Batch>(pipe.get(), quiet_options());
    tx.send(Batch{1, {pattern(1 << 20, 1)}});
    ::pause();  // until killed
  });
  {
    auto listener = ucx::listen("ucx://127.0.0.1:0", quiet_options());
    pipe.put(listener.address());
    auto accepted = listener.accept_receiver_for<Batch>(10s);
    ASSERT_TRUE(accepted.has_value());
    Receiver<Batch> rx = std::move(*accepted);
    auto first = rx.recv_for(10s);
    ASSERT_TRUE(first.has_value());
    EXPECT_TRUE(has_pattern(first->tensors.at(0), 1 << 20, 1));
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    const auto killed = std::chrono::steady_clock::now();
    EXPECT_THROW(rx.recv_for(10s), PeerDied);
    const auto noticed = std::chrono::steady_clock::now() - killed;
    EXPECT_LT(noticed, 100ms) << std::chrono::duration_cast<std::chrono::milliseconds>(noticed).count() << " ms";
  }
  EXPECT_EQ(wait_child(child).signal, SIGKILL);
}

TEST_F(UcxEndpointTest, AReceiverGoneIsChannelClosedForTheSender) {
  auto listener = ucx::listen("ucx://127.0.0.1:0", quiet_options());
  const std::string address = listener.address();
  std::optional<Receiver<Batch>> rx;
  std::thread client([&] { rx = ucx::connect_receiver<Batch>(address, quiet_options()); });
  Sender<Batch> tx = listener.accept_sender<Batch>();
  client.join();
  tx.send(Batch{1, {}});
  ASSERT_TRUE(rx->recv_for(5s).has_value());
  rx->close();
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() < deadline) {
    try {
      tx.send(Batch{2, {pattern(1 << 20, 2)}});
      std::this_thread::sleep_for(1ms);
    } catch (const ChannelClosed&) {
      closed = true;
    }
  }
  EXPECT_TRUE(closed);
}

TEST_F(UcxEndpointTest, SelectorWakesForAUcxReceiver) {
  auto listener = ucx::listen("ucx://127.0.0.1:0", quiet_options());
  const std::string address = listener.address();
  std::optional<Receiver<Batch>> rx;
  std::thread client([&] { rx = ucx::connect_receiver<Batch>(address, quiet_options()); });
  Sender<Batch> tx = listener.accept_sender<Batch>();
  client.join();
  auto [local_tx, local_rx] = channel<Other>(Transport::UnixSocket);
  Selector selector;
  selector.add(*rx);
  selector.add(local_rx);
  EXPECT_FALSE(selector.wait_for(20ms).has_value());
  std::thread later([&] {
    std::this_thread::sleep_for(20ms);
    tx.send(Batch{3, {pattern(100, 3)}});
  });
  const auto ready = selector.wait_for(5s);
  later.join();
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(*ready, 0u);
  auto batch = rx->try_recv();
  ASSERT_TRUE(batch.has_value());
  EXPECT_TRUE(has_pattern(batch->tensors.at(0), 100, 3));
  rx->close();  // nobody reads on: the sender's close need not wait for its flush
}

TEST_F(UcxEndpointTest, AUcxEndIsRefusedBySpawn) {
  auto listener = ucx::listen("ucx://127.0.0.1:0", quiet_options());
  const std::string address = listener.address();
  std::optional<Receiver<Batch>> rx;
  std::thread client([&] { rx = ucx::connect_receiver<Batch>(address, quiet_options()); });
  Sender<Batch> tx = listener.accept_sender<Batch>();
  client.join();
  try {
    SpawnOptions options;
    options.fork_with_threads = true;  // UCX runs a thread of its own
    auto group = spawn(options, 1, [](WorkerContext&, Sender<Batch>) {}, std::move(tx));
    ADD_FAILURE() << "spawn took a ucx end";
  } catch (const SpawnError& error) {
    EXPECT_NE(std::string(error.what()).find("ucx"), std::string::npos) << error.what();
  }
  EXPECT_THROW(rx->recv_for(5s), PeerDied);  // the refused end was let go without ending its stream
}

std::size_t count_threads() {
  std::size_t threads = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++threads;
  return threads;
}

// The fixture checks fds; UCX's own thread must be gone too once the last end is.
TEST_F(UcxEndpointTest, ThreadsAreBackToTheirStartCountAfterTheLastEnd) {
  const std::size_t threads_before = count_threads();
  {
    auto listener = ucx::listen("ucx://127.0.0.1:0", quiet_options());
    const std::string address = listener.address();
    std::optional<Receiver<Batch>> rx;
    std::thread client([&] { rx = ucx::connect_receiver<Batch>(address, quiet_options()); });
    Sender<Batch> tx = listener.accept_sender<Batch>();
    client.join();
    EXPECT_GT(count_threads(), threads_before);  // UCX runs a thread while it is in use
    std::thread reader([&] { EXPECT_TRUE(rx->recv_for(5s).has_value()); });
    tx.send(Batch{1, {pattern(1 << 20, 1)}});  // returns once the reader took it (rendezvous)
    reader.join();
    rx->close();
  }
  EXPECT_EQ(count_threads(), threads_before);
}

TEST_F(UcxEndpointTest, AUcxEndCarriedAcrossForkIsRefusedInTheChild) {
  auto listener = ucx::listen("ucx://127.0.0.1:0", quiet_options());
  const std::string address = listener.address();
  std::optional<Receiver<Batch>> rx;
  std::thread client([&] { rx = ucx::connect_receiver<Batch>(address, quiet_options()); });
  Sender<Batch> tx = listener.accept_sender<Batch>();
  client.join();
  const pid_t child = fork_child([&] {
    try {
      rx->recv_for(10ms);
      CHILD_CHECK(false);
    } catch (const Error& error) {
      CHILD_CHECK(std::string(error.what()).find("fork") != std::string::npos);
    }
  });
  EXPECT_TRUE(test::child_succeeded(child));
  tx.send(Batch{4, {}});  // the parent's ends are untouched
  auto batch = rx->recv_for(5s);
  EXPECT_TRUE(batch.has_value() && batch->index == 4);
  rx->close();
}

}  // namespace
}  // namespace ferry
