// Two sandboxes that share only a directory, as two containers without --ipc=host: each is
// a forked process in new user, mount, IPC and network namespaces (its own /dev/shm), and
// they meet at unix:DIR/x.sock. Sharing the PID namespace, every transport an endpoint
// offers must carry new and repeated tensors both ways without copying them, either side's
// death must reach the other as PeerDied, and the survivor keeps nothing of the connection.
// In PID namespaces of their own, connecting is refused with a clear error (holders of
// storages are known by process id). An abstract name (unix:@NAME) belongs to one network
// namespace: a client in another one gets a clear error. Needs root (to create the
// namespaces and map user 0 into them); skipped with the reason otherwise.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::child_succeeded;
using test::fork_child;

constexpr int kSandboxFlags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET;

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  if (!out) throw Error("cannot write " + path);
}

// In the calling (forked) process: new namespaces, user 0 mapped to itself, a private
// /dev/shm; with `own_pids`, a PID namespace too, for the children forked afterwards.
void enter_sandbox(bool own_pids) {
  if (::unshare(kSandboxFlags | (own_pids ? CLONE_NEWPID : 0)) != 0) throw_errno("unshare");
  write_file("/proc/self/setgroups", "deny");
  write_file("/proc/self/uid_map", "0 0 1");
  write_file("/proc/self/gid_map", "0 0 1");
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) throw_errno("mount --make-rprivate /");
  if (::mount("none", "/dev/shm", "tmpfs", 0, nullptr) != 0) throw_errno("mount tmpfs on /dev/shm");
}

// Why sandboxes cannot be made here, or "" when they can (asked once, in a forked child).
std::string sandbox_unavailable_reason() {
  if (::geteuid() != 0) return "needs root to create user, PID, IPC, mount and network namespaces";
  static const std::string reason = [] {
    const pid_t child = ::fork();
    if (child < 0) return std::string("fork failed");
    if (child == 0) {
      try {
        enter_sandbox(true);
      } catch (...) {
        ::_exit(1);
      }
      ::_exit(0);
    }
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0
               ? std::string()
               : std::string("unshare of user, PID, IPC, mount and network namespaces is not permitted here");
  }();
  return reason;
}

// A sandbox: a forked process that enters new namespaces and runs `body` in a child (with
// `own_pids`, as PID 1 of its PID namespace, with its own /proc). pid is the test's pid of
// that child (to kill it).
struct Sandbox {
  pid_t outer = -1;  // the forked process that waits for PID 1
  pid_t pid = -1;
};

Sandbox start_sandbox(bool own_pids, const std::function<void()>& body) {
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) throw_errno("pipe2");
  Sandbox sandbox;
  sandbox.outer = fork_child([&] {
    ::close(report[0]);
    enter_sandbox(own_pids);
    const pid_t inner = fork_child([&] {
      if (own_pids && ::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
        throw_errno("mount /proc");
      }
      body();
    });
    if (::write(report[1], &inner, sizeof inner) != sizeof inner) throw_errno("write");
    CHILD_CHECK(child_succeeded(inner, 60s));
  });
  ::close(report[1]);
  if (::read(report[0], &sandbox.pid, sizeof sandbox.pid) != sizeof sandbox.pid) sandbox.pid = -1;
  ::close(report[0]);
  return sandbox;
}

// Whether this process's fds are back to `before` once cached shared memory (not a leak)
// is given back; waits a little for the collection of what the dead peer held.
bool fds_back_to(std::size_t before) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    release_cached_shared_memory();
    if (test::count_open_fds() == before) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

Tensor numbered(std::int64_t n, std::int32_t base) {
  Tensor t = Tensor::empty({n}, DType::Int32, Device::SharedCpu);
  auto* values = static_cast<std::int32_t*>(t.data_ptr());
  for (std::int64_t i = 0; i < n; ++i) values[i] = base + static_cast<std::int32_t>(i);
  return t;
}

bool holds(const Tensor& t, std::int32_t base) {
  const auto* values = static_cast<const std::int32_t*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    if (values[i] != base + static_cast<std::int32_t>(i)) return false;
  }
  return true;
}

void add_to(Tensor& t, std::int32_t amount) {
  auto* values = static_cast<std::int32_t*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i) values[i] += amount;
}

constexpr std::int64_t kElements = 1 << 16;

// Both directions, new and repeated tensors, zero copies: what one side writes into a
// tensor it received, the other sees in its own.
template <class End>
void exchange_as_listener(End& end) {
  std::optional<Tensor> first = end.recv();  // new from the client
  CHILD_CHECK(first && holds(*first, 100));
  add_to(*first, 1);                         // the client sees it: one storage for both
  end.send(*first);                          // back: a storage the client made
  std::optional<Tensor> again = end.recv();  // the client's tensor once more (repeated)
  CHILD_CHECK(again && holds(*again, 102));
  CHILD_CHECK(again->data_ptr() == first->data_ptr());  // mapped once
  Tensor mine = numbered(kElements, 500);               // new from the listener
  end.send(mine);
  end.send(mine);  // and repeated
  std::optional<Tensor> answer = end.recv();
  CHILD_CHECK(answer && answer->data_ptr() == mine.data_ptr());  // its own storage came home
  CHILD_CHECK(holds(mine, 507));                                 // the client's write reached this process's storage
}

template <class End>
void exchange_as_client(End& end) {
  Tensor mine = numbered(kElements, 100);
  end.send(mine);
  std::optional<Tensor> back = end.recv();
  CHILD_CHECK(back && holds(*back, 101) && holds(mine, 101));  // the listener's write is here
  CHILD_CHECK(back->data_ptr() == mine.data_ptr());            // its own storage came home
  add_to(mine, 1);
  end.send(mine);
  std::optional<Tensor> theirs = end.recv();
  std::optional<Tensor> theirs_again = end.recv();
  CHILD_CHECK(theirs && theirs_again && holds(*theirs, 500) && holds(*theirs_again, 500));
  CHILD_CHECK(theirs->data_ptr() == theirs_again->data_ptr());
  add_to(*theirs, 7);
  end.send(*theirs);
}

// Waits until the other side is gone: recv() must report PeerDied (never hang).
template <class End>
void expect_peer_died(End& end) {
  try {
    (void)end.recv();
    CHILD_CHECK(!"recv returned after the peer was killed");
  } catch (const PeerDied&) {
  }
}

class ContainerTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    if (const std::string reason = sandbox_unavailable_reason(); !reason.empty()) GTEST_SKIP() << reason;
    char pattern[] = "/tmp/ferry-containers-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Runs the exchange between two sandboxes, then kills `victim_is_listener`'s side and
  // checks that the survivor saw PeerDied and kept nothing.
  void run_and_kill(bool kill_listener) {
    const std::string address = "unix:" + dir_ + "/x.sock";
    EndpointOptions options;
    options.transport = GetParam();
    int ready[2];  // the side to be killed says it has finished exchanging
    ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);
    const Sandbox listener = start_sandbox(false, [&] {
      ::close(ready[0]);
      release_cached_shared_memory();
      const std::size_t fds_before = test::count_open_fds();
      {
        Listener server = listen(address, options);
        auto end = server.accept_duplex<Tensor, Tensor>();
        exchange_as_listener(end);
        if (kill_listener) {
          CHILD_CHECK(::write(ready[1], "r", 1) == 1);
          ::pause();
        }
        expect_peer_died(end);
      }
      ::close(ready[1]);
      CHILD_CHECK(fds_back_to(fds_before - 1));  // nothing of the connection is left
    });
    const Sandbox client = start_sandbox(false, [&] {
      ::close(ready[0]);
      release_cached_shared_memory();
      const std::size_t fds_before = test::count_open_fds();
      {
        auto end = connect_duplex<Tensor, Tensor>(address, options);
        exchange_as_client(end);
        if (!kill_listener) {
          CHILD_CHECK(::write(ready[1], "r", 1) == 1);
          ::pause();
        }
        expect_peer_died(end);
      }
      ::close(ready[1]);
      CHILD_CHECK(fds_back_to(fds_before - 1));  // nothing of the connection is left
    });
    ::close(ready[1]);
    char byte = 0;
    const bool victim_ready = ::read(ready[0], &byte, 1) == 1;
    ::close(ready[0]);
    const Sandbox& victim = kill_listener ? listener : client;
    const Sandbox& survivor = kill_listener ? client : listener;
    ASSERT_GT(victim.pid, 0);
    ::kill(victim.pid, SIGKILL);
    EXPECT_TRUE(victim_ready) << "the side to be killed did not finish its exchange";
    EXPECT_TRUE(child_succeeded(survivor.outer, 60s));
    (void)test::wait_child(victim.outer, 60s);
    EXPECT_TRUE(test::has_no_children());
  }

  std::string dir_;
};

INSTANTIATE_TEST_SUITE_P(Transports, ContainerTest,
                         ::testing::Values(Transport::UnixSocket, Transport::ShmRing, Transport::Pipe),
                         [](const auto& info) { return std::string(transport_name(info.param)); });

TEST_P(ContainerTest, TensorsTravelBothWaysAndTheClientSeesTheListenerDie) { run_and_kill(true); }

TEST_P(ContainerTest, TensorsTravelBothWaysAndTheListenerSeesTheClientDie) { run_and_kill(false); }

TEST_P(ContainerTest, ConnectingFromAnotherPidNamespaceIsRefusedClearly) {
  const std::string address = "unix:" + dir_ + "/x.sock";
  EndpointOptions options;
  options.transport = GetParam();
  int ready[2];
  ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);
  const Sandbox listener = start_sandbox(true, [&] {
    ::close(ready[0]);
    Listener server = listen(address, options);
    server.serve_duplex<Tensor, Tensor>();
    CHILD_CHECK(::write(ready[1], "r", 1) == 1);
    ::pause();
  });
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  const Sandbox client = start_sandbox(true, [&] {
    try {
      (void)connect_duplex<Tensor, Tensor>(address, options);
      CHILD_CHECK(!"connected to a listener in another PID namespace");
    } catch (const Error& error) {
      CHILD_CHECK(std::string(error.what()).find("PID namespace") != std::string::npos);
    }
  });
  EXPECT_TRUE(child_succeeded(client.outer, 60s));
  ::kill(listener.pid, SIGKILL);
  (void)test::wait_child(listener.outer, 60s);
  EXPECT_TRUE(test::has_no_children());
}

TEST(ContainerAbstractNameTest, AnAbstractNameIsNotReachableFromAnotherNetworkNamespace) {
  if (const std::string reason = sandbox_unavailable_reason(); !reason.empty()) GTEST_SKIP() << reason;
  const std::string address = "unix:@ferry-container-test-" + std::to_string(::getpid());
  int ready[2];
  ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);
  int done[2];
  ASSERT_EQ(::pipe2(done, O_CLOEXEC), 0);
  const Sandbox listener = start_sandbox(true, [&] {
    ::close(ready[0]);
    ::close(done[1]);
    Listener server = listen(address);
    CHILD_CHECK(::write(ready[1], "r", 1) == 1);
    char byte = 0;
    (void)::read(done[0], &byte, 1);  // until the client has tried
  });
  ::close(ready[1]);
  ::close(done[0]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  const Sandbox client = start_sandbox(true, [&] {
    EndpointOptions options;
    options.connect_timeout = 300ms;
    try {
      (void)connect_receiver<int>(address, options);
      CHILD_CHECK(!"connected to an abstract name of another network namespace");
    } catch (const Error& error) {
      const std::string message = error.what();
      CHILD_CHECK(message.find("network namespace") != std::string::npos);
    }
  });
  EXPECT_TRUE(child_succeeded(client.outer, 60s));
  EXPECT_EQ(::write(done[1], "d", 1), 1);  // the listener's sandbox may end
  ::close(done[1]);
  EXPECT_TRUE(child_succeeded(listener.outer, 60s));
}

}  // namespace
}  // namespace ferry
