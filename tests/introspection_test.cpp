// Introspection (ferry/introspection.hpp): snapshot() counts what the ends moved, the server
// answers on its abstract socket, only to the same user, and no client can disturb the
// process; the socket goes with the process.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ferry/detail/end_stats.hpp"
#include "ferry/ferry.hpp"
#include "ferry/introspection.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"

namespace {

// Whether ThreadSanitizer instruments this build (g++ says so with __SANITIZE_THREAD__,
// clang with __has_feature).
#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
constexpr bool kThreadSanitizer = __has_feature(thread_sanitizer);
#else
constexpr bool kThreadSanitizer = false;
#endif

using namespace std::chrono_literals;

struct Item {
  int index = 0;
  std::string text;
  template <class Archive>
  void serialize(Archive& archive) {
    archive(index, text);
  }
};

// A copy, not a pointer: callers often pass a snapshot that dies at the end of the statement.
std::optional<ferry::EndSnapshot> find_end(const ferry::Snapshot& snapshot, const std::string& label, bool sends) {
  for (const ferry::EndSnapshot& end : snapshot.ends) {
    if (end.label == label && end.sends == sends) return end;
  }
  return std::nullopt;
}

std::string introspection_name(pid_t pid) { return "ferry-introspect." + std::to_string(pid); }

// A connection to `pid`'s introspection socket; an invalid fd when there is none.
ferry::detail::UniqueFd connect_to(pid_t pid) {
  ferry::detail::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return fd;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string name = introspection_name(pid);
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0) return ferry::detail::UniqueFd();
  return fd;
}

// Reads until end of file (at most `limit`).
std::string read_all(int fd, std::chrono::milliseconds limit = 5s) {
  std::string text;
  const auto until = std::chrono::steady_clock::now() + limit;
  char buffer[4096];
  while (std::chrono::steady_clock::now() < until) {
    pollfd entry{fd, POLLIN, 0};
    if (::poll(&entry, 1, 100) <= 0) continue;
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got <= 0) break;
    text.append(buffer, static_cast<std::size_t>(got));
  }
  return text;
}

// Sends `request` to `pid`'s server and returns its whole reply.
std::string ask(pid_t pid, const std::string& request) {
  ferry::detail::UniqueFd fd = connect_to(pid);
  if (!fd) return "<no server>";
  if (::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    return "<send failed>";
  }
  return read_all(fd.get());
}

// Whether /proc/net/unix lists `@ferry-introspect.<pid>`.
bool socket_listed(pid_t pid) {
  std::ifstream table("/proc/net/unix");
  const std::string wanted = "@" + introspection_name(pid);
  std::string line;
  while (std::getline(table, line)) {
    if (line.size() >= wanted.size() && line.compare(line.size() - wanted.size(), wanted.size(), wanted) == 0) {
      return true;
    }
  }
  return false;
}

std::size_t thread_count() {
  std::size_t count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++count;
  return count;
}

// Waits (up to 2 s) until `condition` holds.
template <class Condition>
bool eventually(Condition condition) {
  const auto until = std::chrono::steady_clock::now() + 2s;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

class IntrospectionTest : public ::testing::TestWithParam<ferry::Transport> {
 protected:
  void TearDown() override { ferry::disable_introspection(); }
};

TEST_P(IntrospectionTest, SnapshotCountsWhatWasSentAndReceived) {
  constexpr int kMessages = 100;
  ferry::enable_introspection();  // the forked child inherits it
  ferry::ChannelOptions options;
  options.name = "jobs";
  auto [sender, receiver] = ferry::channel<Item>(GetParam(), options);
  const pid_t child = ferry::test::fork_child([&, &receiver = receiver] {
    std::uint64_t bytes = 0;
    for (int i = 0; i < kMessages; ++i) {
      auto item = receiver.recv();
      CHILD_CHECK(item && item->index == i);
    }
    const ferry::Snapshot mine = ferry::snapshot();
    const std::optional<ferry::EndSnapshot> end = find_end(mine, "jobs", false);
    CHILD_CHECK(end.has_value());
    CHILD_CHECK(end->messages == kMessages);
    CHILD_CHECK(end->bytes > 0);
    CHILD_CHECK(end->state == "open");
    CHILD_CHECK(end->transport == ferry::transport_name(GetParam()));
    CHILD_CHECK(!end->in_flight.has_value());  // a receiver does not know it
    bytes = end->bytes;
    CHILD_CHECK(bytes >= kMessages * sizeof(int));
  });
  receiver.close();
  for (int i = 0; i < kMessages; ++i) sender.send(Item{i, "item " + std::to_string(i)});
  const ferry::Snapshot mine = ferry::snapshot();
  const std::optional<ferry::EndSnapshot> end = find_end(mine, "jobs", true);
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->messages, static_cast<std::uint64_t>(kMessages));
  EXPECT_GT(end->bytes, static_cast<std::uint64_t>(kMessages * sizeof(int)));
  EXPECT_EQ(end->tensors, 0u);
  EXPECT_FALSE(end->in_flight.has_value());  // deliveries not tracked: not known
  EXPECT_EQ(end->transport, ferry::transport_name(GetParam()));
  EXPECT_EQ(end->state, "open");
  EXPECT_EQ(mine.pid, ::getpid());
  EXPECT_EQ(mine.role, "main");
  EXPECT_FALSE(mine.rank.has_value());
  sender.close();
  EXPECT_TRUE(ferry::test::child_succeeded(child));
  const std::optional<ferry::EndSnapshot> closed = find_end(ferry::snapshot(), "jobs", true);
  ASSERT_TRUE(closed.has_value());
  EXPECT_EQ(closed->state, "closed");
}

TEST_P(IntrospectionTest, TensorsAndNewSegmentsAreCounted) {
  ferry::enable_introspection();
  ferry::ChannelOptions options;
  options.name = "tensors";
  auto [sender, receiver] = ferry::channel<ferry::Tensor>(GetParam(), options);
  const pid_t child = ferry::test::fork_child([&, &receiver = receiver] {
    for (int i = 0; i < 3; ++i) CHILD_CHECK(receiver.recv().has_value());
    const std::optional<ferry::EndSnapshot> end = find_end(ferry::snapshot(), "tensors", false);
    CHILD_CHECK(end.has_value() && end->messages == 3 && end->tensors == 3 && end->new_segments >= 1);
  });
  receiver.close();
  for (int i = 0; i < 3; ++i) sender.send(ferry::Tensor::zeros({256}, ferry::DType::Float32));
  sender.close();
  const ferry::Snapshot mine = ferry::snapshot();
  const std::optional<ferry::EndSnapshot> end = find_end(mine, "tensors", true);
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->messages, 3u);
  EXPECT_EQ(end->tensors, 3u);
  EXPECT_GE(end->new_segments, 1u);
  EXPECT_GT(mine.shared_memory.segments, 0u);
  EXPECT_TRUE(ferry::test::child_succeeded(child));
}

TEST_P(IntrospectionTest, NothingIsCountedWhileOffAndCountsStartWhenTurnedOn) {
  ASSERT_FALSE(ferry::introspection_enabled());
  ferry::ChannelOptions options;
  options.name = "late";
  auto [sender, receiver] = ferry::channel<ferry::Tensor>(GetParam(), options);
  const ferry::Tensor tensor = ferry::Tensor::zeros({64}, ferry::DType::Float32);
  for (int i = 0; i < 5; ++i) sender.send(tensor);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(receiver.recv().has_value());
  std::optional<ferry::EndSnapshot> sent = find_end(ferry::snapshot(), "late", true);
  ASSERT_TRUE(sent.has_value());
  EXPECT_EQ(sent->messages, 0u);
  EXPECT_EQ(sent->bytes, 0u);
  EXPECT_EQ(sent->tensors, 0u);
  EXPECT_EQ(find_end(ferry::snapshot(), "late", false)->messages, 0u);

  ferry::enable_introspection();
  for (int i = 0; i < 3; ++i) sender.send(tensor);
  sent = find_end(ferry::snapshot(), "late", true);
  ASSERT_TRUE(sent.has_value());
  EXPECT_EQ(sent->messages, 3u);
  EXPECT_EQ(sent->tensors, 3u);
  EXPECT_GT(sent->bytes, 0u);
  EXPECT_FALSE(sent->in_flight.has_value());  // deliveries are not tracked
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(receiver.recv().has_value());
  EXPECT_EQ(find_end(ferry::snapshot(), "late", false)->messages, 3u);

  ferry::disable_introspection();
  sender.send(tensor);
  ASSERT_TRUE(receiver.recv().has_value());
  EXPECT_EQ(find_end(ferry::snapshot(), "late", true)->messages, 3u);
  EXPECT_EQ(find_end(ferry::snapshot(), "late", false)->messages, 3u);
}

TEST_P(IntrospectionTest, LastActivityIsWhenTheEndLastMovedAMessageToATick) {
  ferry::enable_introspection();
  ferry::ChannelOptions options;
  options.name = "ticking";
  auto [sender, receiver] = ferry::channel<Item>(GetParam(), options);
  EXPECT_EQ(find_end(ferry::snapshot(), "ticking", true)->last_activity_ns, 0);  // no message yet
  const std::int64_t before = ferry::snapshot().monotonic_ns;
  sender.send(Item{1, "one"});
  ASSERT_TRUE(receiver.recv().has_value());
  const ferry::Snapshot first = ferry::snapshot();
  const std::int64_t sent_at = find_end(first, "ticking", true)->last_activity_ns;
  EXPECT_GE(sent_at, before);
  EXPECT_LE(sent_at, first.monotonic_ns);
  EXPECT_GE(find_end(first, "ticking", false)->last_activity_ns, before);
  std::this_thread::sleep_for(3 * ferry::detail::kActivityTick);  // ticks pass over the idle end
  EXPECT_EQ(find_end(ferry::snapshot(), "ticking", true)->last_activity_ns, sent_at);
  sender.send(Item{2, "two"});
  EXPECT_GT(find_end(ferry::snapshot(), "ticking", true)->last_activity_ns, sent_at);
}

TEST_P(IntrospectionTest, InFlightIsExactWhereDeliveriesAreTracked) {
  ferry::ChannelOptions options;
  options.name = "tracked";
  auto [sender, receiver] = ferry::channel<int>(GetParam(), options);
  sender.track_delivery();
  for (int i = 0; i < 4; ++i) sender.send(i);  // before introspection: not counted
  ferry::enable_introspection();
  for (int i = 4; i < 7; ++i) sender.send(i);
  std::optional<ferry::EndSnapshot> sent = find_end(ferry::snapshot(), "tracked", true);
  ASSERT_TRUE(sent.has_value() && sent->in_flight.has_value());
  // Sequence numbers count from the stream's start, not from when introspection began.
  EXPECT_EQ(*sent->in_flight, 7u);
  EXPECT_EQ(sent->messages, 3u);
  for (int i = 0; i < 5; ++i) ASSERT_EQ(receiver.recv(), i);
  // Read off the board as the snapshot is taken: the sender need not send again.
  EXPECT_EQ(find_end(ferry::snapshot(), "tracked", true)->in_flight, std::optional<std::uint64_t>(2));
  sender.send(7);
  EXPECT_EQ(find_end(ferry::snapshot(), "tracked", true)->in_flight, std::optional<std::uint64_t>(3));  // 5, 6, 7
  EXPECT_FALSE(find_end(ferry::snapshot(), "tracked", false)->in_flight.has_value());
  // The end-of-stream frame is no message in flight.
  sender.close();
  EXPECT_EQ(find_end(ferry::snapshot(), "tracked", true)->in_flight, std::optional<std::uint64_t>(3));
  for (int i = 5; i < 8; ++i) ASSERT_EQ(receiver.recv(), i);
  EXPECT_EQ(find_end(ferry::snapshot(), "tracked", true)->in_flight, std::optional<std::uint64_t>(0));
  EXPECT_FALSE(receiver.recv().has_value());
  EXPECT_EQ(find_end(ferry::snapshot(), "tracked", true)->in_flight, std::optional<std::uint64_t>(0));
}

std::optional<std::uint64_t> in_flight_of(const std::string& label) {
  const std::optional<ferry::EndSnapshot> end = find_end(ferry::snapshot(), label, true);
  return end.has_value() ? end->in_flight : std::nullopt;
}

// Frames sent before track_delivery() carry no delivery mark: the board's word says nothing
// of them (frames with new blocks move it, others do not), and they are not in flight.
TEST_P(IntrospectionTest, InFlightCountsTheMessagesSentSinceDeliveriesWereTracked) {
  ferry::enable_introspection();
  ferry::ChannelOptions options;
  options.name = "late";
  auto [sender, receiver] = ferry::channel<int>(GetParam(), options);
  for (int i = 0; i < 3; ++i) sender.send(i);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(receiver.recv(), i);
  sender.track_delivery();
  sender.send(3);
  EXPECT_EQ(in_flight_of("late"), std::optional<std::uint64_t>(1));
  ASSERT_EQ(receiver.recv(), 3);
  EXPECT_EQ(in_flight_of("late"), std::optional<std::uint64_t>(0));

  // A tensor's frames made the board before tracking began, and moved its word.
  options.name = "late tensors";
  auto [tensors, tensors_received] = ferry::channel<ferry::Tensor>(GetParam(), options);
  const ferry::Tensor tensor = ferry::Tensor::zeros({64}, ferry::DType::Float32);
  for (int i = 0; i < 5; ++i) tensors.send(tensor);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(tensors_received.recv().has_value());
  tensors.track_delivery();
  EXPECT_EQ(in_flight_of("late tensors"), std::optional<std::uint64_t>(0));
  tensors.send(tensor);
  EXPECT_EQ(in_flight_of("late tensors"), std::optional<std::uint64_t>(1));
  ASSERT_TRUE(tensors_received.recv().has_value());
  EXPECT_EQ(in_flight_of("late tensors"), std::optional<std::uint64_t>(0));
}

// In flight is read off the connection as the snapshot is taken: no counter keeps it, so it
// is told with introspection off too (while the counters stand still).
TEST_P(IntrospectionTest, InFlightIsToldWithIntrospectionOff) {
  ferry::disable_introspection();
  ferry::ChannelOptions options;
  options.name = "unwatched";
  auto [sender, receiver] = ferry::channel<int>(GetParam(), options);
  sender.track_delivery();
  for (int i = 0; i < 2; ++i) sender.send(i);
  const std::optional<ferry::EndSnapshot> end = find_end(ferry::snapshot(), "unwatched", true);
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->in_flight, std::optional<std::uint64_t>(2));
  EXPECT_EQ(end->messages, 0u);  // counted only while introspection is on
  ASSERT_EQ(receiver.recv(), 0);
  EXPECT_EQ(in_flight_of("unwatched"), std::optional<std::uint64_t>(1));
}

// A closed end's connection lets go of its board; the end still tells what was not delivered.
TEST_P(IntrospectionTest, AClosedSenderStillTellsWhatItsReceiverHasNotTaken) {
  ferry::enable_introspection();
  ferry::ChannelOptions options;
  options.name = "closing";
  auto [sender, receiver] = ferry::channel<int>(GetParam(), options);
  sender.track_delivery();
  for (int i = 0; i < 3; ++i) sender.send(i);
  ASSERT_EQ(receiver.recv(), 0);
  sender.close();
  EXPECT_EQ(in_flight_of("closing"), std::optional<std::uint64_t>(2));
  {
    // Another connection's first storage: the process looks over its finished ledgers.
    auto [other, other_received] = ferry::channel<ferry::Tensor>(GetParam());
    other.send(ferry::Tensor::zeros({64}, ferry::DType::Float32));
    ASSERT_TRUE(other_received.recv().has_value());
  }
  EXPECT_EQ(in_flight_of("closing"), std::optional<std::uint64_t>(2));
  for (int i = 1; i < 3; ++i) ASSERT_EQ(receiver.recv(), i);
  EXPECT_FALSE(receiver.recv().has_value());
  EXPECT_EQ(in_flight_of("closing"), std::optional<std::uint64_t>(0));
}

TEST_P(IntrospectionTest, PeerPidOfAChannelPairFollowsTheProcessThatTookTheEnd) {
  ferry::ChannelOptions options;
  options.name = "pair";
  auto [sender, receiver] = ferry::channel<int>(GetParam(), options);
  auto [reply, replies] = ferry::channel<int>(GetParam());
  // Both ends here: the peer is this process.
  EXPECT_EQ(find_end(ferry::snapshot(), "pair", true)->peer_pid, std::optional<pid_t>(::getpid()));
  EXPECT_EQ(find_end(ferry::snapshot(), "pair", false)->peer_pid, std::optional<pid_t>(::getpid()));
  const pid_t parent = ::getpid();
  const pid_t child = ferry::test::fork_child([&, &receiver = receiver, &reply = reply] {
    CHILD_CHECK(receiver.recv() == std::optional<int>(1));  // takes the receiving end
    const std::optional<ferry::EndSnapshot> mine = find_end(ferry::snapshot(), "pair", false);
    CHILD_CHECK(mine.has_value() && mine->peer_pid == std::optional<pid_t>(parent));
    reply.send(2);
    CHILD_CHECK(!receiver.recv().has_value());
  });
  receiver.close();  // this process's copy only: the child took it
  sender.send(1);
  ASSERT_EQ(replies.recv(), std::optional<int>(2));
  EXPECT_EQ(find_end(ferry::snapshot(), "pair", true)->peer_pid, std::optional<pid_t>(child));
  sender.close();
  EXPECT_TRUE(ferry::test::child_succeeded(child));
}

TEST(IntrospectionPeerPid, AnEndHandedAwayLeavesItsPeerUnknown) {
  ferry::ChannelOptions options;
  options.name = "handed away";
  auto [sender, receiver] = ferry::channel<int>(ferry::Transport::UnixSocket, options);
  ASSERT_EQ(find_end(ferry::snapshot(), "handed away", true)->peer_pid, std::optional<pid_t>(::getpid()));
  // An end handed to a process that rebuilds it from its descriptors (a pickled end, an
  // exec-started worker's): this side cannot tell which process that is.
  ferry::detail::EndAccess::core(receiver).hand_away();
  EXPECT_FALSE(find_end(ferry::snapshot(), "handed away", true)->peer_pid.has_value());
}

TEST_P(IntrospectionTest, StalledReceiverShowsTheSenderBlocked) {
  ferry::enable_introspection();
  ferry::ChannelOptions options;
  options.name = "stalled";
  options.ring_capacity = 4096;
  auto [sender, receiver] = ferry::channel<std::vector<char>>(GetParam(), options);
  sender.track_delivery();  // in flight is known too
  std::thread filler([&, &sender = sender] {
    // Far more than any pipe, socket or 4 KiB ring holds: blocks until the receiver reads.
    for (int i = 0; i < 64; ++i) sender.send(std::vector<char>(64 * 1024, 'x'));
  });
  EXPECT_TRUE(eventually([] {
    const std::optional<ferry::EndSnapshot> end = find_end(ferry::snapshot(), "stalled", true);
    // Described while its send() waits, holding the end's lock (in flight counts whole
    // messages: through a 4 KiB ring, none has gone whole yet).
    return end.has_value() && end->blocked_now && end->blocked_ns > 0 && end->in_flight.has_value();
  }));
  for (int i = 0; i < 64; ++i) ASSERT_TRUE(receiver.recv().has_value());
  filler.join();
  const std::optional<ferry::EndSnapshot> end = find_end(ferry::snapshot(), "stalled", true);
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->in_flight, std::optional<std::uint64_t>(0));
  EXPECT_FALSE(end->blocked_now);
  EXPECT_GT(end->blocked_ns, 0u);
  EXPECT_GT(end->last_activity_ns, 0);
  EXPECT_LE(ferry::snapshot().monotonic_ns - end->last_activity_ns, std::int64_t{2'000'000'000});
}

TEST_P(IntrospectionTest, AnIdleSenderShowsTheReceiverBlocked) {
  ferry::enable_introspection();
  ferry::ChannelOptions options;
  options.name = "idle";
  auto [sender, receiver] = ferry::channel<int>(GetParam(), options);
  std::thread reader([&, &receiver = receiver] { EXPECT_EQ(receiver.recv(), std::optional<int>(7)); });
  EXPECT_TRUE(eventually([] {
    const std::optional<ferry::EndSnapshot> end = find_end(ferry::snapshot(), "idle", false);
    return end.has_value() && end->blocked_now;
  }));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  sender.send(7);
  reader.join();
  const std::optional<ferry::EndSnapshot> end = find_end(ferry::snapshot(), "idle", false);
  ASSERT_TRUE(end.has_value());
  EXPECT_FALSE(end->blocked_now);
  EXPECT_GE(end->blocked_ns, 20'000'000u);  // at least the 20 ms it waited for the send
  EXPECT_EQ(end->messages, 1u);
}

INSTANTIATE_TEST_SUITE_P(Transports, IntrospectionTest,
                         ::testing::Values(ferry::Transport::ShmRing, ferry::Transport::Pipe,
                                           ferry::Transport::UnixSocket),
                         [](const auto& info) { return std::string(ferry::transport_name(info.param)); });

class IntrospectionServerTest : public ::testing::Test {
 protected:
  void TearDown() override { ferry::disable_introspection(); }
};

TEST_F(IntrospectionServerTest, OffByDefaultWithoutTheEnvironmentVariable) {
  ASSERT_EQ(std::getenv("FERRY_INTROSPECT"), nullptr);
  EXPECT_FALSE(ferry::introspection_enabled());
  EXPECT_FALSE(socket_listed(::getpid()));
  EXPECT_FALSE(connect_to(::getpid()).valid());
}

// Run in a process started with FERRY_INTROSPECT=1 (the next test); skipped otherwise.
TEST(IntrospectionEnvironmentChild, OnFromTheStart) {
  if (std::getenv("FERRY_INTROSPECTION_TEST_CHILD") == nullptr) GTEST_SKIP() << "run by EnvironmentVariableTurnsItOn";
  EXPECT_TRUE(ferry::introspection_enabled());
  EXPECT_TRUE(socket_listed(::getpid()));
  EXPECT_EQ(ask(::getpid(), "snapshot\n").rfind("{\"version\":1,", 0), 0u);
}

TEST_F(IntrospectionServerTest, EnvironmentVariableTurnsItOn) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char filter[] = "--gtest_filter=IntrospectionEnvironmentChild.OnFromTheStart";
    char program[] = "introspection_test";
    char* argv[] = {program, filter, nullptr};
    char on[] = "FERRY_INTROSPECT=1";
    char marker[] = "FERRY_INTROSPECTION_TEST_CHILD=1";
    char* envp[] = {on, marker, nullptr};
    ::execve("/proc/self/exe", argv, envp);
    ::_exit(127);
  }
  EXPECT_TRUE(ferry::test::child_succeeded(child));
}

TEST_F(IntrospectionServerTest, AnswersASnapshotOverItsSocket) {
  ferry::ChannelOptions options;
  options.name = "over \"the\" socket";
  auto [sender, receiver] = ferry::channel<int>(ferry::Transport::ShmRing, options);
  ferry::enable_introspection();
  for (int i = 0; i < 5; ++i) sender.send(i);
  EXPECT_TRUE(ferry::introspection_enabled());
  EXPECT_TRUE(socket_listed(::getpid()));
  const std::string reply = ask(::getpid(), "snapshot\n");
  ASSERT_FALSE(reply.empty());
  EXPECT_EQ(reply.back(), '\n');
  EXPECT_EQ(reply.find('\n'), reply.size() - 1) << "one line";
  EXPECT_EQ(reply.rfind("{\"version\":1,\"pid\":" + std::to_string(::getpid()) + ",", 0), 0u) << reply;
  EXPECT_NE(reply.find("\"label\":\"over \\\"the\\\" socket\",\"transport\":\"shm_ring\""), std::string::npos) << reply;
  EXPECT_NE(reply.find("\"direction\":\"send\""), std::string::npos);
  EXPECT_NE(reply.find("\"messages\":5,"), std::string::npos) << reply;
  EXPECT_NE(reply.find("\"role\":\"main\",\"rank\":null"), std::string::npos);
  EXPECT_NE(reply.find("\"shared_memory\":{\"segments\":"), std::string::npos);
  EXPECT_EQ(ask(::getpid(), "garbage\n").rfind("{\"error\":", 0), 0u);
  EXPECT_EQ(ferry::to_json(ferry::snapshot()).rfind("{\"version\":1,", 0), 0u);
}

TEST_F(IntrospectionServerTest, AKilledProcessLeavesNoSocket) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ferry::enable_introspection();
    const char byte = 1;
    if (::write(ready[1], &byte, 1) != 1) ::_exit(1);
    while (true) ::pause();
  }
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  EXPECT_TRUE(socket_listed(child));
  EXPECT_EQ(ask(child, "snapshot\n").rfind("{\"version\":1,\"pid\":" + std::to_string(child), 0), 0u);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_FALSE(socket_listed(child));
  EXPECT_FALSE(connect_to(child).valid());
}

TEST_F(IntrospectionServerTest, HostileClientsDoNotDisturbARunningChannel) {
  ferry::enable_introspection();
  constexpr int kMessages = 20000;
  auto [sender, receiver] = ferry::channel<int>(ferry::Transport::ShmRing);
  const pid_t child = ferry::test::fork_child([&, &receiver = receiver] {
    for (int i = 0; i < kMessages; ++i) {
      auto value = receiver.recv();
      CHILD_CHECK(value && *value == i);
    }
  });
  receiver.close();
  // One that sends garbage without a newline, one that floods, one that asks and never
  // reads, then silent ones (more than the server serves at once: the last are closed).
  ferry::detail::UniqueFd garbage = connect_to(::getpid());
  ASSERT_TRUE(garbage.valid());
  const std::string junk(100, '\x7f');
  ASSERT_EQ(::send(garbage.get(), junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
  ferry::detail::UniqueFd flood = connect_to(::getpid());
  ASSERT_TRUE(flood.valid());
  const std::string lots(64 * 1024, 'a');
  (void)::send(flood.get(), lots.data(), lots.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ferry::detail::UniqueFd deaf = connect_to(::getpid());
  ASSERT_TRUE(deaf.valid());
  const int small = 1;
  ASSERT_EQ(::setsockopt(deaf.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
  ASSERT_EQ(::send(deaf.get(), "snapshot\n", 9, MSG_NOSIGNAL), 9);
  std::vector<ferry::detail::UniqueFd> silent;
  for (int i = 0; i < 12; ++i) silent.push_back(connect_to(::getpid()));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kMessages; ++i) sender.send(i);
  sender.close();
  EXPECT_TRUE(ferry::test::child_succeeded(child, 20s));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s);
  // Once the silent ones are dropped (1 s), the server answers again.
  std::this_thread::sleep_for(1200ms);
  EXPECT_EQ(ask(::getpid(), "snapshot\n").rfind("{\"version\":1,", 0), 0u);
  EXPECT_GT(ferry::snapshot().introspection.dropped, 0u);
}

TEST_F(IntrospectionServerTest, AnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: a child must drop to another uid (65534)";
  ferry::enable_introspection();
  const std::uint64_t before = ferry::snapshot().introspection.refused_other_user;
  const pid_t parent = ::getpid();
  const pid_t child = ferry::test::fork_child([parent] {
    CHILD_CHECK(::setgid(65534) == 0 && ::setuid(65534) == 0);
    ferry::detail::UniqueFd fd = connect_to(parent);  // the abstract socket admits anyone to connect
    CHILD_CHECK(fd.valid());
    CHILD_CHECK(::send(fd.get(), "snapshot\n", 9, MSG_NOSIGNAL) == 9 || errno == EPIPE || errno == ECONNRESET);
    CHILD_CHECK(read_all(fd.get()).empty());  // closed without a word
  });
  EXPECT_TRUE(ferry::test::child_succeeded(child));
  EXPECT_EQ(ferry::snapshot().introspection.refused_other_user, before + 1);
}

TEST_F(IntrospectionServerTest, EnableAndDisableLeaveNoDescriptorOrThread) {
  // One round first: a sanitizer's runtime may start a thread of its own with the first
  // thread this process starts, and that one stays.
  ferry::enable_introspection();
  ferry::disable_introspection();
  EXPECT_TRUE(eventually([] { return !socket_listed(::getpid()); }));
  const std::size_t fds = ferry::test::count_open_fds();
  const std::size_t threads = thread_count();
  for (int round = 0; round < 3; ++round) {
    ferry::enable_introspection();
    ferry::enable_introspection();  // idempotent
    EXPECT_EQ(thread_count(), threads + 1);
    EXPECT_EQ(ask(::getpid(), "snapshot\n").rfind("{\"version\":1,", 0), 0u);
    ferry::detail::UniqueFd silent = connect_to(::getpid());
    ferry::disable_introspection();
    EXPECT_FALSE(ferry::introspection_enabled());
  }
  EXPECT_TRUE(eventually([&] { return thread_count() == threads; }));
  EXPECT_EQ(ferry::test::count_open_fds(), fds);
  EXPECT_FALSE(socket_listed(::getpid()));
}

TEST_F(IntrospectionServerTest, ForkedWorkersAreListedAndServeTheirOwn) {
  if (kThreadSanitizer) {
    GTEST_SKIP() << "TSan cannot start a thread in a child forked from a multi-threaded process "
                    "(die_after_fork), and a forked worker restarts its introspection server";
  }
  ferry::enable_introspection();
  ferry::ChannelOptions options;
  options.name = "to worker";
  auto [sender, receiver] = ferry::channel<int>(ferry::Transport::ShmRing, options);
  auto [report, reported] = ferry::channel<int>(ferry::Transport::Pipe);
  ferry::WorkerGroup workers = ferry::spawn(
      1,
      [](ferry::WorkerContext& context, ferry::Receiver<int> in, ferry::Sender<int> out) {
        const ferry::Snapshot mine = ferry::snapshot();
        const bool ok = mine.role == "worker" && mine.rank == context.rank() && ferry::introspection_enabled() &&
                        socket_listed(::getpid());
        out.send(ok ? 1 : 0);
        while (in.recv()) {
        }
      },
      std::move(receiver), std::move(report));
  EXPECT_EQ(reported.recv(), std::optional<int>(1));
  ferry::Snapshot running = ferry::snapshot();
  ASSERT_EQ(running.workers.size(), 1u);
  EXPECT_EQ(running.workers[0].rank, 0);
  EXPECT_EQ(running.workers[0].pid, workers.pid(0));
  EXPECT_EQ(running.workers[0].state, "running");
  sender.close();
  workers.join();
  const ferry::Snapshot done = ferry::snapshot();
  ASSERT_EQ(done.workers.size(), 1u);
  EXPECT_EQ(done.workers[0].state, "exited");
  EXPECT_EQ(done.workers[0].exit_code, std::optional<int>(0));
}

// Reports whether this exec-started worker knows itself and serves introspection.
void report_introspection(ferry::WorkerContext& context, ferry::Sender<int> out) {
  const ferry::Snapshot mine = ferry::snapshot();
  const bool ok = mine.role == "worker" && mine.rank == context.rank() && ferry::introspection_enabled() &&
                  socket_listed(::getpid());
  out.send(ok ? 1 : 0);
}
FERRY_WORKER(report_introspection);

TEST_F(IntrospectionServerTest, ExecWorkersGetItFromTheirParent) {
  ASSERT_EQ(std::getenv("FERRY_INTROSPECT"), nullptr);
  ferry::enable_introspection();
  auto [report, reported] = ferry::channel<int>(ferry::Transport::Pipe);
  ferry::SpawnOptions options;
  options.start_method = ferry::StartMethod::Spawn;
  ferry::WorkerGroup workers = ferry::spawn(options, 1, report_introspection, std::move(report));
  EXPECT_EQ(reported.recv(), std::optional<int>(1));
  workers.join();
  EXPECT_EQ(std::getenv("FERRY_INTROSPECT"), nullptr) << "this process's environment stays as it was";
}

TEST_F(IntrospectionServerTest, ListenersAndFanoutsAreListed) {
  const std::string address = "unix:@ferry-introspection-test." + std::to_string(::getpid());
  ferry::Listener listener = ferry::listen(address);
  ferry::EndpointOptions quick;
  quick.connect_timeout = 5s;
  bool refused = false;
  std::optional<ferry::Receiver<int>> client;
  std::thread clients([&] {
    try {
      ferry::connect_sender<int>(address, quick);  // a kind the listener does not serve
    } catch (const ferry::Error&) {
      refused = true;
    }
    client = ferry::connect_receiver<int>(address, quick);
  });
  std::optional<ferry::Sender<int>> accepted = listener.accept_sender_for<int>(10s);
  clients.join();
  EXPECT_TRUE(refused);
  ASSERT_TRUE(accepted.has_value());
  bool found = false;
  for (const ferry::ListenerSnapshot& entry : ferry::snapshot().listeners) {
    if (entry.address != address) continue;
    found = true;
    EXPECT_EQ(entry.accepted, 1u);
    EXPECT_EQ(entry.refused.count("type_mismatch"), 1u);
  }
  EXPECT_TRUE(found);
  // Both ends of the connection know their peer from the handshake (here: this process).
  int with_peer = 0;
  for (const ferry::EndSnapshot& end : ferry::snapshot().ends) {
    if (end.peer_pid == ::getpid() && end.state == "open") ++with_peer;
  }
  EXPECT_EQ(with_peer, 2);
  ferry::FanoutOptions labelled;
  labelled.name = "workers";
  ferry::Distributor<int> distributor(labelled);
  auto [a, a_out] = ferry::channel<int>(ferry::Transport::Pipe);
  auto [b, b_out] = ferry::channel<int>(ferry::Transport::Pipe);
  distributor.add(std::move(a));
  distributor.add(std::move(b));
  distributor.send(7);
  const ferry::Snapshot mine = ferry::snapshot();
  ASSERT_EQ(mine.fanouts.size(), 1u);
  EXPECT_EQ(mine.fanouts[0].kind, "distributor");
  EXPECT_EQ(mine.fanouts[0].label, "workers");
  ASSERT_EQ(mine.fanouts[0].consumers.size(), 2u);
  EXPECT_EQ(mine.fanouts[0].consumers[0].sent + mine.fanouts[0].consumers[1].sent, 1u);
  EXPECT_NE(ferry::to_json(mine).find(R"("kind":"distributor","label":"workers")"), std::string::npos);
}

TEST(IntrospectionInProcess, InProcessChannelsAreListedWithTheirQueuesCounts) {
  ferry::ChannelOptions options;
  options.name = "local";
  const std::size_t ends_before = ferry::snapshot().ends.size();
  {
    auto [sender, receiver] = ferry::channel<std::string>(ferry::Transport::InProcess, options);
    for (int i = 0; i < 3; ++i) sender.send("value " + std::to_string(i));
    ASSERT_EQ(receiver.recv(), std::optional<std::string>("value 0"));
    const ferry::Snapshot mine = ferry::snapshot();
    EXPECT_EQ(mine.ends.size(), ends_before + 2);
    const std::optional<ferry::EndSnapshot> sent = find_end(mine, "local", true);
    const std::optional<ferry::EndSnapshot> received = find_end(mine, "local", false);
    ASSERT_TRUE(sent.has_value() && received.has_value());
    EXPECT_EQ(sent->transport, "in_process");
    EXPECT_EQ(sent->messages, 3u);
    EXPECT_EQ(sent->in_flight, std::optional<std::uint64_t>(2));
    EXPECT_EQ(sent->peer_pid, std::optional<pid_t>(::getpid()));
    EXPECT_EQ(sent->state, "open");
    EXPECT_NE(sent->id, received->id);
    EXPECT_EQ(received->messages, 1u);
    EXPECT_FALSE(received->in_flight.has_value());
    EXPECT_NE(ferry::to_json(mine).find(R"("label":"local","transport":"in_process")"), std::string::npos);
    sender.close();
    EXPECT_EQ(find_end(ferry::snapshot(), "local", true)->state, "closed");
    EXPECT_EQ(find_end(ferry::snapshot(), "local", false)->state, "open");
  }
  EXPECT_EQ(ferry::snapshot().ends.size(), ends_before);  // gone with the queue
}

}  // namespace
