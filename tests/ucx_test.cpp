// ucx:// endpoints (ferry::listen / connect_* with "ucx://HOST:PORT", library ferry::ucx)
// on loopback over UCX's TCP transport (ctest sets UCX_TLS=tcp): tensors of every size both
// ways, duplex ends, the handshake's checks (type, direction, secret), hostile and silent
// clients, a Listener in a Selector, send_for against a stopped receiver, peer death, and
// fds and threads back to their start counts.
//
// A process forked after it used UCX must not touch UCX, so every test forks its child
// before the parent's first UCX call and passes the listener's port through a pipe.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ferry/detail/frame_channel.hpp"
#include "ferry/ferry.hpp"
#include "support/address_pipe.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/ucx_test_endpoints.hpp"
#include "ucx/ucx_address.hpp"
#include "ucx/ucx_connection.hpp"
#include "ucx/ucx_context.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::AddressPipe;
using test::fork_child;
using test::quiet_ucx_options;
using test::wait_child;

using Batch = test::UcxBatch;
struct Other {
  std::int32_t value = 0;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(value);
  }
};

// Bytes in the frame itself (no tensor, so no rendezvous): large ones fill the sockets.
struct Bulk {
  std::int64_t index = 0;
  std::vector<std::uint8_t> bytes;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(index, bytes);
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

const std::vector<std::size_t> kSizes = {0, 1, 7, 4096, (16u << 10), (16u << 10) + 1, 1u << 20, 8u << 20};

class UcxEndpointTest : public test::LeakCheckedTest {};

// The listener in a child echoes every batch back with each byte's seed raised by one;
// the parent checks what comes back, for every size, inline and by rendezvous.
TEST_F(UcxEndpointTest, TensorsOfEverySizeTravelBothWaysWithTheirContents) {
  AddressPipe pipe;
  const pid_t child = fork_child([&] {
    auto listener = listen("ucx://127.0.0.1:0", quiet_ucx_options());
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
    Sender<Batch> to_child = connect_sender<Batch>(address, quiet_ucx_options());
    Receiver<Batch> from_child = connect_receiver<Batch>(address, quiet_ucx_options());
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
      EXPECT_TRUE(
          has_pattern(reply->tensors[1], kSizes[kSizes.size() - 1 - round], static_cast<std::uint8_t>(round + 1)));
    }
    to_child.close();
    EXPECT_FALSE(from_child.recv_for(10s).has_value());  // the child's end of stream
  }
  EXPECT_TRUE(test::child_succeeded(child));
}

// Storages in shared memory travel by rendezvous with their segment's UCX registration,
// made once per segment: twenty round trips of 1 MiB tensors (sent from the caching
// allocator, received into it, echoed back as received) register no more segments than
// the first two did.
TEST_F(UcxEndpointTest, SharedSegmentsAreRegisteredWithUcxOncePerSegment) {
  AddressPipe pipe;
  const pid_t child = fork_child([&] {
    auto listener = listen("ucx://127.0.0.1:0", quiet_ucx_options());
    pipe.put(listener.address());
    auto endpoint = listener.accept_duplex_for<Batch, Batch>(10s);
    CHILD_CHECK(endpoint.has_value());
    while (auto batch = endpoint->recv()) endpoint->send(*batch);  // the received storages themselves
  });
  {
    auto endpoint = connect_duplex<Batch, Batch>(pipe.get(), quiet_ucx_options());
    ucx::detail::UcxRegistrations& registrations = ucx::detail::UcxContext::get({}, AF_INET)->registrations();
    std::size_t after_two = 0;
    for (int round = 0; round < 20; ++round) {
      Batch batch;
      batch.index = round;
      batch.tensors.push_back(pattern(1u << 20, static_cast<std::uint8_t>(round), Device::SharedCpu));
      endpoint.send(batch);
      auto reply = endpoint.recv_for(10s);
      ASSERT_TRUE(reply.has_value());
      ASSERT_EQ(reply->tensors.size(), 1u);
      EXPECT_EQ(reply->tensors[0].device(), Device::SharedCpu);
      EXPECT_TRUE(has_pattern(reply->tensors[0], 1u << 20, static_cast<std::uint8_t>(round)));
      if (round == 1) after_two = registrations.size();
    }
    EXPECT_GE(after_two, 1u);
    EXPECT_EQ(registrations.size(), after_two);
  }
  EXPECT_TRUE(test::child_succeeded(child));
}

// A registered segment that died (its last tensor gone, the allocator's cache emptied) is
// unregistered when the next segment is registered.
TEST_F(UcxEndpointTest, ADeadSegmentIsUnregisteredAtTheNextRegistration) {
  const auto context = ucx::detail::UcxContext::get({}, AF_INET);
  ucx::detail::UcxRegistrations& registrations = context->registrations();
  const std::size_t before = registrations.size();
  {
    const Tensor first = Tensor::zeros({8 << 20}, DType::UInt8, Device::SharedCpu);  // a segment of its own
    ASSERT_NE(registrations.handle_for(*first.storage()), nullptr);
    EXPECT_EQ(registrations.size(), before + 1);
  }
  release_cached_shared_memory();
  const Tensor second = Tensor::zeros({8 << 20}, DType::UInt8, Device::SharedCpu);
  ASSERT_NE(registrations.handle_for(*second.storage()), nullptr);
  EXPECT_EQ(registrations.size(), before + 1) << "the dead segment is still registered";
}

// A receiver that is alive but stops reading for longer than the keepalive bound (a
// trainer writing a checkpoint) fills the sockets, so the sender waits: its host still
// answers, so the connection stays, and everything arrives once it reads again.
TEST_F(UcxEndpointTest, AReceiverThatStopsReadingLongerThanTheKeepaliveBoundKeepsItsConnection) {
  constexpr int kMessages = 96;  // 96 MiB: more than the sockets and the frames in flight hold
  AddressPipe pipe;
  const pid_t child = fork_child([&] {
    auto listener = listen("ucx://127.0.0.1:0", quiet_ucx_options());
    pipe.put(listener.address());
    auto rx = listener.accept_receiver_for<Bulk>(10s);
    CHILD_CHECK(rx.has_value());
    CHILD_CHECK(rx->recv_for(10s).has_value());
    std::this_thread::sleep_for(6s);  // the default bound is 4 s
    for (int index = 1; index < kMessages; ++index) {
      auto bulk = rx->recv_for(20s);
      CHILD_CHECK(bulk.has_value() && bulk->index == index && bulk->bytes.size() == (1u << 20));
    }
    CHILD_CHECK(!rx->recv_for(20s).has_value());
  });
  {
    Sender<Bulk> tx = connect_sender<Bulk>(pipe.get(), quiet_ucx_options());
    const auto since = std::chrono::steady_clock::now();
    for (int index = 0; index < kMessages; ++index) {
      tx.send(Bulk{index, std::vector<std::uint8_t>(1u << 20, static_cast<std::uint8_t>(index))});
    }
    // The sends waited for the stalled receiver longer than the bound, checked all along.
    EXPECT_GE(std::chrono::steady_clock::now() - since, 5s);
    tx.close();
  }
  EXPECT_TRUE(test::child_succeeded(child, 60s));
}

// ferry sets keepalive (and watches for a silent host) only on the sockets UCX made for a
// connection: a TCP connection the program itself has to the same host keeps its settings.
TEST_F(UcxEndpointTest, KeepaliveIsSetOnTheConnectionsOwnSocketsOnly) {
  const auto keepalive_of = [](int fd) {
    int on = -1;
    socklen_t length = sizeof on;
    EXPECT_EQ(::getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, &length), 0);
    return on;
  };
  // The program's own connection to 127.0.0.1, made before the ucx end.
  ferry::detail::UniqueFd listening(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(listening);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t local_length = sizeof local;
  ASSERT_EQ(::bind(listening.get(), reinterpret_cast<sockaddr*>(&local), sizeof local), 0);
  ASSERT_EQ(::listen(listening.get(), 1), 0);
  ASSERT_EQ(::getsockname(listening.get(), reinterpret_cast<sockaddr*>(&local), &local_length), 0);
  ferry::detail::UniqueFd mine(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(mine);
  ASSERT_EQ(::connect(mine.get(), reinterpret_cast<sockaddr*>(&local), sizeof local), 0);
  ferry::detail::UniqueFd accepted(::accept4(listening.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(accepted);

  AddressPipe pipe;
  const pid_t child = fork_child([&] {
    auto listener = listen("ucx://127.0.0.1:0", quiet_ucx_options());
    pipe.put(listener.address());
    auto rx = listener.accept_receiver_for<Batch>(10s);
    CHILD_CHECK(rx.has_value());
    CHILD_CHECK(rx->recv_for(10s).has_value());
    // Alive, and so the connection, until the parent has looked at its sockets and closed.
    CHILD_CHECK(!rx->recv_for(10s).has_value());
  });
  {
    Sender<Batch> tx = connect_sender<Batch>(pipe.get(), quiet_ucx_options());
    tx.send(Batch{1, {pattern(64, 1)}});
    EXPECT_EQ(keepalive_of(mine.get()), 0);
    EXPECT_EQ(keepalive_of(accepted.get()), 0);
    // ...while the connection's own sockets (some socket to 127.0.0.1 other than those two) have it.
    bool some_own_socket_has_it = false;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
      const int fd = std::atoi(entry.path().filename().c_str());
      if (fd == mine.get() || fd == accepted.get() || fd == listening.get()) continue;
      int on = 0;
      socklen_t length = sizeof on;
      if (::getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, &length) == 0 && on == 1) some_own_socket_has_it = true;
    }
    EXPECT_TRUE(some_own_socket_has_it);
    tx.close();
  }
  EXPECT_TRUE(test::child_succeeded(child));
}

TEST_F(UcxEndpointTest, TypeAndDirectionMismatchesAreRefusedAndTheListenerGoesOn) {
  auto listener = listen("ucx://127.0.0.1:0", quiet_ucx_options());
  listener.serve_sender<Batch>();
  const std::string address = listener.address();
  std::thread clients([&] {
    EXPECT_THROW(connect_receiver<Other>(address, quiet_ucx_options()), TypeMismatch);  // type
    EXPECT_THROW(connect_sender<Batch>(address, quiet_ucx_options()), TypeMismatch);    // direction
    Receiver<Batch> good = connect_receiver<Batch>(address, quiet_ucx_options());
    auto batch = good.recv_for(5s);
    EXPECT_TRUE(batch.has_value() && batch->index == 7);
  });
  // Accepting pumps the handshakes of the refused clients too.
  auto sender = listener.accept_sender_for<Batch>(10s);
  ASSERT_TRUE(sender.has_value());
  sender->send(Batch{7, {}});
  clients.join();
}

// The listener proves the secret first: a client of another secret finds out at the
// listener's proof and leaves before it declared anything (the listener sees it go); a
// client with no secret at all (allowed) likewise. A client of the right secret is served.
TEST_F(UcxEndpointTest, AWrongOrMissingSecretIsRefused) {
  ::unsetenv("FERRY_SECRET");
  std::vector<std::string> refusals;
  EndpointOptions options = quiet_ucx_options("right");
  options.on_refusal = [&](const std::string& why) { refusals.push_back(why); };
  auto listener = listen("ucx://127.0.0.1:0", options);
  const std::string address = listener.address();
  std::thread clients([&] {
    EndpointOptions none = quiet_ucx_options("");
    none.allow_no_secret = true;
    for (const EndpointOptions& wrong : {quiet_ucx_options("wrong"), none}) {
      try {
        connect_receiver<Batch>(address, wrong);
        ADD_FAILURE() << "a wrong secret was accepted";
      } catch (const UntrustedPeer& error) {
        EXPECT_NE(std::string(error.what()).find("did not prove the shared secret"), std::string::npos) << error.what();
      }
    }
    Receiver<Batch> good = connect_receiver<Batch>(address, quiet_ucx_options("right"));
    // Stays until accepted (a client gone before its accept is reported and skipped).
    auto batch = good.recv_for(10s);
    EXPECT_TRUE(batch.has_value() && batch->index == 3);
  });
  auto sender = listener.accept_sender_for<Batch>(10s);
  if (sender) sender->send(Batch{3, {}});
  clients.join();
  EXPECT_TRUE(sender.has_value());
  EXPECT_EQ(refusals.size(), 2u) << (refusals.empty() ? "" : refusals.back());
}

// UCX 1.13's TCP transport takes no IPv6 address on the loopback device, and link-local or
// IPv4-mapped ones name no device: each is a clear Error, at listen and at connect, before
// UCX starts. A bracketed address that is not IPv6 is malformed.
TEST_F(UcxEndpointTest, IPv6AddressesUcxCannotCarryAreRefusedClearly) {
  EndpointOptions quick = quiet_ucx_options();
  quick.connect_timeout = 100ms;
  for (const char* address : {"ucx://[::1]:0", "ucx://[fe80::1]:7000", "ucx://[::ffff:127.0.0.1]:7000"}) {
    try {
      (void)listen(address, quick);
      ADD_FAILURE() << address;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("127.0.0.1 on one host"), std::string::npos) << error.what();
    }
    EXPECT_THROW((void)connect_receiver<Batch>(address, quick), Error) << address;
  }
  try {
    (void)listen("ucx://[10.0.0.1]:7000", quick);
    ADD_FAILURE() << "a bracketed IPv4 address was taken";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("is not an IPv6 address"), std::string::npos) << error.what();
  }
  // A name with addresses of both families resolves to its IPv4 one (a 0.0.0.0 listener takes it).
  const ucx::detail::UcxAddress local = ucx::detail::parse_ucx_address("ucx://localhost:7000");
  EXPECT_EQ(local.socket.ss_family, AF_INET);
  EXPECT_TRUE(local.loopback);
  const ucx::detail::UcxAddress any = ucx::detail::parse_ucx_address("ucx://[::]:7000");
  EXPECT_EQ(any.socket.ss_family, AF_INET6);
  EXPECT_EQ(any.text(7001), "[::]:7001");
  EXPECT_FALSE(any.loopback);
}

// Without a secret (option and FERRY_SECRET empty) listen and connect refuse, on loopback
// too, before UCX is touched; EndpointOptions::allow_no_secret on both sides lets them run.
TEST_F(UcxEndpointTest, NoSecretIsRefusedAtListenAndConnectUnlessAllowed) {
  ::unsetenv("FERRY_SECRET");
  for (const char* address : {"ucx://127.0.0.1:0", "ucx://0.0.0.0:0"}) {
    try {
      listen(address, quiet_ucx_options(""));
      ADD_FAILURE() << "listened without a secret at " << address;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("allow_no_secret"), std::string::npos) << error.what();
    }
  }
  try {
    connect_receiver<Batch>("ucx://127.0.0.1:7000", quiet_ucx_options(""));
    ADD_FAILURE() << "connected without a secret";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("refusing to connect"), std::string::npos) << error.what();
  }
  EndpointOptions open = quiet_ucx_options("");
  open.allow_no_secret = true;
  auto listener = listen("ucx://127.0.0.1:0", open);
  std::optional<Receiver<Batch>> rx;
  std::thread client([&] { rx = connect_receiver<Batch>(listener.address(), open); });
  auto tx = listener.accept_sender_for<Batch>(10s);
  client.join();
  ASSERT_TRUE(tx.has_value() && rx.has_value());
  tx->send(Batch{4, {}});
  auto batch = rx->recv_for(5s);
  EXPECT_TRUE(batch.has_value() && batch->index == 4);
}

TEST_F(UcxEndpointTest, MalformedAddressesNameTheAcceptedForms) {
  for (const char* address : {"ucx://127.0.0.1", "ucx://::1:7000", "tcp://127.0.0.1:1", "ucx://127.0.0.1:99999"}) {
    try {
      listen(address, quiet_ucx_options());
      ADD_FAILURE() << address;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("accepted forms"), std::string::npos) << error.what();
    }
  }
}

// ferry sets UCX_TCP_AF_PRIO for each context it starts, unless the user set it: the user's
// value must reach UCX unchanged. An order UCX cannot parse proves it did (UCX refuses it),
// and the variable is still the user's afterwards.
TEST_F(UcxEndpointTest, AnAddressFamilyOrderTheUserSetReachesUcx) {
  // Puts back what the environment held before, however the test ends.
  struct RestoredEnv {
    std::optional<std::string> before;
    ~RestoredEnv() {
      if (before) {
        (void)::setenv("UCX_TCP_AF_PRIO", before->c_str(), 1);
      } else {
        (void)::unsetenv("UCX_TCP_AF_PRIO");
      }
    }
  } restored{std::getenv("UCX_TCP_AF_PRIO") ? std::optional<std::string>(std::getenv("UCX_TCP_AF_PRIO"))
                                            : std::nullopt};
  ASSERT_EQ(::setenv("UCX_TCP_AF_PRIO", "no_such_family", 1), 0);
  try {
    auto listener = listen("ucx://127.0.0.1:0", quiet_ucx_options());
    ADD_FAILURE() << "UCX started with ferry's address family order, not the user's";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("UCX"), std::string::npos) << error.what();
  }
  ASSERT_NE(std::getenv("UCX_TCP_AF_PRIO"), nullptr);
  EXPECT_STREQ(std::getenv("UCX_TCP_AF_PRIO"), "no_such_family");
}

TEST_F(UcxEndpointTest, SilentAndGarbageClientsDelayNoOther) {
  EndpointOptions options = quiet_ucx_options();
  options.handshake_timeout = 3s;
  std::vector<std::string> refusals;
  options.on_refusal = [&](const std::string& why) { refusals.push_back(why); };
  auto listener = listen("ucx://127.0.0.1:0", options);
  const std::string address = listener.address();
  const auto port = static_cast<std::uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
  // A raw TCP client that sends garbage, and one that says nothing.
  auto raw_client = [port](bool garbage) {
    ferry::detail::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
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
  ferry::detail::UniqueFd silent = raw_client(false);
  ferry::detail::UniqueFd garbage = raw_client(true);
  const auto start = std::chrono::steady_clock::now();
  std::optional<Receiver<Batch>> rx;  // kept until accepted (a client gone before is skipped)
  std::thread good([&] { rx = connect_receiver<Batch>(address, quiet_ucx_options()); });
  auto sender = listener.accept_sender_for<Batch>(10s);
  good.join();
  EXPECT_TRUE(sender.has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s) << "a silent or garbage client delayed the good one";
  rx->close();
}

TEST_F(UcxEndpointTest, ASenderKilledIsPeerDiedWithin100ms) {
  AddressPipe pipe;
  const pid_t child = fork_child([&] {
    Sender<Batch> tx = connect_sender<Batch>(pipe.get(), quiet_ucx_options());
    tx.send(Batch{1, {pattern(1 << 20, 1)}});
    ::pause();  // until killed
  });
  {
    auto listener = listen("ucx://127.0.0.1:0", quiet_ucx_options());
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
  auto listener = listen("ucx://127.0.0.1:0", quiet_ucx_options());
  const std::string address = listener.address();
  std::optional<Receiver<Batch>> rx;
  std::thread client([&] { rx = connect_receiver<Batch>(address, quiet_ucx_options()); });
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
  auto listener = listen("ucx://127.0.0.1:0", quiet_ucx_options());
  const std::string address = listener.address();
  std::optional<Receiver<Batch>> rx;
  std::thread client([&] { rx = connect_receiver<Batch>(address, quiet_ucx_options()); });
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
  auto listener = listen("ucx://127.0.0.1:0", quiet_ucx_options());
  const std::string address = listener.address();
  std::optional<Receiver<Batch>> rx;
  std::thread client([&] { rx = connect_receiver<Batch>(address, quiet_ucx_options()); });
  Sender<Batch> tx = listener.accept_sender<Batch>();
  client.join();
  try {
    SpawnOptions options;
    options.fork_with_threads = true;  // UCX runs a thread of its own
    auto group = spawn(
        options, 1, [](WorkerContext&, Sender<Batch>) {}, std::move(tx));
    ADD_FAILURE() << "spawn took a ucx end";
  } catch (const SpawnError& error) {
    EXPECT_NE(std::string(error.what()).find("ucx"), std::string::npos) << error.what();
  }
  EXPECT_THROW(rx->recv_for(5s), PeerDied);  // the refused end was let go without ending its stream
}

// 64 clients of another process connect at once; each gets its own stream and its own tensor.
TEST_F(UcxEndpointTest, SixtyFourClientsConnectAtOnceAndEachGetsItsOwnStream) {
  constexpr int kClients = 64;
  AddressPipe pipe;
  const pid_t child = fork_child([&] {
    const std::string address = pipe.get();
    std::vector<std::thread> clients;
    std::atomic<int> good{0};
    for (int i = 0; i < kClients; ++i) {
      clients.emplace_back([&] {
        try {
          Receiver<Batch> rx = connect_receiver<Batch>(address, quiet_ucx_options());
          const auto batch = rx.recv_for(30s);
          if (batch && batch->tensors.size() == 1 &&
              has_pattern(batch->tensors[0], 4096, static_cast<std::uint8_t>(batch->index))) {
            ++good;
          }
        } catch (const std::exception& error) {
          std::fprintf(stderr, "client: %s\n", error.what());
        }
      });
    }
    for (auto& client : clients) client.join();
    CHILD_CHECK(good == kClients);
  });
  {
    auto listener = listen("ucx://127.0.0.1:0", quiet_ucx_options());
    pipe.put(listener.address());
    std::vector<Sender<Batch>> senders;
    for (int i = 0; i < kClients; ++i) {
      auto tx = listener.accept_sender_for<Batch>(30s);
      ASSERT_TRUE(tx.has_value()) << "client " << i << " was not accepted";
      Batch batch;
      batch.index = i;
      batch.tensors.push_back(pattern(4096, static_cast<std::uint8_t>(i)));
      tx->send(batch);
      senders.push_back(std::move(*tx));
    }
    for (auto& tx : senders) tx.close();
  }
  EXPECT_TRUE(test::child_succeeded(child));
}

// A Distributor over ucx:// ends: the consumers' readers report each delivery on the
// connection (no return board across hosts), so a bound of 2 in flight lets 40 messages
// through, and every message reaches exactly one consumer.
TEST_F(UcxEndpointTest, ADistributorBalancesUcxConsumers) {
  constexpr int kMessages = 40;
  AddressPipe pipe;
  AddressPipe report;
  const pid_t child = fork_child([&] {
    const std::string address = pipe.get();
    std::atomic<std::int64_t> sum{0};
    std::atomic<int> count{0};
    std::vector<std::thread> consumers;
    for (int c = 0; c < 2; ++c) {
      consumers.emplace_back([&] {
        Receiver<Batch> rx = connect_receiver<Batch>(address, quiet_ucx_options());
        while (auto batch = rx.recv_for(20s)) {
          CHILD_CHECK(batch->tensors.size() == 1 &&
                      has_pattern(batch->tensors[0], 64, static_cast<std::uint8_t>(batch->index)));
          sum += batch->index;
          ++count;
        }
      });
    }
    for (auto& consumer : consumers) consumer.join();
    report.put(std::to_string(count.load()) + " " + std::to_string(sum.load()));
  });
  {
    auto listener = listen("ucx://127.0.0.1:0", quiet_ucx_options());
    pipe.put(listener.address());
    Distributor<Batch> pool;
    for (int c = 0; c < 2; ++c) {
      auto tx = listener.accept_sender_for<Batch>(20s);
      ASSERT_TRUE(tx.has_value());
      pool.add(std::move(*tx), 2);
    }
    for (int i = 0; i < kMessages; ++i) {
      Batch batch;
      batch.index = i;
      batch.tensors.push_back(pattern(64, static_cast<std::uint8_t>(i)));
      ASSERT_TRUE(pool.send_for(batch, 10s)) << "message " << i << " found every consumer full";
    }
    std::uint64_t delivered = 0;
    for (const auto until = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < until;) {
      delivered = 0;
      for (const ConsumerStats& consumer : pool.stats()) delivered += consumer.delivered;
      if (delivered == kMessages) break;
      std::this_thread::sleep_for(1ms);
    }
    EXPECT_EQ(delivered, static_cast<std::uint64_t>(kMessages));
  }  // the Distributor closes its consumers' ends
  EXPECT_EQ(report.get(), std::to_string(kMessages) + " " + std::to_string(kMessages * (kMessages - 1) / 2));
  EXPECT_TRUE(test::child_succeeded(child));
}

TEST_F(UcxEndpointTest, DuplexEndsCarryTensorsBothWays) {
  auto listener = listen("ucx://127.0.0.1:0", quiet_ucx_options());
  const std::string address = listener.address();
  std::thread client([&] {
    DuplexEnd<Batch, Other> end = connect_duplex<Batch, Other>(address, quiet_ucx_options());
    for (int round = 0; round < 3; ++round) {
      end.send(Batch{round, {pattern(1 << 20, static_cast<std::uint8_t>(round))}});
      auto answer = end.recv_for(10s);
      EXPECT_TRUE(answer.has_value() && answer->value == round * 10);
    }
  });
  auto accepted = listener.accept_duplex_for<Other, Batch>(10s);
  ASSERT_TRUE(accepted.has_value());
  for (int round = 0; round < 3; ++round) {
    auto batch = accepted->recv_for(10s);
    ASSERT_TRUE(batch.has_value());
    EXPECT_EQ(batch->index, round);
    EXPECT_TRUE(has_pattern(batch->tensors.at(0), 1 << 20, static_cast<std::uint8_t>(round)));
    accepted->send(Other{round * 10});
  }
  EXPECT_FALSE(accepted->recv_for(10s).has_value());  // the client's end of stream
  client.join();
}

TEST_F(UcxEndpointTest, AListenerInASelectorIsReadyWhenAClientCompletedItsHandshake) {
  auto listener = listen("ucx://127.0.0.1:0", quiet_ucx_options());
  listener.serve_sender<Batch>();
  const std::string address = listener.address();
  auto [local_tx, local_rx] = channel<Other>(Transport::UnixSocket);
  Selector selector;
  selector.add(local_rx);
  const std::size_t index = selector.add(listener);
  EXPECT_FALSE(selector.wait_for(20ms).has_value());
  std::optional<Receiver<Batch>> rx;
  std::thread client([&] { rx = connect_receiver<Batch>(address, quiet_ucx_options()); });
  // The Selector advances the handshake while it waits; the client completes it only then.
  const auto ready = selector.wait_for(10s);
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(*ready, index);
  auto tx = listener.accept_sender_for<Batch>(0ms);
  client.join();
  ASSERT_TRUE(tx.has_value());
  tx->send(Batch{5, {pattern(64, 5)}});
  auto batch = rx->recv_for(5s);
  ASSERT_TRUE(batch.has_value());
  EXPECT_TRUE(has_pattern(batch->tensors.at(0), 64, 5));
  rx->close();  // nobody reads on: the sender's close need not wait for its flush
}

// The listener tells a client it is accepted when their handshake ends, before accept():
// what the client sends then, and closes, waits for accept() like a local client's bytes.
TEST_F(UcxEndpointTest, WhatAClientSentBeforeClosingReachesTheEndAcceptedAfterIt) {
  auto listener = listen("ucx://127.0.0.1:0", quiet_ucx_options());
  listener.serve_receiver<Batch>();
  const std::string address = listener.address();
  Selector selector;
  selector.add(listener);
  std::thread client([&] {
    Sender<Batch> tx = connect_sender<Batch>(address, quiet_ucx_options());
    tx.send(Batch{7, {pattern(4096, 7)}});
    tx.close();
  });
  ASSERT_TRUE(selector.wait_for(10s).has_value());  // the handshake ended
  client.join();                                    // the client sent, closed and is gone
  auto rx = listener.accept_receiver_for<Batch>(0ms);
  ASSERT_TRUE(rx.has_value());
  auto batch = rx->recv_for(5s);
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->index, 7);
  EXPECT_TRUE(has_pattern(batch->tensors.at(0), 4096, 7));
  EXPECT_FALSE(rx->recv_for(5s).has_value());  // then its end of stream
}

// A client that completes UCX's connection and then says nothing: the listener's
// handshake with it never advances. It must delay no other client, and be dropped at its
// handshake_timeout.
TEST_F(UcxEndpointTest, ASilentUcxClientDelaysNoOtherAndIsDroppedAtItsHandshakeTimeout) {
  AddressPipe address_pipe;
  AddressPipe connected_pipe;
  const pid_t child = fork_child([&] {
    const std::string address = address_pipe.get();
    const ucx::detail::UcxAddress parsed = ucx::detail::parse_ucx_address(address);
    auto context = ucx::detail::UcxContext::get({}, AF_INET);
    auto connection = ucx::detail::UcxConnection::connect(context, parsed.socket, parsed.length, FrameLimits{});
    CHILD_CHECK(
        connection->receive_control(ferry::detail::Deadline::after(10s)).has_value());  // the listener's challenge
    connected_pipe.put("connected");
    ::pause();  // silent until killed
  });
  constexpr auto kHandshakeTimeout = 1500ms;
  EndpointOptions options = quiet_ucx_options();
  options.handshake_timeout = kHandshakeTimeout;
  std::vector<std::string> refusals;
  options.on_refusal = [&](const std::string& why) { refusals.push_back(why); };
  auto listener = listen("ucx://127.0.0.1:0", options);
  listener.serve_sender<Batch>();
  address_pipe.put(listener.address());
  // Accepting (nothing yet) advances the silent client's connection until it is pending.
  const auto start = std::chrono::steady_clock::now();
  while (detail::EndAccess::core(listener).pending_count() == 0 && std::chrono::steady_clock::now() - start < 10s) {
    EXPECT_FALSE(listener.accept_sender_for<Batch>(10ms).has_value());
  }
  ASSERT_EQ(detail::EndAccess::core(listener).pending_count(), 1u);
  const auto silent_since = std::chrono::steady_clock::now();
  // The listener's challenge leaves while it progresses: accepting moves it on.
  while (!connected_pipe.ready() && std::chrono::steady_clock::now() - silent_since < 10s) {
    EXPECT_FALSE(listener.accept_sender_for<Batch>(10ms).has_value());
  }
  (void)connected_pipe.get();
  std::optional<Receiver<Batch>> rx;
  std::thread good([&] { rx = connect_receiver<Batch>(listener.address(), quiet_ucx_options()); });
  auto tx = listener.accept_sender_for<Batch>(10s);
  good.join();
  ASSERT_TRUE(tx.has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - silent_since, kHandshakeTimeout)
      << "the silent client delayed the good one";
  EXPECT_EQ(detail::EndAccess::core(listener).pending_count(), 1u);  // the silent one, until its deadline
  EXPECT_TRUE(refusals.empty());
  // Accepting on advances the silent handshake to its deadline.
  while (refusals.empty() && std::chrono::steady_clock::now() - silent_since < 10s) {
    (void)listener.accept_sender_for<Batch>(100ms);
  }
  const auto dropped_after = std::chrono::steady_clock::now() - silent_since;
  ASSERT_EQ(refusals.size(), 1u);
  EXPECT_NE(refusals[0].find("handshake_timeout"), std::string::npos) << refusals[0];
  EXPECT_GE(dropped_after, kHandshakeTimeout - 100ms);
  EXPECT_LT(dropped_after, kHandshakeTimeout + 1s);
  EXPECT_EQ(detail::EndAccess::core(listener).pending_count(), 0u);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  EXPECT_EQ(wait_child(child).signal, SIGKILL);
}

// A rendezvous moves only while the receiver progresses: a receiver stopped with SIGSTOP
// holds a large send. send_for returns within its timeout all the same (the frame stays in
// flight), and once the frames in flight reach their cap it returns false, sending nothing.
// Everything it accepted arrives whole once the receiver runs again.
TEST_F(UcxEndpointTest, SendForTimesOutWhileARendezvousIsStuckAtAStoppedReceiver) {
  constexpr std::size_t kBytes = std::size_t{64} << 20;
  AddressPipe address_pipe;
  AddressPipe report_pipe;
  const pid_t child = fork_child([&] {
    Receiver<Batch> rx = connect_receiver<Batch>(address_pipe.get(), quiet_ucx_options());
    CHILD_CHECK(rx.recv_for(10s).has_value());
    report_pipe.put("ready");
    std::size_t good = 0;
    while (auto batch = rx.recv_for(30s)) {
      CHILD_CHECK(batch->tensors.size() == 1 && has_pattern(batch->tensors[0], kBytes, 9));
      ++good;
    }
    report_pipe.put(std::to_string(good));
  });
  EndpointOptions options = quiet_ucx_options();
  options.channel.close_linger = 20s;  // close waits for the frames in flight to arrive
  auto listener = listen("ucx://127.0.0.1:0", options);
  address_pipe.put(listener.address());
  auto tx = listener.accept_sender_for<Batch>(10s);
  ASSERT_TRUE(tx.has_value());
  tx->send(Batch{0, {}});
  EXPECT_EQ(report_pipe.get(), "ready");
  ASSERT_EQ(::kill(child, SIGSTOP), 0);
  const Batch big{1, {pattern(kBytes, 9)}};
  std::size_t accepted = 0;
  bool timed_out = false;
  constexpr auto kTimeout = 300ms;
  for (int attempt = 0; attempt < 8 && !timed_out; ++attempt) {
    const auto start = std::chrono::steady_clock::now();
    const bool sent = tx->send_for(big, kTimeout);
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_LT(took, kTimeout + 700ms) << "send_for waited "
                                      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
    if (sent) {
      ++accepted;
    } else {
      timed_out = true;
    }
  }
  EXPECT_TRUE(timed_out) << "send_for never timed out against a stopped receiver";
  EXPECT_GE(accepted, 1u);
  ASSERT_EQ(::kill(child, SIGCONT), 0);
  tx->close();
  EXPECT_EQ(report_pipe.get(), std::to_string(accepted));
  EXPECT_TRUE(test::child_succeeded(child));
}

// ---- two hosts: two network namespaces joined by a veth pair ----------------------------
//
// As root, the fixture makes namespaces <prefix>a (10.231.0.1) and <prefix>b (10.231.0.2)
// joined by a veth pair, and removes them afterwards (also when a check fails; namespaces
// a crashed run left behind are removed by the next). The parent never touches UCX: each
// side runs in a child that entered its namespace first.

constexpr const char* kNetnsPrefix = "ferry-ucx-";
constexpr const char* kHostA = "10.231.0.1";
constexpr const char* kHostB = "10.231.0.2";
constexpr const char* kHostA6 = "fd77:231::1";
constexpr const char* kHostB6 = "fd77:231::2";

int shell(const std::string& command) {
  const int status = std::system((command + " >/dev/null 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class UcxTwoHostsTest : public test::LeakCheckedTest {
 protected:
  void SetUp() override {
    test::LeakCheckedTest::SetUp();
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces (ip netns add)";
    if (shell("command -v ip") != 0) GTEST_SKIP() << "needs the ip command (iproute2) to create network namespaces";
    remove_stale_namespaces();
    const std::string tag = std::to_string(::getpid());
    a_ = kNetnsPrefix + tag + "a";
    b_ = kNetnsPrefix + tag + "b";
    if (shell("ip netns add " + a_) != 0) GTEST_SKIP() << "ip netns add failed (no CAP_SYS_ADMIN in this container?)";
    created_ = true;
    const std::string va = "fva" + tag;
    const std::string vb = "fvb" + tag;
    for (const std::string& command :
         {"ip netns add " + b_, "ip link add " + va + " netns " + a_ + " type veth peer name " + vb + " netns " + b_,
          "ip -n " + a_ + " addr add " + kHostA + "/24 dev " + va,
          "ip -n " + b_ + " addr add " + kHostB + "/24 dev " + vb, "ip -n " + a_ + " link set lo up",
          "ip -n " + b_ + " link set lo up", "ip -n " + a_ + " link set " + va + " up",
          "ip -n " + b_ + " link set " + vb + " up"}) {
      ASSERT_EQ(shell(command), 0) << command;
    }
    link_a_ = va;
    // IPv6 beside IPv4 (nodad: usable at once); a kernel without IPv6 skips only the IPv6 test.
    ipv6_ = shell("ip -n " + a_ + " addr add " + kHostA6 + "/64 dev " + va + " nodad") == 0 &&
            shell("ip -n " + b_ + " addr add " + kHostB6 + "/64 dev " + vb + " nodad") == 0;
    // A veth pair takes a moment to report its carrier; UCX uses only devices that are up
    // and running when its context starts.
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (!(shell("ip -n " + a_ + " link show " + va + " | grep -q 'state UP'") == 0 &&
             shell("ip -n " + b_ + " link show " + vb + " | grep -q 'state UP'") == 0)) {
      ASSERT_LT(std::chrono::steady_clock::now(), until) << "the veth pair did not come up";
      std::this_thread::sleep_for(10ms);
    }
  }
  void TearDown() override {
    for (const pid_t child : children_) {  // those a failed check left running
      int status = 0;
      if (::waitpid(child, &status, WNOHANG) == 0) {
        (void)::kill(child, SIGKILL);
        (void)::waitpid(child, &status, 0);
      }
    }
    if (created_) {
      (void)shell("ip netns del " + a_);  // removes the veth pair with it
      (void)shell("ip netns del " + b_);
    }
    test::LeakCheckedTest::TearDown();
  }
  // Namespaces of runs that died before their TearDown (their pid is gone).
  static void remove_stale_namespaces() {
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator("/run/netns", error)) {
      const std::string name = entry.path().filename();
      if (name.rfind(kNetnsPrefix, 0) != 0) continue;
      const std::string pid = name.substr(std::strlen(kNetnsPrefix), name.size() - std::strlen(kNetnsPrefix) - 1);
      if (::kill(static_cast<pid_t>(std::atoi(pid.c_str())), 0) != 0 && errno == ESRCH)
        (void)shell("ip netns del " + name);
    }
  }
  // Forks a child that runs `body` inside namespace `name`. Like `ip netns exec`, it also
  // mounts a /sys of that namespace in a mount namespace of its own: UCX finds its network
  // devices in /sys/class/net, which otherwise still lists the first namespace's.
  pid_t in_namespace(const std::string& name, const std::function<void()>& body) {
    return children_.emplace_back(fork_child([&] {
      ferry::detail::UniqueFd ns(::open(("/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC));
      CHILD_CHECK(ns && ::setns(ns.get(), CLONE_NEWNET) == 0);
      CHILD_CHECK(::unshare(CLONE_NEWNS) == 0);
      CHILD_CHECK(::mount("", "/", nullptr, MS_REC | MS_SLAVE, nullptr) == 0);
      CHILD_CHECK(::umount2("/sys", MNT_DETACH) == 0);
      CHILD_CHECK(::mount(name.c_str(), "/sys", "sysfs", 0, nullptr) == 0);
      body();
    }));
  }
  void expect_a_link_set_down_seen_by_a_sender(bool timed);
  static EndpointOptions options() {
    EndpointOptions options = quiet_ucx_options("two hosts");
    options.connect_timeout = 10s;
    return options;
  }

  std::string a_, b_, link_a_;
  bool created_ = false;
  bool ipv6_ = false;
  std::vector<pid_t> children_;
};

std::string listen_address() { return std::string("ucx://") + kHostB + ":0"; }

// Round trips of every size on a duplex end: each tensor comes back with its seed raised by one.
void echo_every_size(DuplexEnd<Batch, Batch>& endpoint) {
  for (std::size_t round = 0; round < kSizes.size(); ++round) {
    Batch batch;
    batch.index = static_cast<std::int64_t>(round);
    batch.tensors.push_back(pattern(kSizes[round], static_cast<std::uint8_t>(round)));
    endpoint.send(batch);
    auto reply = endpoint.recv_for(20s);
    CHILD_CHECK(reply.has_value() && reply->tensors.size() == 1);
    CHILD_CHECK(has_pattern(reply->tensors[0], kSizes[round], static_cast<std::uint8_t>(round + 1)));
  }
}

// The other side of echo_every_size, until the end of the stream.
void answer_echoes(DuplexEnd<Batch, Batch>& endpoint) {
  while (auto batch = endpoint.recv()) {
    Batch reply;
    reply.index = batch->index;
    for (const Tensor& tensor : batch->tensors) {
      CHILD_CHECK(has_pattern(tensor, tensor.nbytes(), static_cast<std::uint8_t>(batch->index)));
      reply.tensors.push_back(pattern(tensor.nbytes(), static_cast<std::uint8_t>(batch->index + 1)));
    }
    endpoint.send(reply);
  }
}

TEST_F(UcxTwoHostsTest, TensorsOfEverySizeTravelBothWaysBetweenHosts) {
  AddressPipe address;
  const pid_t server = in_namespace(b_, [&] {
    auto listener = listen("ucx://0.0.0.0:0", options());  // every interface: the secret is required
    const std::string bound = listener.address();
    address.put(std::string("ucx://") + kHostB + bound.substr(bound.rfind(':')));
    auto endpoint = listener.accept_duplex_for<Batch, Batch>(20s);
    CHILD_CHECK(endpoint.has_value());
    answer_echoes(*endpoint);
  });
  const pid_t client = in_namespace(a_, [&] {
    auto endpoint = connect_duplex<Batch, Batch>(address.get(), options());
    echo_every_size(endpoint);
  });
  EXPECT_TRUE(test::child_succeeded(client, 60s));
  EXPECT_TRUE(test::child_succeeded(server, 60s));
}

// A bracketed IPv6 literal between two hosts, beside IPv4 in the same processes: host B
// listens at [::] and at 0.0.0.0, host A connects to both, and tensors of every size make
// the round trip on each (UCX gets a context per address family).
TEST_F(UcxTwoHostsTest, TensorsTravelOverIpv6AndIpv4FromOneProcess) {
  if (!ipv6_) GTEST_SKIP() << "could not give the veth pair IPv6 addresses (a kernel without IPv6?)";
  AddressPipe address;
  const pid_t server = in_namespace(b_, [&] {
    auto v6 = listen("ucx://[::]:0", options());
    auto v4 = listen("ucx://0.0.0.0:0", options());
    const std::string bound6 = v6.address();
    const std::string bound4 = v4.address();
    CHILD_CHECK(bound6.rfind("ucx://[::]:", 0) == 0);
    address.put(std::string("ucx://[") + kHostB6 + "]" + bound6.substr(bound6.rfind(':')));
    address.put(std::string("ucx://") + kHostB + bound4.substr(bound4.rfind(':')));
    auto over6 = v6.accept_duplex_for<Batch, Batch>(20s);
    auto over4 = v4.accept_duplex_for<Batch, Batch>(20s);
    CHILD_CHECK(over6.has_value() && over4.has_value());
    answer_echoes(*over6);
    answer_echoes(*over4);
  });
  const pid_t client = in_namespace(a_, [&] {
    const std::string to6 = address.get();
    const std::string to4 = address.get();
    auto over6 = connect_duplex<Batch, Batch>(to6, options());
    auto over4 = connect_duplex<Batch, Batch>(to4, options());
    CHILD_CHECK(over6.sender.transport() == Transport::Ucx);
    echo_every_size(over6);
    over6.close();
    echo_every_size(over4);
  });
  EXPECT_TRUE(test::child_succeeded(client, 60s));
  EXPECT_TRUE(test::child_succeeded(server, 60s));
}

// Host A's sender is killed, then (with a new connection) host A's link goes down: host B's
// receiver gets PeerDied within 100 ms for the first, within the keepalive bound
// (idle 1 s + 3 x 1 s by default) for the second.
TEST_F(UcxTwoHostsTest, APeerKilledAndALinkSetDownAreSeenInTime) {
  AddressPipe address;
  AddressPipe report;
  AddressPipe go;
  const pid_t server = in_namespace(b_, [&] {
    auto listener = listen(listen_address(), options());
    address.put(listener.address());
    for (int connection = 0; connection < 2; ++connection) {
      auto rx = listener.accept_receiver_for<Batch>(20s);
      CHILD_CHECK(rx.has_value());
      CHILD_CHECK(rx->recv_for(20s).has_value());
      report.put("first");
      (void)go.get();  // the parent killed the sender, or set the link down
      const auto since = std::chrono::steady_clock::now();
      std::string outcome = "no error";
      try {
        (void)rx->recv_for(30s);
      } catch (const PeerDied&) {
        outcome = "PeerDied";
      } catch (const ChannelClosed&) {
        outcome = "ChannelClosed";
      }
      const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - since);
      report.put(outcome + " " + std::to_string(took.count()));
    }
  });
  const std::string where = address.get();
  const auto sender = [&] {
    return in_namespace(a_, [&] {
      Sender<Batch> tx = connect_sender<Batch>(where, options());
      tx.send(Batch{1, {pattern(1 << 20, 1)}});
      ::pause();
    });
  };
  // "PeerDied 12": what the receiver's recv_for threw, and how many ms after the event.
  const auto outcome_ms = [](const std::string& line) {
    EXPECT_TRUE(line.rfind("PeerDied", 0) == 0 || line.rfind("ChannelClosed", 0) == 0) << line;
    return std::stol(line.substr(line.find(' ') + 1));
  };

  const pid_t killed = sender();
  EXPECT_EQ(report.get(), "first");
  ASSERT_EQ(::kill(killed, SIGKILL), 0);
  go.put("go");
  const std::string after_kill = report.get();
  EXPECT_TRUE(after_kill.rfind("PeerDied", 0) == 0) << after_kill;
  EXPECT_LT(outcome_ms(after_kill), 100) << after_kill;
  EXPECT_EQ(wait_child(killed).signal, SIGKILL);

  const pid_t cut_off = sender();
  EXPECT_EQ(report.get(), "first");
  ASSERT_EQ(shell("ip -n " + a_ + " link set " + link_a_ + " down"), 0);
  go.put("go");
  const std::string after_link_down = report.get();
  // The default keepalive: idle 1 s, then 3 probes 1 s apart, and a margin for a loaded host.
  EXPECT_LT(outcome_ms(after_link_down), 5000 + 2000) << after_link_down;
  ASSERT_EQ(::kill(cut_off, SIGKILL), 0);
  EXPECT_EQ(wait_child(cut_off).signal, SIGKILL);
  EXPECT_TRUE(test::child_succeeded(server, 60s));
}

// A host that vanishes while this side's data waits unacknowledged: TCP's keepalive does not
// run on such a connection (it retransmits, up to tcp_retries2, many minutes), so ferry
// ends it once the peer's host has acknowledged nothing for the keepalive bound: with send()
// blocked on the frame, and with send_for() timing out again and again (`timed`).
void UcxTwoHostsTest::expect_a_link_set_down_seen_by_a_sender(bool timed) {
  AddressPipe address;
  AddressPipe report;
  AddressPipe go;
  const pid_t server = in_namespace(b_, [&] {
    auto listener = listen(listen_address(), options());
    address.put(listener.address());
    auto rx = listener.accept_receiver_for<Batch>(20s);
    CHILD_CHECK(rx.has_value());
    CHILD_CHECK(rx->recv_for(20s).has_value());
    ::pause();  // alive, but its link is about to go down
  });
  const std::string where = address.get();
  const pid_t sender = in_namespace(a_, [&] {
    Sender<Batch> tx = connect_sender<Batch>(where, options());
    tx.send(Batch{1, {pattern(1 << 20, 1)}});
    report.put("connected");
    (void)go.get();  // the link is down now
    const auto since = std::chrono::steady_clock::now();
    std::string outcome = "no error";
    std::string what;
    try {
      // A rendezvous send waits until the receiver took the tensor: this one waits unacknowledged.
      for (std::int64_t index = 2; std::chrono::steady_clock::now() - since < 40s; ++index) {
        const Batch batch{index, {pattern(4 << 20, 2)}};
        if (timed) {
          (void)tx.send_for(batch, 200ms);
        } else {
          tx.send(batch);
        }
      }
    } catch (const ChannelClosed& error) {
      outcome = "ChannelClosed";
      what = error.what();
    }
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - since);
    report.put(outcome + " " + std::to_string(took.count()) + " " + what);
    tx.detach();
  });
  EXPECT_EQ(report.get(), "connected");
  ASSERT_EQ(shell("ip -n " + a_ + " link set " + link_a_ + " down"), 0);
  go.put("go");
  const std::string outcome = report.get(60s);
  ASSERT_EQ(outcome.rfind("ChannelClosed", 0), 0u) << outcome;
  // The default keepalive bound (idle 1 s + 3 x 1 s), the check's own period and a margin.
  EXPECT_LT(std::stol(outcome.substr(outcome.find(' ') + 1)), 5000 + 3000) << outcome;
  // Either check may see it first: the TCP_INFO check of the sockets holding data, or the
  // keepalive ferry set on the connection's idle sockets (UCX then reports a reset).
  EXPECT_TRUE(outcome.find("acknowledged nothing") != std::string::npos ||
              outcome.find("Connection reset") != std::string::npos)
      << outcome;
  EXPECT_TRUE(test::child_succeeded(sender, 30s));
  ASSERT_EQ(::kill(server, SIGKILL), 0);
  EXPECT_EQ(wait_child(server).signal, SIGKILL);
}

TEST_F(UcxTwoHostsTest, ALinkSetDownWhileASendWaitsIsSeenInTime) { expect_a_link_set_down_seen_by_a_sender(false); }

TEST_F(UcxTwoHostsTest, ALinkSetDownWhileTimedSendsRetryIsSeenInTime) { expect_a_link_set_down_seen_by_a_sender(true); }

std::size_t count_threads() {
  std::size_t threads = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++threads;
  return threads;
}

// The fixture checks fds; UCX's own thread must be gone too once the last end is.
TEST_F(UcxEndpointTest, ThreadsAreBackToTheirStartCountAfterTheLastEnd) {
  const std::size_t threads_before = count_threads();
  {
    auto listener = listen("ucx://127.0.0.1:0", quiet_ucx_options());
    const std::string address = listener.address();
    std::optional<Receiver<Batch>> rx;
    std::thread client([&] { rx = connect_receiver<Batch>(address, quiet_ucx_options()); });
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
  auto listener = listen("ucx://127.0.0.1:0", quiet_ucx_options());
  const std::string address = listener.address();
  std::optional<Receiver<Batch>> rx;
  std::thread client([&] { rx = connect_receiver<Batch>(address, quiet_ucx_options()); });
  Sender<Batch> tx = listener.accept_sender<Batch>();
  client.join();
  // The parent owns its ends (it used them), so the child's copy is refused before UCX
  // is asked (EndOwnedElsewhere, naming fork); a fresh end would be the child's to take.
  tx.send(Batch{3, {}});
  ASSERT_EQ(rx->recv_for(5s).value().index, 3);
  const pid_t child = fork_child([&] {
    try {
      rx->recv_for(10ms);
      CHILD_CHECK(false);
    } catch (const Error& error) {
      CHILD_CHECK(std::string(error.what()).find("fork") != std::string::npos);
    }
  });
  EXPECT_TRUE(test::child_succeeded(child));
  // A listener carried across fork refuses to accept in the child, naming fork.
  const pid_t accepting = fork_child([&] {
    try {
      (void)listener.accept_sender_for<Batch>(10ms);
      CHILD_CHECK(false);
    } catch (const Error& error) {
      CHILD_CHECK(std::string(error.what()).find("fork") != std::string::npos);
    }
  });
  EXPECT_TRUE(test::child_succeeded(accepting));
  tx.send(Batch{4, {}});  // the parent's ends are untouched
  auto batch = rx->recv_for(5s);
  EXPECT_TRUE(batch.has_value() && batch->index == 4);
  rx->close();
}

}  // namespace
}  // namespace ferry
