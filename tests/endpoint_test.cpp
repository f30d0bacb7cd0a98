// Endpoints by address: listen() and connect_*() between unrelated processes (neither
// the other's ancestor) over UnixSocket and ShmRing: tensors both ways, every refusal
// (type, direction, version, transport, user), socket files, abstract names, many and
// hostile clients, a listener that dies, fd exhaustion, Selector, and no leaks.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <fstream>
#include <iterator>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "endpoints/handshake.hpp"
#include "ferry/detail/frame_channel.hpp"
#include "ferry/detail/peer_fd.hpp"
#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/transports.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::UnrelatedProcess;

struct Batch {
  std::int64_t step = 0;
  Tensor images;
  std::vector<Tensor> views;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(step, images, views);
  }
};
struct Stats {
  std::string name;
  double value = 0;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(name, value);
  }
};

// An address unique to this process and test.
std::string abstract_address(const std::string& tag) {
  return "unix:@ferry-endpoint-test-" + std::to_string(::getpid()) + "-" + tag;
}
std::string path_for(const std::string& tag) {
  return (std::filesystem::temp_directory_path() /
          ("ferry-endpoint-" + std::to_string(::getpid()) + "-" + tag + ".sock"))
      .string();
}

EndpointOptions options_for(Transport transport) {
  EndpointOptions options;
  options.transport = transport;
  options.on_refusal = [](const std::string&) {};
  return options;
}

// Collects the listener's refusal reports.
struct Refusals {
  std::mutex mutex;
  std::vector<std::string> lines;
  void attach(EndpointOptions& options) {
    options.on_refusal = [this](const std::string& line) {
      std::lock_guard lock(mutex);
      lines.push_back(line);
    };
  }
  std::string all() {
    std::lock_guard lock(mutex);
    std::string text;
    for (const auto& line : lines) text += line + "\n";
    return text;
  }
  std::size_t size() {
    std::lock_guard lock(mutex);
    return lines.size();
  }
};

Tensor counting(std::int64_t n, int seed) {
  Tensor t = Tensor::empty({n}, DType::Int32, Device::SharedCpu);
  for (std::int64_t i = 0; i < n; ++i) t.at<std::int32_t>({i}) = static_cast<std::int32_t>(i * 3 + seed);
  return t;
}

bool counts(const Tensor& t, std::int64_t n, int seed, std::int64_t offset = 0) {
  if (t.numel() != n) return false;
  for (std::int64_t i = 0; i < n; ++i) {
    if (t.at<std::int32_t>({i}) != static_cast<std::int32_t>((i + offset) * 3 + seed)) return false;
  }
  return true;
}

class EndpointTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {};

INSTANTIATE_TEST_SUITE_P(Transports, EndpointTest, ::testing::Values(Transport::UnixSocket, Transport::ShmRing),
                         test::transport_test_name);

TEST_P(EndpointTest, TensorsTravelBothWaysBetweenUnrelatedProcesses) {
  const std::string address = abstract_address("tensors");
  const EndpointOptions options = options_for(GetParam());
  const pid_t test_pid = ::getpid();
  UnrelatedProcess client([&] {
    CHILD_CHECK(::getppid() != test_pid);
    auto from_loader = connect_receiver<Batch>(address, options);
    auto to_loader = connect_duplex<Batch, int>(address, options);
    auto batch = from_loader.recv();
    CHILD_CHECK(batch.has_value() && batch->step == 7);
    CHILD_CHECK(counts(batch->images, 1000, 1));
    CHILD_CHECK(batch->views.size() == 2);
    CHILD_CHECK(counts(batch->views[0], 100, 1, 10));
    CHILD_CHECK(batch->views[0].shares_storage_with(batch->images));
    CHILD_CHECK(batch->views[1].shares_storage_with(batch->images));
    // Written here, seen by the loader: the same pages, no copy.
    batch->images.at<std::int32_t>({999}) = -5;
    Tensor mine = counting(500, 4);
    to_loader.send(Batch{8, mine, {mine.slice(0, 100, 200)}});
    CHILD_CHECK(to_loader.recv().value() == 1);
    CHILD_CHECK(mine.at<std::int32_t>({0}) == 77);  // the loader wrote into our tensor
    CHILD_CHECK(!from_loader.recv().has_value());
    to_loader.close();
  });
  Listener listener = listen(address, options);
  listener.serve_duplex<int, Batch>();
  Sender<Batch> to_client = listener.accept_sender<Batch>();
  DuplexEnd<int, Batch> from_client = listener.accept_duplex<int, Batch>();
  Tensor images = counting(1000, 1);
  to_client.send(Batch{7, images, {images.slice(0, 10, 110), images.slice(0, 500, 600)}});
  auto back = from_client.recv();
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->step, 8);
  EXPECT_TRUE(counts(back->images, 500, 4));
  ASSERT_EQ(back->views.size(), 1u);
  EXPECT_TRUE(back->views[0].shares_storage_with(back->images));
  EXPECT_TRUE(counts(back->views[0], 100, 4, 100));
  back->images.at<std::int32_t>({0}) = 77;
  EXPECT_EQ(images.at<std::int32_t>({999}), -5);  // the client's write, in our pages
  from_client.send(1);
  to_client.close();
  EXPECT_FALSE(from_client.recv().has_value());
  EXPECT_TRUE(client.succeeded());
}

// Descriptors this process has taken from peers by pid (pidfd_getfd or /proc).
std::uint64_t fds_taken_by_pid() {
  return detail::PeerFdOpener::taken_count(detail::PeerFdOpener::Method::PidfdGetfd) +
         detail::PeerFdOpener::taken_count(detail::PeerFdOpener::Method::ProcPath);
}

TEST_P(EndpointTest, SegmentsTravelAsDescriptorsNeverByProcEvenFromANonDumpablePeer) {
  const std::string address = abstract_address("no-proc");
  const EndpointOptions options = options_for(GetParam());
  UnrelatedProcess client([&] {
    // Peers may not take this process's fds (as for a daemon that dropped privileges).
    CHILD_CHECK(::prctl(PR_SET_DUMPABLE, 0) == 0);
    const std::uint64_t taken_before = fds_taken_by_pid();
    auto end = connect_duplex<Batch, Batch>(address, options);
    for (int round = 0; round < 3; ++round) {
      auto batch = end.recv();
      CHILD_CHECK(batch.has_value() && counts(batch->images, 4096, round));
      Tensor fresh = counting(2048, round + 10);       // a new segment each round
      end.send(Batch{round, fresh, {batch->images}});  // and the loader's own tensor back
    }
    CHILD_CHECK(fds_taken_by_pid() == taken_before);
  });
  Listener listener = listen(address, options);
  DuplexEnd<Batch, Batch> end = listener.accept_duplex<Batch, Batch>();
  const std::uint64_t taken_before = fds_taken_by_pid();
  for (int round = 0; round < 3; ++round) {
    Tensor images = counting(4096, round);
    end.send(Batch{round, images, {}});
    auto back = end.recv();
    ASSERT_TRUE(back.has_value());
    EXPECT_TRUE(counts(back->images, 2048, round + 10));
    ASSERT_EQ(back->views.size(), 1u);
    EXPECT_TRUE(back->views[0].shares_storage_with(images));  // our pages came back as ours
  }
  EXPECT_EQ(fds_taken_by_pid(), taken_before);
  end.close();
  EXPECT_TRUE(client.succeeded());
}

TEST_P(EndpointTest, ConnectWaitsForAListenerStartedLater) {
  const std::string address = abstract_address("later");
  const EndpointOptions options = options_for(GetParam());
  UnrelatedProcess client([&] {
    auto rx = connect_receiver<int>(address, options);  // before the listener exists
    CHILD_CHECK(rx.recv().value() == 42);
  });
  std::this_thread::sleep_for(20ms);  // the client's first attempts find nobody
  Listener listener = listen(address, options);
  Sender<int> tx = listener.accept_sender<int>();
  tx.send(42);
  tx.close();
  EXPECT_TRUE(client.succeeded());
}

TEST_P(EndpointTest, KilledListenerIsPeerDiedAtTheClientsNextOperation) {
  const std::string address = abstract_address("killed");
  const EndpointOptions options = options_for(GetParam());
  UnrelatedProcess server([&] {
    Listener listener = listen(address, options);
    Sender<int> tx = listener.accept_sender<int>();
    Receiver<int> rx = listener.accept_receiver<int>();
    tx.send(1);
    std::this_thread::sleep_for(30s);  // killed here
  });
  Receiver<int> rx = connect_receiver<int>(address, options);
  Sender<int> tx = connect_sender<int>(address, options);
  EXPECT_EQ(rx.recv().value(), 1);
  server.kill();
  EXPECT_THROW(rx.recv(), PeerDied);
  // A sender learns it at its next send (at once on a socket, within peer_check_interval
  // on a ring); it is ChannelClosed, as for a channel() end whose receiver died.
  const auto until = std::chrono::steady_clock::now() + 5s;
  bool refused = false;
  while (!refused && std::chrono::steady_clock::now() < until) {
    try {
      tx.send(2);
      std::this_thread::sleep_for(1ms);
    } catch (const ChannelClosed&) {
      refused = true;
    }
  }
  EXPECT_TRUE(refused);
}

TEST_P(EndpointTest, TypeAndDirectionMismatchesAreRefusedOnBothSidesAndTheListenerGoesOn) {
  const std::string address = abstract_address("types");
  EndpointOptions options = options_for(GetParam());
  Refusals refusals;
  refusals.attach(options);
  UnrelatedProcess clients([&] {
    EndpointOptions client_options = options_for(GetParam());
    client_options.connect_timeout = 5s;
    try {
      (void)connect_receiver<Stats>(address, client_options);
      CHILD_CHECK(false);
    } catch (const TypeMismatch& error) {
      const std::string what = error.what();
      CHILD_CHECK(what.find("connects as Receiver<") != std::string::npos);
      CHILD_CHECK(what.find("Stats>") != std::string::npos);
      CHILD_CHECK(what.find("serves Receiver<") != std::string::npos);
      CHILD_CHECK(what.find("Batch>") != std::string::npos);
    }
    try {
      (void)connect_sender<Batch>(address, client_options);  // the right type, the wrong direction
      CHILD_CHECK(false);
    } catch (const TypeMismatch& error) {
      CHILD_CHECK(std::string(error.what()).find("Sender<") != std::string::npos);
    }
    auto rx = connect_receiver<Batch>(address, client_options);
    CHILD_CHECK(rx.recv().value().step == 3);
  });
  Listener listener = listen(address, options);
  std::optional<Sender<Batch>> tx = listener.accept_sender_for<Batch>(10s);
  ASSERT_TRUE(tx.has_value());
  tx->send(Batch{3, Tensor(), {}});
  tx->close();
  EXPECT_TRUE(clients.succeeded());
  EXPECT_EQ(refusals.size(), 2u) << refusals.all();
  EXPECT_NE(refusals.all().find("Stats"), std::string::npos);
}

TEST_P(EndpointTest, ShmRingAndUnixSocketClientsRefuseEachOther) {
  const std::string address = abstract_address("transport");
  EndpointOptions options = options_for(GetParam());
  Refusals refusals;
  refusals.attach(options);
  const Transport other = GetParam() == Transport::ShmRing ? Transport::UnixSocket : Transport::ShmRing;
  UnrelatedProcess client([&] {
    try {
      (void)connect_receiver<int>(address, options_for(other));
      CHILD_CHECK(false);
    } catch (const TypeMismatch&) {
      CHILD_CHECK(false);
    } catch (const Error& error) {
      CHILD_CHECK(std::string(error.what()).find("transport") != std::string::npos);
    }
    CHILD_CHECK(connect_receiver<int>(address, options_for(GetParam())).recv().value() == 5);
  });
  Listener listener = listen(address, options);
  Sender<int> tx = listener.accept_sender<int>();
  tx.send(5);
  tx.close();
  EXPECT_TRUE(client.succeeded());
  EXPECT_EQ(refusals.size(), 1u);
}

// ---- hostile clients, many clients ------------------------------------------------------

// A raw connection to an abstract address.
detail::UniqueFd raw_connect(const std::string& address) {
  detail::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un where{};
  where.sun_family = AF_UNIX;
  const std::string name = address.substr(std::string("unix:@").size());
  std::memcpy(where.sun_path + 1, name.data(), name.size());
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&where), length) != 0) throw_errno("connect");
  return fd;
}

class EndpointHostileTest : public test::LeakCheckedTest {};

TEST_F(EndpointHostileTest, SilentGarbageAndKilledClientsDelayNoOne) {
  const std::string address = abstract_address("hostile");
  EndpointOptions options = options_for(Transport::UnixSocket);
  options.handshake_timeout = 20s;  // longer than the good client may take
  Refusals refusals;
  refusals.attach(options);
  Listener listener = listen(address, options);
  detail::UniqueFd silent = raw_connect(address);
  detail::UniqueFd garbage = raw_connect(address);
  const char junk[] = "GET / HTTP/1.1\r\n\r\n";
  ASSERT_EQ(::send(garbage.get(), junk, sizeof junk, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof junk));
  UnrelatedProcess half_hello([&] {
    listener.close();
    detail::UniqueFd fd = raw_connect(address);
    const std::vector<std::byte> hello = detail::encode_hello(detail::Hello{
        detail::kEndpointWireVersion, detail::client_receiver_kind<int>(), Transport::UnixSocket, FrameLimits{}});
    CHILD_CHECK(::send(fd.get(), hello.data(), 20, MSG_NOSIGNAL) == 20);
    std::this_thread::sleep_for(30s);  // killed mid-handshake
  });
  UnrelatedProcess good([&] {
    listener.close();
    CHILD_CHECK(connect_receiver<int>(address, options_for(Transport::UnixSocket)).recv().value() == 9);
  });
  const auto started = std::chrono::steady_clock::now();
  std::optional<Sender<int>> tx = listener.accept_sender_for<int>(10s);
  ASSERT_TRUE(tx.has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - started, 10s);
  tx->send(9);
  tx->close();
  EXPECT_TRUE(good.succeeded());
  half_hello.kill();
  // The garbage client was refused at once, the killed one dropped once its socket closed.
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (refusals.size() < 2 && std::chrono::steady_clock::now() < until) (void)listener.accept_sender_for<int>(10ms);
  EXPECT_EQ(refusals.size(), 2u) << refusals.all();
  EXPECT_NE(refusals.all().find("does not speak"), std::string::npos) << refusals.all();
  EXPECT_NE(refusals.all().find("closed the connection during its handshake"), std::string::npos) << refusals.all();
  EXPECT_EQ(detail::EndAccess::core(listener).pending_count(), 1u);  // the silent one, until its deadline
  // The garbage client got a refusal it can read.
  std::vector<detail::UniqueFd> fds;
  const auto reply = detail::receive_message(garbage.get(), detail::kMaxReplyBytes, fds, detail::Deadline::after(5s));
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(detail::decode_reply(*reply).status, detail::ReplyStatus::Malformed);
}

// stderr of this process, captured into a file while it lives.
class CapturedStderr {
 public:
  CapturedStderr() : saved_(::dup(STDERR_FILENO)), file_(::memfd_create("stderr", MFD_CLOEXEC)) {
    if (!saved_ || !file_ || ::dup2(file_.get(), STDERR_FILENO) < 0) throw_errno("capturing stderr");
  }
  ~CapturedStderr() { ::dup2(saved_.get(), STDERR_FILENO); }
  std::vector<std::string> lines() const {
    std::string text(static_cast<std::size_t>(::lseek(file_.get(), 0, SEEK_END)), '\0');
    if (::pread(file_.get(), text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) throw_errno("pread");
    std::vector<std::string> out;
    for (std::size_t at = 0, end; (end = text.find('\n', at)) != std::string::npos; at = end + 1) {
      out.push_back(text.substr(at, end - at));
    }
    return out;
  }

 private:
  detail::UniqueFd saved_;
  detail::UniqueFd file_;
};

TEST_F(EndpointHostileTest, RefusalsOnStderrAreRateLimited) {
  const std::string address = abstract_address("log");
  EndpointOptions options;  // no on_refusal: the default log on stderr
  Listener listener = listen(address, options);
  CapturedStderr captured;
  const char junk[] = "GET / HTTP/1.1\r\n\r\n";
  auto refuse_garbage = [&](int clients) {
    std::vector<detail::UniqueFd> garbage;
    for (int i = 0; i < clients; ++i) {
      garbage.push_back(raw_connect(address));
      ASSERT_EQ(::send(garbage.back().get(), junk, sizeof junk, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof junk));
    }
    while (detail::EndAccess::core(listener).pending_count() > 0 || listener.accept_sender_for<int>(50ms)) {
    }
    for (const detail::UniqueFd& fd : garbage) {  // every one was refused (with a reply), logged or not
      std::vector<detail::UniqueFd> fds;
      EXPECT_TRUE(
          detail::receive_message(fd.get(), detail::kMaxReplyBytes, fds, detail::Deadline::after(5s)).has_value());
    }
  };
  refuse_garbage(200);
  const std::size_t burst = captured.lines().size();
  EXPECT_GE(burst, 10u);
  EXPECT_LE(burst, 12u) << "200 refusals at once; the log writes 10 lines, then one a second";
  std::this_thread::sleep_for(1100ms);
  refuse_garbage(1);
  const std::vector<std::string> lines = captured.lines();
  ASSERT_EQ(lines.size(), burst + 1);
  EXPECT_NE(lines.back().find("more refusals not shown"), std::string::npos) << lines.back();
  EXPECT_NE(lines.back().find("does not speak"), std::string::npos) << lines.back();
}

TEST_F(EndpointHostileTest, SilentClientIsDroppedAtItsDeadline) {
  const std::string address = abstract_address("silent");
  EndpointOptions options = options_for(Transport::UnixSocket);
  options.handshake_timeout = 50ms;
  Refusals refusals;
  refusals.attach(options);
  Listener listener = listen(address, options);
  detail::UniqueFd silent = raw_connect(address);
  EXPECT_FALSE(listener.accept_sender_for<int>(200ms).has_value());
  EXPECT_EQ(detail::EndAccess::core(listener).pending_count(), 0u);
  EXPECT_NE(refusals.all().find("handshake_timeout"), std::string::npos) << refusals.all();
  char byte = 0;
  std::vector<detail::UniqueFd> fds;
  // Refused with a reply, then closed.
  EXPECT_TRUE(
      detail::receive_message(silent.get(), detail::kMaxReplyBytes, fds, detail::Deadline::after(1s)).has_value());
  EXPECT_EQ(::recv(silent.get(), &byte, 1, 0), 0);
}

TEST_F(EndpointHostileTest, VersionMismatchNamesBothVersionsOnBothSides) {
  const std::string address = abstract_address("version");
  EndpointOptions options = options_for(Transport::UnixSocket);
  Refusals refusals;
  refusals.attach(options);
  Listener listener = listen(address, options);
  // A client of another version: the listener's refusal names both.
  detail::UniqueFd client = raw_connect(address);
  std::vector<std::byte> hello = detail::encode_hello(detail::Hello{
      detail::kEndpointWireVersion, detail::client_receiver_kind<int>(), Transport::UnixSocket, FrameLimits{}});
  const std::uint32_t future = 99;
  std::memcpy(hello.data() + 8, &future, sizeof future);
  ASSERT_EQ(::send(client.get(), hello.data(), hello.size(), MSG_NOSIGNAL), static_cast<ssize_t>(hello.size()));
  EXPECT_FALSE(listener.accept_sender_for<int>(100ms).has_value());
  std::vector<detail::UniqueFd> fds;
  const auto reply = detail::receive_message(client.get(), detail::kMaxReplyBytes, fds, detail::Deadline::after(5s));
  ASSERT_TRUE(reply.has_value());
  const detail::Reply decoded = detail::decode_reply(*reply);
  EXPECT_EQ(decoded.status, detail::ReplyStatus::VersionMismatch);
  EXPECT_NE(decoded.message.find("version 99"), std::string::npos) << decoded.message;
  EXPECT_NE(decoded.message.find("version 1"), std::string::npos) << decoded.message;
  EXPECT_EQ(refusals.size(), 1u);
  listener.close();

  // A listener of another version: the client's error names both.
  const std::string fake = abstract_address("version-fake");
  std::thread fake_listener;
  {
    detail::UniqueFd socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un where{};
    where.sun_family = AF_UNIX;
    const std::string name = fake.substr(6);
    std::memcpy(where.sun_path + 1, name.data(), name.size());
    const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    ASSERT_EQ(::bind(socket.get(), reinterpret_cast<const sockaddr*>(&where), length), 0);
    ASSERT_EQ(::listen(socket.get(), 1), 0);
    fake_listener = std::thread([socket = std::move(socket)] {
      detail::UniqueFd connection(::accept(socket.get(), nullptr, nullptr));
      std::vector<detail::UniqueFd> ignored;
      (void)detail::receive_message(connection.get(), detail::kMaxHelloBytes, ignored, detail::Deadline::after(5s));
      std::vector<std::byte> answer = detail::encode_reply(detail::Reply{});
      const std::uint32_t other = 99;
      std::memcpy(answer.data() + 8, &other, sizeof other);
      (void)::send(connection.get(), answer.data(), answer.size(), MSG_NOSIGNAL);
    });
  }
  try {
    (void)connect_receiver<int>(fake, options_for(Transport::UnixSocket));
    ADD_FAILURE() << "connected to a listener of another version";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("version 99, this client version 1"), std::string::npos) << error.what();
  }
  fake_listener.join();
}

TEST_P(EndpointTest, ServesManyClientsAtOnce) {
  constexpr int kClients = 256;
  const std::string address = abstract_address("many");
  EndpointOptions options = options_for(GetParam());
  // More clients of a kind than max_waiting_connections wait for their accept: the rest
  // are told Unavailable and ask again, until connect_timeout; and a handshake progresses
  // only while the listener pumps. Under a sanitizer at -j2 the listener may need longer
  // than the defaults (10 s, 5 s) to reach them all: the test is about many clients, not time.
  options.connect_timeout = std::chrono::seconds(60);
  options.handshake_timeout = std::chrono::seconds(60);
  UnrelatedProcess clients([&] {
    std::vector<std::thread> threads;
    std::atomic<int> good{0};
    for (int i = 0; i < kClients; ++i) {
      threads.emplace_back([&] {
        try {
          auto rx = connect_receiver<int>(address, options);
          const auto first = rx.recv();
          auto tx = connect_sender<int>(address, options);
          if (first) tx.send(*first + 1);
          tx.close();
          if (first && !rx.recv().has_value()) ++good;
        } catch (const std::exception& error) {
          std::fprintf(stderr, "client: %s\n", error.what());
        }
      });
    }
    for (auto& thread : threads) thread.join();
    CHILD_CHECK(good == kClients);
  });
  Listener listener = listen(address, options);
  listener.serve_receiver<int>();
  std::vector<Sender<int>> senders;
  for (int i = 0; i < kClients; ++i) {
    senders.push_back(listener.accept_sender<int>());
    senders.back().send(i * 10);
  }
  std::vector<int> answers;
  for (int i = 0; i < kClients; ++i) {
    Receiver<int> rx = listener.accept_receiver<int>();
    answers.push_back(rx.recv().value());
  }
  for (auto& tx : senders) tx.close();
  std::sort(answers.begin(), answers.end());
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(answers[static_cast<std::size_t>(i)], i * 10 + 1);
  EXPECT_TRUE(clients.succeeded(60s));
}

// ---- addresses ------------------------------------------------------------------------

class EndpointAddressTest : public test::LeakCheckedTest {};

TEST_F(EndpointAddressTest, SocketFileIsOwnerOnlyAndRemovedOnClose) {
  const std::string path = path_for("file");
  {
    Listener listener = listen("unix:" + path);
    EXPECT_EQ(listener.address(), "unix:" + path);
    struct stat status {};
    ASSERT_EQ(::stat(path.c_str(), &status), 0);
    EXPECT_TRUE(S_ISSOCK(status.st_mode));
    EXPECT_EQ(status.st_mode & 0777, 0600u);
    EXPECT_THROW(listen("unix:" + path), AddressInUse);  // a live listener is never stolen
    EXPECT_TRUE(std::filesystem::exists(path));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST_F(EndpointAddressTest, StaleSocketFileOfAKilledListenerIsReplaced) {
  const std::string path = path_for("stale");
  UnrelatedProcess killed([&] {
    Listener listener = listen("unix:" + path);
    std::this_thread::sleep_for(30s);
  });
  while (!std::filesystem::exists(path)) std::this_thread::sleep_for(1ms);
  killed.kill();
  ASSERT_TRUE(std::filesystem::exists(path));  // left behind by SIGKILL
  Listener listener = listen("unix:" + path);
  UnrelatedProcess client([&] {
    listener.close();
    CHILD_CHECK(connect_receiver<int>("unix:" + path).recv().value() == 3);
  });
  Sender<int> tx = listener.accept_sender<int>();
  tx.send(3);
  tx.close();
  EXPECT_TRUE(client.succeeded());
  listener.close();
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST_F(EndpointAddressTest, AFileThatIsNotASocketIsNeverReplaced) {
  const std::string path = path_for("regular");
  {
    std::FILE* file = std::fopen(path.c_str(), "w");
    ASSERT_NE(file, nullptr);
    std::fclose(file);
  }
  try {
    (void)listen("unix:" + path);
    ADD_FAILURE() << "listened over a regular file";
  } catch (const AddressInUse& error) {
    EXPECT_NE(std::string(error.what()).find("not a socket"), std::string::npos);
  }
  EXPECT_TRUE(std::filesystem::exists(path));
  std::filesystem::remove(path);
}

// A pipe whose write end an unrelated process writes one byte to when it is ready.
struct ReadySignal {
  detail::UniqueFd read_end;
  detail::UniqueFd write_end;
  ReadySignal() {
    int ends[2];
    if (::pipe2(ends, O_CLOEXEC) != 0) throw_errno("pipe2");
    read_end.reset(ends[0]);
    write_end.reset(ends[1]);
  }
  void tell() const { (void)!::write(write_end.get(), "r", 1); }
  bool wait() {
    write_end.reset();
    char byte = 0;
    return ::read(read_end.get(), &byte, 1) == 1;
  }
};

// Pins this process to `cpu`, at the lowest priority (SCHED_IDLE) when `idle`.
void pin_to(int cpu, bool idle) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  CHILD_CHECK(::sched_setaffinity(0, sizeof set, &set) == 0);
  if (idle) {
    const sched_param none{};
    CHILD_CHECK(::sched_setscheduler(0, SCHED_IDLE, &none) == 0);
  }
}

TEST_F(EndpointAddressTest, ASymlinkSwappedInForTheSocketFileIsNeverFollowed) {
  // An attacker who can write to the directory watches it (inotify) and, the moment the
  // socket file appears, renames a symlink to a file of the listener's user over it. Both
  // run on one CPU, the listener at the lowest priority, so the attacker runs between any
  // two of the listener's system calls. A chmod of the path would make the file 0666.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ferry-endpoint-" + std::to_string(::getpid()) + "-symlink");
  std::filesystem::create_directory(dir);
  const std::string socket = (dir / "sock").string();
  const std::string victim = (dir / "victim").string();
  { std::ofstream(victim) << "secret"; }
  ASSERT_EQ(::chmod(victim.c_str(), 0600), 0);
  cpu_set_t allowed;
  ASSERT_EQ(::sched_getaffinity(0, sizeof allowed, &allowed), 0);
  int cpu = 0;
  while (!CPU_ISSET(cpu, &allowed)) ++cpu;
  ReadySignal watching;
  UnrelatedProcess attacker([&] {
    pin_to(cpu, false);
    const detail::UniqueFd events(::inotify_init1(IN_CLOEXEC));
    CHILD_CHECK(events && ::inotify_add_watch(events.get(), dir.c_str(), IN_CREATE) >= 0);
    const std::string link = (dir / "link").string();
    watching.tell();
    alignas(inotify_event) char buffer[4096];
    while (true) {
      (void)::symlink(victim.c_str(), link.c_str());
      const ssize_t got = ::read(events.get(), buffer, sizeof buffer);
      CHILD_CHECK(got > 0);
      for (ssize_t at = 0; at < got;) {
        const auto* event = reinterpret_cast<const inotify_event*>(buffer + at);
        if (event->len > 0 && std::string_view(event->name) == "sock") (void)::rename(link.c_str(), socket.c_str());
        at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      }
    }
  });
  ASSERT_TRUE(watching.wait());
  UnrelatedProcess listener([&] {
    pin_to(cpu, true);
    EndpointOptions options = options_for(Transport::UnixSocket);
    options.allowed_peers.uids = {::geteuid(), 65534};  // and nobody: mode 0666
    const auto until = std::chrono::steady_clock::now() + 3s;
    for (int round = 0; round < 300 && std::chrono::steady_clock::now() < until; ++round) {
      try {
        listen("unix:" + socket, options).close();
      } catch (const Error&) {
        // The attacker's symlink holds the name (AddressInUse): take it away and go on.
      }
      std::error_code ignored;
      std::filesystem::remove(socket, ignored);
    }
  });
  EXPECT_TRUE(listener.succeeded(60s));
  attacker.kill();
  struct stat status {};
  ASSERT_EQ(::stat(victim.c_str(), &status), 0);
  EXPECT_EQ(status.st_mode & 0777, 0600u) << "the listener changed the mode of a file a symlink pointed to";
  // Nothing else is left behind (no scratch directory).
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    EXPECT_TRUE(name == "victim" || name == "link" || name == "sock") << name;
  }
  std::filesystem::remove_all(dir);
}

TEST_F(EndpointAddressTest, AbstractNameLeavesNothingOnDiskAndIsFreeAfterSigkill) {
  const std::string address = abstract_address("abstract");
  const std::string name = address.substr(std::string("unix:@").size());
  ReadySignal ready;
  UnrelatedProcess holder([&] {
    Listener listener = listen(address);
    ready.tell();
    std::this_thread::sleep_for(30s);
  });
  ASSERT_TRUE(ready.wait());
  EXPECT_THROW(listen(address), AddressInUse);
  EXPECT_FALSE(std::filesystem::exists(name));
  EXPECT_FALSE(std::filesystem::exists("@" + name));
  holder.kill();
  Listener listener = listen(address);  // the kernel released the name with the process
  EXPECT_TRUE(listener.is_open());
}

TEST_F(EndpointAddressTest, MalformedAddressesAndUnknownSchemesNameTheAcceptedForms) {
  for (const std::string address : {"loader", "unix:", ":x", "tcp://host:1", "unix:@"}) {
    try {
      (void)listen(address);
      ADD_FAILURE() << address;
    } catch (const Error& error) {
      const std::string what = error.what();
      EXPECT_NE(what.find(address), std::string::npos) << what;
      EXPECT_NE(what.find("unix:@NAME"), std::string::npos) << what;
    }
  }
  EndpointOptions quick;
  quick.connect_timeout = 1ms;
  EXPECT_THROW((void)connect_receiver<int>("ucx://host:7000", quick), Error);
  try {
    (void)connect_receiver<int>(abstract_address("nobody-listens"), quick);
    ADD_FAILURE();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("no listener"), std::string::npos) << error.what();
  }
}

// ferry_tests does not link ferry::ucx: a ucx:// address is an Error that names it and says
// how to get ucx:// support, at listen and at connect, and no UCX library is loaded.
TEST_F(EndpointAddressTest, AUcxAddressWithoutFerryUcxSaysHowToGetIt) {
  EndpointOptions quick;
  quick.connect_timeout = 1ms;
  const std::string address = "ucx://127.0.0.1:7000";
  const auto check = [&](const Error& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find(address), std::string::npos) << what;
    EXPECT_NE(what.find("-DFERRY_WITH_UCX=ON"), std::string::npos) << what;
    EXPECT_NE(what.find("scripts/install-deps"), std::string::npos) << what;
    EXPECT_NE(what.find("ferry::ucx"), std::string::npos) << what;
  };
  try {
    (void)listen(address, quick);
    ADD_FAILURE() << "listened at a ucx:// address without ferry::ucx";
  } catch (const Error& error) {
    check(error);
  }
  try {
    (void)connect_receiver<int>(address, quick);
    ADD_FAILURE() << "connected to a ucx:// address without ferry::ucx";
  } catch (const Error& error) {
    check(error);
  }
  std::ifstream maps("/proc/self/maps");
  const std::string mapped((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
  EXPECT_EQ(mapped.find("libucp"), std::string::npos) << "UCX is loaded in a program that does not use it";
}

// ---- access ---------------------------------------------------------------------------

class EndpointAccessTest : public test::LeakCheckedTest {};

constexpr uid_t kNobodyUid = 65534;

TEST_F(EndpointAccessTest, AUserThatIsNotAllowedIsRefusedAndTheListenerGoesOn) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another user (nobody)";
  const std::string address = abstract_address("uid");
  EndpointOptions options = options_for(Transport::UnixSocket);
  Refusals refusals;
  refusals.attach(options);
  Listener listener = listen(address, options);
  const pid_t child = test::fork_child([&] {
    listener.close();
    if (::setgid(kNobodyUid) != 0 || ::setuid(kNobodyUid) != 0) throw std::runtime_error("cannot become nobody");
    EndpointOptions client = options_for(Transport::UnixSocket);
    try {
      (void)connect_receiver<int>(address, client);  // by default it admits only its own user
      CHILD_CHECK(false);
    } catch (const UntrustedPeer& error) {
      CHILD_CHECK(std::string(error.what()).find("runs as user 0") != std::string::npos);
    }
    client.allowed_peers.uids = {0};  // it trusts root's listener; the listener refuses it
    try {
      (void)connect_receiver<int>(address, client);
      CHILD_CHECK(false);
    } catch (const UntrustedPeer& error) {
      const std::string message = error.what();
      CHILD_CHECK(message.find("allowed_peers") != std::string::npos);
      // It is not told whom the listener admits.
      CHILD_CHECK(message.find("admits") == std::string::npos);
      CHILD_CHECK(message.find("user 0") == std::string::npos);
    }
  });
  EXPECT_FALSE(listener.accept_sender_for<int>(300ms).has_value());
  EXPECT_TRUE(test::child_succeeded(child));
  // Both connections: the first one the client dropped itself (it does not trust root).
  EXPECT_EQ(refusals.size(), 2u) << refusals.all();
  EXPECT_NE(refusals.all().find("65534"), std::string::npos);
  // Still listening, for an allowed client.
  UnrelatedProcess allowed([&] {
    listener.close();
    CHILD_CHECK(connect_receiver<int>(address).recv().value() == 1);
  });
  Sender<int> tx = listener.accept_sender<int>();
  tx.send(1);
  tx.close();
  EXPECT_TRUE(allowed.succeeded());
}

TEST_F(EndpointAccessTest, AllowedPeersAdmitAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another user (nobody)";
  const std::string address = abstract_address("uid-allowed");
  EndpointOptions options = options_for(Transport::UnixSocket);
  options.allowed_peers.uids = {0, kNobodyUid};
  Listener listener = listen(address, options);
  const pid_t child = test::fork_child([&] {
    listener.close();
    if (::setgid(kNobodyUid) != 0 || ::setuid(kNobodyUid) != 0) throw std::runtime_error("cannot become nobody");
    EndpointOptions client = options_for(Transport::UnixSocket);
    client.allowed_peers.uids = {0};
    CHILD_CHECK(connect_receiver<std::string>(address, client).recv().value() == "hello nobody");
  });
  Sender<std::string> tx = listener.accept_sender<std::string>();
  tx.send("hello nobody");
  tx.close();
  EXPECT_TRUE(test::child_succeeded(child));
}

// ---- descriptors run out, Selector ---------------------------------------------------------

TEST_F(EndpointHostileTest, OutOfDescriptorsTheListenerRefusesWithItsReserveAndLives) {
  const std::string address = abstract_address("emfile");
  EndpointOptions options = options_for(Transport::UnixSocket);
  Refusals refusals;
  refusals.attach(options);
  Listener listener = listen(address, options);
  UnrelatedProcess client([&] {
    listener.close();
    EndpointOptions patient = options_for(Transport::UnixSocket);
    patient.connect_timeout = 20s;  // refused while the listener has no descriptor: it asks again
    CHILD_CHECK(connect_receiver<int>(address, patient).recv().value() == 4);
  });
  rlimit original{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &original), 0);
  rlimit tight = original;
  tight.rlim_cur = test::count_open_fds() + 0;  // the next descriptor is over the limit
  std::vector<detail::UniqueFd> fillers;
  // Fill every number below the limit (holes left by closed fds included).
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  while (true) {
    detail::UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!fd) break;
    fillers.push_back(std::move(fd));
  }
  // No exception: the listener takes the client off its backlog with the descriptor it
  // keeps in reserve, tells it, and reports it.
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (refusals.all().find("out of file descriptors") == std::string::npos &&
         std::chrono::steady_clock::now() < until) {
    EXPECT_FALSE(listener.accept_sender_for<int>(50ms).has_value());
  }
  fillers.clear();
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &original), 0);
  EXPECT_NE(refusals.all().find("out of file descriptors"), std::string::npos) << refusals.all();
  EXPECT_NE(refusals.all().find("RLIMIT_NOFILE"), std::string::npos) << refusals.all();
  std::optional<Sender<int>> tx = listener.accept_sender_for<int>(10s);
  ASSERT_TRUE(tx.has_value());
  tx->send(4);
  tx->close();
  EXPECT_TRUE(client.succeeded());
}

// ---- a flood of silent clients -------------------------------------------------------------

// A connection that sends nothing, or an empty fd when the listener's backlog is full.
detail::UniqueFd silent_connection(const std::string& address) {
  detail::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_un where{};
  where.sun_family = AF_UNIX;
  const std::string name = address.substr(std::string("unix:@").size());
  std::memcpy(where.sun_path + 1, name.data(), name.size());
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&where), length) != 0) return detail::UniqueFd();
  return fd;
}

// The listener's open-file limit: below max_pending_handshakes' default (descriptors run
// out first) and above it (the cap holds first).
class EndpointFloodTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<rlim_t> {};

INSTANTIATE_TEST_SUITE_P(OpenFileLimits, EndpointFloodTest, ::testing::Values(rlim_t{48}, rlim_t{512}));

TEST_P(EndpointFloodTest, ASilentFloodHeldThenClosedLeavesTheListenerServingWithinASecond) {
  const rlim_t limit = GetParam();
  const std::string address = abstract_address("flood-" + std::to_string(limit));
  ReadySignal ready;
  UnrelatedProcess server([&] {
    rlimit low{};
    CHILD_CHECK(::getrlimit(RLIMIT_NOFILE, &low) == 0);
    CHILD_CHECK(static_cast<rlim_t>(test::count_open_fds()) + 16 < limit);
    low.rlim_cur = limit;
    CHILD_CHECK(::setrlimit(RLIMIT_NOFILE, &low) == 0);
    Listener listener = listen(address, options_for(Transport::UnixSocket));
    ready.tell();
    while (true) {  // a server's accept loop; it goes on after any error
      try {
        if (std::optional<Sender<int>> tx = listener.accept_sender_for<int>(100ms)) tx->send(5);
      } catch (const Error&) {
      }
    }
  });
  ASSERT_TRUE(ready.wait());
  std::vector<detail::UniqueFd> flood;
  for (int i = 0; i < 2000; ++i) {
    if (detail::UniqueFd fd = silent_connection(address)) flood.push_back(std::move(fd));
  }
  EXPECT_GT(flood.size(), static_cast<std::size_t>(limit)) << "the flood must exceed the listener's descriptors";
  std::this_thread::sleep_for(1500ms);  // held (less than the listener's handshake_timeout)
  flood.clear();
  const auto ended = std::chrono::steady_clock::now();
  EndpointOptions client = options_for(Transport::UnixSocket);
  client.connect_timeout = 5s;
  try {
    EXPECT_EQ(connect_receiver<int>(address, client).recv().value(), 5);
  } catch (const Error& error) {
    ADD_FAILURE() << "a good client after the flood: " << error.what();
  }
  const auto took = std::chrono::steady_clock::now() - ended;
  EXPECT_LT(took, 1s) << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  // And the next one too: nothing of the flood is left in the way.
  try {
    EXPECT_EQ(connect_receiver<int>(address, client).recv().value(), 5);
  } catch (const Error& error) {
    ADD_FAILURE() << "a second good client: " << error.what();
  }
  server.kill();
}

TEST_P(EndpointTest, SelectorWaitsOnAListenerAndReceiversTogether) {
  const std::string address = abstract_address("selector");
  const EndpointOptions options = options_for(GetParam());
  Listener listener = listen(address, options);
  listener.serve_receiver<Stats>();
  auto [local_tx, local_rx] = channel<int>(GetParam());
  Selector selector;
  const std::size_t listener_index = selector.add(listener);
  const std::size_t local_index = selector.add(local_rx);
  EXPECT_FALSE(selector.wait_for(0ms).has_value());
  local_tx.send(1);
  EXPECT_EQ(selector.wait_for(5s), std::optional<std::size_t>(local_index));
  EXPECT_EQ(local_rx.recv().value(), 1);
  UnrelatedProcess client([&] {
    listener.close();
    auto tx = connect_sender<Stats>(address, options);
    tx.send(Stats{"loss", 0.5});
    tx.close();
  });
  std::optional<Receiver<Stats>> stats;
  while (!stats) {
    const auto ready = selector.wait_for(10s);
    ASSERT_EQ(ready, std::optional<std::size_t>(listener_index));
    stats = listener.accept_receiver_for<Stats>(0ms);
  }
  const std::size_t stats_index = selector.add(*stats);
  EXPECT_EQ(selector.wait_for(5s), std::optional<std::size_t>(stats_index));
  EXPECT_EQ(stats->recv().value().name, "loss");
  EXPECT_TRUE(client.succeeded());
}

}  // namespace
}  // namespace ferry
