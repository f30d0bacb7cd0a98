// Duplex connections (ferry/duplex.hpp): requests and replies between two processes over
// one connection, each direction ending on its own, over every inter-process transport.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "ferry/detail/frame_channel.hpp"
#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/transports.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::fork_child;
using test::wait_child;

struct Request {
  std::int64_t id = 0;
  Tensor data;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(id, data);
  }
};

struct Reply {
  std::int64_t id = 0;
  double sum = 0;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(id, sum);
  }
};

Tensor filled(std::int64_t count, float value) {
  Tensor tensor = Tensor::empty({count}, DType::Float32, Device::SharedCpu);
  tensor.fill(value);
  return tensor;
}

double sum_of(const Tensor& tensor) {
  double sum = 0;
  for (std::int64_t i = 0; i < tensor.numel(); ++i) sum += tensor.at<float>({i});
  return sum;
}

// Serves requests until the client closes its sending half: doubles each tensor in place
// (the client sees it: zero copy) and replies with the sum it saw.
void serve(DuplexEnd<Reply, Request>& end) {
  while (auto request = end.recv()) {
    const double sum = sum_of(request->data);
    for (std::int64_t i = 0; i < request->data.numel(); ++i) request->data.at<float>({i}) *= 2;
    end.send(Reply{request->id, sum});
  }
  end.close();
}

void serve_worker(WorkerContext&, DuplexEnd<Reply, Request> end) { serve(end); }
FERRY_WORKER(serve_worker);

// Serves each end in turn, until its client closes its sending half.
void serve_each_worker(WorkerContext&, std::vector<DuplexEnd<Reply, Request>> ends) {
  for (auto& end : ends) serve(end);
}
FERRY_WORKER(serve_each_worker);

class DuplexTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<Transport> {};

// Over one socketpair, where each side's halves share a socket. (Pipe and ShmRing name a
// closed sender's storages by /proc path, readable only within its close linger.)
class DuplexSocketTest : public test::LeakCheckedTest {};

INSTANTIATE_TEST_SUITE_P(Transports, DuplexTest, ::testing::ValuesIn(test::interprocess_transports()),
                         test::transport_test_name);

// The client's half of serve(): three calls, each checked, then the end of its requests.
void call_three_times(DuplexEnd<Request, Reply>& client) {
  for (std::int64_t id = 1; id <= 3; ++id) {
    Tensor data = filled(64, static_cast<float>(id));
    auto reply = client.call(Request{id, data});
    ASSERT_TRUE(reply.has_value());
    EXPECT_EQ(reply->id, id);
    EXPECT_DOUBLE_EQ(reply->sum, 64.0 * static_cast<double>(id));
    EXPECT_FLOAT_EQ(data.at<float>({63}), 2.0f * static_cast<float>(id)) << "the server wrote into the same memory";
  }
  client.sender.close();
  EXPECT_FALSE(client.recv().has_value()) << "the server closes after the last request";
}

TEST_P(DuplexTest, RequestsAndRepliesCrossProcesses) {
  auto [client, server] = duplex<Request, Reply>(GetParam());
  const pid_t child = fork_child([&, &client = client, &server = server] {
    client.detach();
    server.adopt();
    serve(server);
  });
  server.detach();
  call_three_times(client);
  EXPECT_TRUE(test::child_succeeded(child));
}

TEST_P(DuplexTest, UnixSocketDirectionsShareOneSocket) {
  auto [a, b] = duplex<int, int>(GetParam());
  const bool one_socket = GetParam() == Transport::UnixSocket;
  EXPECT_EQ(detail::EndAccess::core(a.sender).writer().capabilities().shares_connection, one_socket);
  EXPECT_EQ(detail::EndAccess::core(b.receiver).reader().capabilities().shares_connection, one_socket);
  if (one_socket) {
    struct stat sender_socket {};
    struct stat receiver_socket {};
    ASSERT_EQ(::fstat(detail::EndAccess::core(a.sender).writer().descriptors().at(0), &sender_socket), 0);
    ASSERT_EQ(::fstat(detail::EndAccess::core(a.receiver).reader().descriptors().at(0), &receiver_socket), 0);
    EXPECT_EQ(sender_socket.st_ino, receiver_socket.st_ino) << "one socket carries both directions of a side";
  }
  a.send(1);
  b.send(2);
  EXPECT_EQ(b.recv().value(), 1);
  EXPECT_EQ(a.recv().value(), 2);
}

TEST_P(DuplexTest, CallForGivesUpOnALateReplyWhichTheNextRecvReturns) {
  auto [client, server] = duplex<int, int>(GetParam());
  auto [go_tx, go_rx] = channel<int>(GetParam());
  const pid_t child = fork_child([&, &client = client, &server = server, &go_tx = go_tx, &go_rx = go_rx] {
    client.detach();
    go_tx.detach();
    server.adopt();
    // Replies to request 2 only once told to: the client's call_for(2) runs out first.
    while (auto request = server.recv()) {
      if (*request == 2) CHILD_CHECK(go_rx.recv().has_value());
      server.send(*request + 100);
    }
    server.close();
  });
  server.detach();
  go_rx.close();
  const RecvResult<int> first = client.call_for(1, 10s);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, 101);
  const auto start = std::chrono::steady_clock::now();
  const RecvResult<int> late = client.call_for(2, 30ms);
  EXPECT_FALSE(late.has_value());
  EXPECT_TRUE(late.timed_out());
  EXPECT_GE(std::chrono::steady_clock::now() - start, 30ms);
  go_tx.send(1);
  // The late reply is not dropped: it is the next value, ahead of the next call's reply.
  EXPECT_EQ(client.recv().value(), 102);
  EXPECT_EQ(client.call_for(3, 10s).value(), 103);
  client.sender.close();
  const RecvResult<int> after_close = client.receiver.recv_for(10s);
  EXPECT_TRUE(after_close.closed()) << "the server closes after the last request";
  EXPECT_TRUE(test::child_succeeded(child));
  go_tx.close();
}

TEST_P(DuplexTest, ClosingTheSendingHalfEndsOnlyThatDirection) {
  auto [a, b] = duplex<int, std::string>(GetParam());
  const pid_t child = fork_child([&, &a = a, &b = b] {
    a.detach();
    b.adopt();
    CHILD_CHECK(b.recv().value() == 7);
    CHILD_CHECK(!b.recv().has_value());  // the parent's sending half is closed
    for (int i = 0; i < 3; ++i) b.send("reply " + std::to_string(i));
    b.close();
  });
  b.detach();
  a.send(7);
  a.sender.close();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.recv().value(), "reply " + std::to_string(i));
  EXPECT_FALSE(a.recv().has_value());
  EXPECT_TRUE(test::child_succeeded(child));
}

TEST_P(DuplexTest, ClosingTheReceivingHalfMakesThePeersSendsFail) {
  auto [a, b] = duplex<int, int>(GetParam());
  auto [go_tx, go_rx] = channel<int>(Transport::Pipe);
  const pid_t child = fork_child([&, &a = a, &b = b, &go_tx = go_tx, &go_rx = go_rx] {
    a.detach();
    b.adopt();
    go_tx.detach();
    b.receiver.close();  // will not read any more, but keeps its sending half open
    b.send(1);
    CHILD_CHECK(go_rx.recv().has_value());
    b.sender.close();
  });
  b.detach();
  go_rx.close();
  EXPECT_EQ(a.recv().value(), 1);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(
      {
        for (int i = 0;; ++i) a.send(i);  // never blocks for ever on a direction nobody reads
      },
      ChannelClosed);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  go_tx.send(1);
  EXPECT_FALSE(a.recv().has_value()) << "the other direction still ends cleanly";
  EXPECT_TRUE(test::child_succeeded(child));
}

// The owner's destructor ends a receiving half as close() does (a forked copy's does not:
// ACopyDestroyedInAForkedChildEndsNothing).
TEST_P(DuplexTest, TheOwnersDestructorOfAReceivingHalfMakesThePeersSendsFail) {
  auto [a, b] = duplex<int, int>(GetParam());
  auto [go_tx, go_rx] = channel<int>(Transport::Pipe);
  const pid_t child = fork_child([&, &a = a, &b = b, &go_tx = go_tx, &go_rx = go_rx] {
    a.detach();
    b.adopt();
    go_tx.detach();
    { Receiver<int> gone = std::move(b.receiver); }  // destroyed by its owner, never closed
    b.send(1);
    CHILD_CHECK(go_rx.recv().has_value());
    b.sender.close();
  });
  b.detach();
  go_rx.close();
  EXPECT_EQ(a.recv().value(), 1);
  EXPECT_THROW(
      {
        for (int i = 0;; ++i) a.send(i);
      },
      ChannelClosed);
  go_tx.send(1);
  EXPECT_FALSE(a.recv().has_value());
  EXPECT_TRUE(test::child_succeeded(child));
}

TEST_P(DuplexTest, PeerKilledIsPeerDiedForTheReceiverAndChannelClosedForTheSender) {
  auto [a, b] = duplex<std::vector<std::uint8_t>, int>(GetParam());
  const pid_t child = fork_child([&, &a = a, &b = b] {
    a.detach();
    b.adopt();
    b.send(1);
    ::pause();
  });
  b.detach();
  EXPECT_EQ(a.recv().value(), 1);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  EXPECT_THROW(a.recv(), PeerDied);
  const std::vector<std::uint8_t> chunk(64 * 1024, 5);
  EXPECT_THROW(
      {
        for (int i = 0; i < 1000; ++i) a.send(chunk);
      },
      ChannelClosed);
  EXPECT_EQ(wait_child(child).signal, SIGKILL);
}

TEST_P(DuplexTest, SendingHalfDestroyedByAnExceptionIsPeerDiedWhileTheReceivingHalfLives) {
  auto [a, b] = duplex<int, int>(GetParam());
  auto [done_tx, done_rx] = channel<int>(Transport::Pipe);
  const pid_t child = fork_child([&, &a = a, &b = b, &done_tx = done_tx, &done_rx = done_rx] {
    a.detach();
    b.adopt();
    done_tx.detach();
    try {
      Sender<int> stage = std::move(b.sender);
      stage.send(1);
      throw std::runtime_error("the stage failed");
    } catch (const std::runtime_error&) {
    }
    (void)done_rx.recv();  // b.receiver stays open meanwhile
  });
  b.detach();
  done_rx.close();
  EXPECT_EQ(a.recv().value(), 1);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(a.recv(), PeerDied) << "a failed stage is not a clean end of stream";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  done_tx.close();
  EXPECT_TRUE(test::child_succeeded(child));
}

// A sending half dropped by an exception ends its direction as a failure (PeerDied), but
// what it sent before stays readable: the sender's allocator looking for memory to take
// back does not take the request the receiver has yet to read.
TEST_F(DuplexSocketTest, ARequestSentBeforeTheSendingHalfFailsIsStillRead) {
  auto [a, b] = duplex<Request, int>(Transport::UnixSocket);
  auto [go_tx, go_rx] = channel<int>(Transport::Pipe);
  auto [done_tx, done_rx] = channel<int>(Transport::Pipe);
  const pid_t child =
      fork_child([&, &a = a, &b = b, &go_tx = go_tx, &go_rx = go_rx, &done_tx = done_tx, &done_rx = done_rx] {
        b.detach();
        a.adopt();
        go_rx.detach();
        done_tx.detach();
        SharedAllocator pool;
        try {
          Sender<Request> stage = std::move(a.sender);
          Tensor data = Tensor::zeros({1024}, DType::Float32, pool);
          data.fill(1.0f);
          stage.send(Request{1, data});
          throw std::runtime_error("the stage failed");
        } catch (const std::runtime_error&) {
        }
        pool.trim();  // takes back what no reader can resolve any more
        CHILD_CHECK(pool.stats().blocks_in_use == 1);
        Tensor other = Tensor::zeros({1024}, DType::Float32, pool);
        other.fill(9.0f);  // would overwrite the request's memory had it been taken back
        go_tx.send(1);
        (void)done_rx.recv();  // a.receiver stays open meanwhile
      });
  a.detach();
  go_tx.detach();
  done_rx.close();
  bool child_checked = false;
  try {
    child_checked = go_rx.recv().has_value();
  } catch (const PeerDied&) {  // the child failed a check: its status says which
  }
  if (child_checked) {
    auto request = b.recv();
    EXPECT_TRUE(request.has_value() && request->id == 1);
    if (request) {
      EXPECT_DOUBLE_EQ(sum_of(request->data), 1024.0);
    }
    EXPECT_THROW(b.recv(), PeerDied);
  }
  done_tx.close();
  EXPECT_TRUE(test::child_succeeded(child));
}

TEST_P(DuplexTest, ACopyDestroyedInAForkedChildEndsNothing) {
  auto [a, b] = duplex<int, int>(GetParam());
  const pid_t child = fork_child([&, &a = a, &b = b] {
    // The child owns neither end: destroying its copies lets go of its descriptors only.
    { auto gone = std::move(a); }
    { auto gone = std::move(b); }
  });
  EXPECT_TRUE(test::child_succeeded(child));
  a.send(1);
  b.send(2);
  EXPECT_EQ(b.recv().value(), 1);
  EXPECT_EQ(a.recv().value(), 2);
  a.close();
  EXPECT_FALSE(b.recv().has_value());
}

// A receiving half shut down while its process keeps the connection open for sending:
// frames it never read are reclaimed by the sender (its liveness probe sees the shut-down
// direction), without waiting for that process to exit.
TEST_P(DuplexTest, FramesNeverReadByAShutDownReceiverAreReclaimed) {
  SharedAllocator pool;
  ChannelOptions options;
  options.close_linger = 20ms;
  auto [a, b] = duplex<Request, int>(GetParam(), options);
  auto [go_tx, go_rx] = channel<int>(Transport::Pipe);
  const pid_t child = fork_child([&, &a = a, &b = b, &go_tx = go_tx, &go_rx = go_rx] {
    a.detach();
    b.adopt();
    go_tx.detach();
    CHILD_CHECK(go_rx.recv().has_value());
    b.receiver.close();  // never read the parent's request
    b.send(1);
    ::pause();
  });
  b.detach();
  go_rx.close();
  Tensor data = Tensor::zeros({1024}, DType::Float32, pool);
  a.send(Request{1, data});
  data = Tensor();
  a.sender.close();  // the request stays pinned: the child might still read it
  EXPECT_EQ(pool.stats().blocks_in_use, 1u);
  go_tx.send(1);
  EXPECT_EQ(a.recv().value(), 1);  // the child has shut its receiving half down
  pool.trim();
  EXPECT_EQ(pool.stats().blocks_in_use, 0u) << "the child is alive, but nobody can read the request any more";
  ::kill(child, SIGKILL);
  EXPECT_EQ(wait_child(child).signal, SIGKILL);
}

// A request sent just before the client closes its end (one half or both) stays pinned
// until the server reads it: closing ends the client's direction but is not the server's
// reader going away, even when the client's allocator looks for memory to take back.
void request_then_close_then_reclaim(bool close_both_halves) {
  SharedAllocator pool;
  auto [a, b] = duplex<Request, int>(Transport::UnixSocket);
  auto [go_tx, go_rx] = channel<int>(Transport::Pipe);
  const pid_t child = fork_child([&, &a = a, &b = b, &go_tx = go_tx, &go_rx = go_rx] {
    a.detach();
    b.adopt();
    go_tx.detach();
    CHILD_CHECK(go_rx.recv().has_value());
    auto request = b.recv();
    CHILD_CHECK(request.has_value() && request->id == 1);
    CHILD_CHECK(sum_of(request->data) == 1024.0);
    CHILD_CHECK(!b.recv().has_value());
    b.close();
  });
  b.detach();
  go_rx.close();
  Tensor data = Tensor::zeros({1024}, DType::Float32, pool);
  data.fill(1.0f);
  a.send(Request{1, data});
  data = Tensor();
  if (close_both_halves) {
    a.close();
  } else {
    a.sender.close();
  }
  pool.trim();  // takes back what no reader can resolve any more
  EXPECT_EQ(pool.stats().blocks_in_use, 1u) << "the server has not read the request yet";
  Tensor other = Tensor::zeros({1024}, DType::Float32, pool);
  other.fill(9.0f);  // would overwrite the request's memory had it been taken back
  go_tx.send(1);
  EXPECT_TRUE(test::child_succeeded(child)) << "the server read the request sent before the close";
}

TEST_F(DuplexSocketTest, ARequestSentBeforeTheSendingHalfClosesIsStillRead) { request_then_close_then_reclaim(false); }

TEST_F(DuplexSocketTest, ARequestSentBeforeBothHalvesCloseIsStillRead) { request_then_close_then_reclaim(true); }

// ---- spawn -----------------------------------------------------------------------------

class DuplexSpawnTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<StartMethod> {
 protected:
  SpawnOptions options() const {
    SpawnOptions result;
    result.start_method = GetParam();
    return result;
  }
  // One duplex connection per inter-process transport: the clients' ends and the servers'.
  static std::pair<std::vector<DuplexEnd<Request, Reply>>, std::vector<DuplexEnd<Reply, Request>>>
  one_connection_per_transport() {
    std::vector<DuplexEnd<Request, Reply>> clients;
    std::vector<DuplexEnd<Reply, Request>> servers;
    for (const Transport transport : test::interprocess_transports()) {
      auto [client, server] = duplex<Request, Reply>(transport);
      clients.push_back(std::move(client));
      servers.push_back(std::move(server));
    }
    return {std::move(clients), std::move(servers)};
  }
  void TearDown() override {
    EXPECT_TRUE(test::has_no_children()) << "a worker process (or zombie) was left behind";
    LeakCheckedTest::TearDown();
  }
};

INSTANTIATE_TEST_SUITE_P(StartMethods, DuplexSpawnTest, ::testing::Values(StartMethod::Fork, StartMethod::Spawn),
                         [](const auto& info) { return info.param == StartMethod::Fork ? "Fork" : "Spawn"; });

TEST_P(DuplexSpawnTest, AWorkerServesADuplexEndOverEachTransport) {
  for (const Transport transport : test::interprocess_transports()) {
    SCOPED_TRACE(std::string(transport_name(transport)));
    auto [client, server] = duplex<Request, Reply>(transport);
    auto workers = spawn(options(), 1, serve_worker, std::move(server));
    call_three_times(client);
    workers.join();
    EXPECT_TRUE(workers.exit_status(0)->success());
  }
}

TEST_P(DuplexSpawnTest, AWorkerServesAVectorOfDuplexEnds) {
  auto [clients, servers] = one_connection_per_transport();
  auto workers = spawn(options(), 1, serve_each_worker, std::move(servers));
  for (auto& client : clients) call_three_times(client);
  workers.join();
  EXPECT_TRUE(workers.exit_status(0)->success());
}

TEST_P(DuplexSpawnTest, EachWorkerServesItsOwnDuplexEnd) {
  auto [clients, servers] = one_connection_per_transport();
  const int count = static_cast<int>(servers.size());
  auto workers = spawn(options(), count, serve_worker, per_rank(std::move(servers)));
  for (auto& client : clients) call_three_times(client);
  workers.join();
  for (int rank = 0; rank < count; ++rank) EXPECT_TRUE(workers.exit_status(rank)->success());
}

TEST(DuplexInProcessTest, TwoQueuesBetweenThreads) {
  auto [a, b] = duplex<int, std::string>(Transport::InProcess);
  std::thread server([&b = b] {
    while (auto n = b.recv()) b.send(std::to_string(*n));
    b.close();
  });
  EXPECT_EQ(a.call(41).value(), "41");
  EXPECT_EQ(a.call(42).value(), "42");
  a.sender.close();
  EXPECT_FALSE(a.recv().has_value());
  server.join();
}

TEST(DuplexInProcessTest, CallForTimesOutOnAFullQueueAndSeesAClosedPeer) {
  ChannelOptions options;
  options.queue_capacity = 1;
  auto [a, b] = duplex<int, int>(Transport::InProcess, options);
  a.send(0);  // the queue to b is full
  const RecvResult<int> full = a.call_for(1, 5ms);
  EXPECT_TRUE(full.timed_out());
  EXPECT_EQ(b.recv().value(), 0);
  EXPECT_FALSE(b.try_recv().has_value()) << "a request that found no room was sent";
  b.sender.close();
  const RecvResult<int> closed = a.call_for(2, 10s);
  EXPECT_TRUE(closed.closed());
  EXPECT_EQ(b.recv().value(), 2);
}

}  // namespace
}  // namespace ferry
