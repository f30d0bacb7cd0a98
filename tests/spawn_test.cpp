// Worker processes with both start methods: arguments and channel ends reach the workers,
// failures are reported with rank, cause and message, siblings are terminated, workers
// die with their parent, and nothing (process, fd) is left behind.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <cereal/archives/binary.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/memory.hpp>
#include <cereal/types/polymorphic.hpp>
#include <cereal/types/vector.hpp>

#include "ferry/detail/frame_channel.hpp"
#include "ferry/ferry.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"

namespace ferry {
namespace spawn_test {

using namespace std::chrono_literals;

// ---- worker functions (registered: the spawn start method runs them by name) ---------

struct Greeting {
  int rank = -1;
  int world_size = 0;
  std::string text;
  std::int64_t number = 0;
  int pid = 0;
  int start_method = -1;
  bool worker_variable_set = true;  // FERRY_WORKER in the worker's environment
  template <class Archive>
  void serialize(Archive& ar) {
    ar(rank, world_size, text, number, pid, start_method, worker_variable_set);
  }
};

void greet(WorkerContext& context, Sender<Greeting> out, std::string text, std::int64_t number) {
  out.send(Greeting{context.rank(), context.world_size(), text, number, static_cast<int>(::getpid()),
                    static_cast<int>(context.start_method()), std::getenv("FERRY_WORKER") != nullptr});
}
FERRY_WORKER(greet);

// Counts and sums what arrives until end of stream, then reports both.
void count_until_closed(WorkerContext&, Receiver<int> in, Sender<std::int64_t> out) {
  std::int64_t count = 0;
  std::int64_t sum = 0;
  while (auto value = in.recv()) {
    ++count;
    sum += *value;
  }
  out.send(count);
  out.send(sum);
}
FERRY_WORKER(count_until_closed);

// Writes rank + 100 into slot `rank` of a shared tensor that every worker was given.
void write_rank(WorkerContext& context, Tensor shared) {
  shared.at<std::int32_t>({context.rank()}) = context.rank() + 100;
}
FERRY_WORKER(write_rank);

// Takes its end by reference and does not close it: spawn closes it when the worker returns.
void send_and_forget(WorkerContext& context, Sender<int>& out) { out.send(context.rank()); }
FERRY_WORKER(send_and_forget);

[[noreturn]] void wait_for_ever() {
  while (true) ::pause();
}

struct CustomFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum How : int { Throw = 0, ThrowCustom, ThrowInt, ExitThree, Segfault, KillSelf };

// Rank `failing` fails in the way `how` says; the others wait until they are terminated.
void fail_on_rank(WorkerContext& context, int failing, int how) {
  if (context.rank() != failing) wait_for_ever();
  switch (how) {
    case Throw: throw std::runtime_error("rank " + std::to_string(context.rank()) + " gave up");
    case ThrowCustom: throw CustomFailure("custom trouble");
    case ThrowInt: throw 42;
    case ExitThree: ::_exit(3);
    case Segfault:
      ::signal(SIGSEGV, SIG_DFL);  // no sanitizer handler: die by the signal itself
      ::raise(SIGSEGV);
      break;
    case KillSelf: ::raise(SIGKILL); break;
  }
  wait_for_ever();
}
FERRY_WORKER(fail_on_rank);

// Rank 1 ignores SIGTERM; rank 0 fails once the parent says so.
void stubborn(WorkerContext& context, Sender<int> ready, Receiver<int> go) {
  if (context.rank() == 1) {
    ::signal(SIGTERM, SIG_IGN);
    ready.send(1);
    wait_for_ever();
  }
  ready.send(0);
  (void)go.recv();
  throw std::runtime_error("rank 0 fails on request");
}
FERRY_WORKER(stubborn);

// Rank 1 takes 50 ms to stop after SIGTERM, then exits 0; rank 0 fails once the parent says so.
void slow_to_stop(WorkerContext& context, Sender<int> ready, Receiver<int> go) {
  if (context.rank() == 1) {
    ::signal(SIGTERM, [](int) {
      const timespec cleanup{0, 50'000'000};
      ::nanosleep(&cleanup, nullptr);
      ::_exit(0);
    });
    ready.send(1);
    wait_for_ever();
  }
  ready.send(0);
  (void)go.recv();
  throw std::runtime_error("rank 0 fails on request");
}
FERRY_WORKER(slow_to_stop);

// Waits for one message, then returns.
void wait_for_message(WorkerContext&, Receiver<int> in) { (void)in.recv(); }
FERRY_WORKER(wait_for_message);

// Tells the test its pid, then waits to be killed with its parent.
void report_pid_and_wait(WorkerContext&, Sender<int> out) {
  out.send(static_cast<int>(::getpid()));
  wait_for_ever();
}
FERRY_WORKER(report_pid_and_wait);

void never_registered(WorkerContext&, int) {}

// Two functions registered under one name: neither can be started by exec.
void first_of_a_name(WorkerContext&, int) {}
void second_of_a_name(WorkerContext&, int) {}
FERRY_WORKER_NAMED("taken_twice", first_of_a_name);
FERRY_WORKER_NAMED("taken_twice", second_of_a_name);

void noexcept_worker(WorkerContext& context, Sender<int> out) noexcept { out.send(context.world_size()); }
FERRY_WORKER(noexcept_worker);

// Writes `line` to std::cout, without flushing it.
void print_line(WorkerContext&, std::string line) { std::cout << line << '\n'; }
FERRY_WORKER(print_line);

// Sums the first element of every tensor it was given.
void sum_first_elements(WorkerContext&, std::vector<Tensor> tensors, Sender<std::int64_t> out) {
  std::int64_t sum = 0;
  for (const Tensor& tensor : tensors) sum += tensor.to_vector<std::int32_t>().front();
  out.send(sum);
}
FERRY_WORKER(sum_first_elements);

// ---- fixture -----------------------------------------------------------------------

class SpawnTest : public test::LeakCheckedTest, public ::testing::WithParamInterface<StartMethod> {
 protected:
  SpawnOptions options(std::chrono::milliseconds grace = 5s) const {
    SpawnOptions result;
    result.start_method = GetParam();
    result.termination_grace = grace;
    return result;
  }
  void TearDown() override {
    EXPECT_TRUE(test::has_no_children()) << "a worker process (or zombie) was left behind";
    LeakCheckedTest::TearDown();
  }
};

INSTANTIATE_TEST_SUITE_P(StartMethods, SpawnTest, ::testing::Values(StartMethod::Fork, StartMethod::Spawn),
                         [](const auto& info) { return info.param == StartMethod::Fork ? "Fork" : "Spawn"; });

template <class T>
std::pair<std::vector<Sender<T>>, std::vector<Receiver<T>>> channels(int n, Transport transport = Transport::Pipe) {
  std::vector<Sender<T>> senders;
  std::vector<Receiver<T>> receivers;
  for (int i = 0; i < n; ++i) {
    auto [tx, rx] = channel<T>(transport);
    senders.push_back(std::move(tx));
    receivers.push_back(std::move(rx));
  }
  return {std::move(senders), std::move(receivers)};
}

// ---- arguments and ends ------------------------------------------------------------

TEST_P(SpawnTest, WorkersGetRankWorldSizeAndArguments) {
  auto [senders, receivers] = channels<Greeting>(3);
  auto workers = spawn(options(), 3, greet, per_rank(std::move(senders)), std::string("hello"), 42);
  std::vector<int> pids;
  for (int rank = 0; rank < 3; ++rank) {
    auto greeting = receivers[rank].recv();
    ASSERT_TRUE(greeting.has_value());
    EXPECT_EQ(greeting->rank, rank);
    EXPECT_EQ(greeting->world_size, 3);
    EXPECT_EQ(greeting->text, "hello");
    EXPECT_EQ(greeting->number, 42);
    EXPECT_EQ(greeting->start_method, static_cast<int>(GetParam()));
    EXPECT_EQ(greeting->pid, workers.pid(rank));
    // init() removed the variable that named the worker: programs the worker starts are not workers.
    EXPECT_FALSE(greeting->worker_variable_set);
    EXPECT_FALSE(receivers[rank].recv().has_value()) << "the worker's Sender closes when it returns";
  }
  workers.join();
  for (int rank = 0; rank < 3; ++rank) EXPECT_TRUE(workers.exit_status(rank)->success());
}

TEST_P(SpawnTest, SpawnByName) {
  auto [tx, rx] = channel<Greeting>(Transport::UnixSocket);
  auto workers = spawn(options(), 1, "greet", std::move(tx), std::string("by name"), std::int64_t{7});
  auto greeting = rx.recv();
  ASSERT_TRUE(greeting.has_value());
  EXPECT_EQ(greeting->text, "by name");
  EXPECT_EQ(greeting->number, 7);
  workers.join();
}

TEST_P(SpawnTest, NoexceptFunctionsAreWorkersToo) {
  auto [tx, rx] = channel<int>(Transport::Pipe);
  auto workers = spawn(options(), 1, noexcept_worker, std::move(tx));
  EXPECT_EQ(rx.recv().value(), 1);
  workers.join();
}

TEST_P(SpawnTest, EndOfStreamReachesTheWorkerAndResultsComeBack) {
  for (const Transport transport : {Transport::Pipe, Transport::UnixSocket}) {
    auto [to_worker, worker_in] = channel<int>(transport);
    auto [worker_out, results] = channel<std::int64_t>(transport);
    auto workers = spawn(options(), 1, count_until_closed, std::move(worker_in), std::move(worker_out));
    for (int i = 1; i <= 1000; ++i) to_worker.send(i);
    to_worker.close();
    EXPECT_EQ(results.recv().value(), 1000);
    EXPECT_EQ(results.recv().value(), 500500);
    EXPECT_FALSE(results.recv().has_value());
    workers.join();
  }
}

TEST_P(SpawnTest, WorkerHoldsNoCopyOfEndsItWasNotGiven) {
  // The parent keeps both ends of `kept`; if a worker held a copy of its sending end, the
  // parent's receiver could not see the sender vanish.
  auto [kept_tx, kept_rx] = channel<int>(Transport::Pipe);
  auto [to_worker, worker_in] = channel<int>(Transport::Pipe);
  auto workers = spawn(options(), 1, wait_for_message, std::move(worker_in));
  kept_tx.detach();  // drop the only sending end without a Close frame
  EXPECT_THROW((void)kept_rx.recv_for(30s), PeerDied);
  to_worker.send(1);
  workers.join();
}

TEST_P(SpawnTest, EndTakenByReferenceIsClosedWhenTheWorkerReturns) {
  auto [tx, rx] = channel<int>(Transport::Pipe);
  auto workers = spawn(options(), 1, send_and_forget, std::move(tx));
  EXPECT_EQ(rx.recv().value(), 0);
  EXPECT_FALSE(rx.recv().has_value());  // a clean end of stream, not PeerDied
  workers.join();
}

TEST_P(SpawnTest, TensorArgumentIsSharedNotCopied) {
  Tensor shared = Tensor::zeros({4}, DType::Int32, Device::SharedCpu);
  auto workers = spawn(options(), 4, write_rank, shared);
  workers.join();
  EXPECT_EQ(shared.to_vector<std::int32_t>(), (std::vector<std::int32_t>{100, 101, 102, 103}));
}

// Tensors inside a value of the program's own type.
struct Sevens {
  std::string name;
  std::vector<Tensor> tensors;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(name, tensors);
  }
};

// Waits for `go`, then says whether every element of every tensor is still 7.
void check_sevens_after_go(WorkerContext&, Sevens sevens, Receiver<int> go, Sender<int> verdict) {
  (void)go.recv();
  bool intact = sevens.tensors.size() == 2;
  for (const Tensor& tensor : sevens.tensors) {
    const auto values = tensor.to_vector<std::int32_t>();
    intact = intact && std::all_of(values.begin(), values.end(), [](std::int32_t v) { return v == 7; });
  }
  verdict.send(intact ? 1 : 0);
}
FERRY_WORKER(check_sevens_after_go);

// A worker's tensor arguments stay intact after the parent dropped its copies: one from the
// parent's allocator, one the parent received from another process. A forked worker reads
// the parent's blocks, so the group keeps them until the worker exits.
TEST_P(SpawnTest, TensorArgumentsStayIntactAfterTheParentDropsItsCopies) {
  auto [from_origin, to_parent] = channel<Tensor>(Transport::UnixSocket);
  auto [done_tx, done_rx] = channel<int>(Transport::Pipe);
  const pid_t origin =
      test::fork_child([&, &from_origin = from_origin, &to_parent = to_parent, &done_tx = done_tx, &done_rx = done_rx] {
        to_parent.close();
        done_tx.detach();
        from_origin.adopt();
        Tensor sent = Tensor::empty({1024}, DType::Int32, Device::SharedCpu);
        sent.fill(7);
        from_origin.send(sent);
        sent = Tensor();
        CHILD_CHECK(done_rx.recv().value() == 1);  // the parent dropped its copy
        from_origin.send(Tensor());                // tells the parent that this process dropped `sent` too
        CHILD_CHECK(done_rx.recv().value() == 2);  // the parent read that: its block is free there
        from_origin.send(Tensor());                // a send takes back the blocks the receiver gave back
        std::vector<Tensor> others;                // what a recycled block would be handed to
        for (int i = 0; i < 64; ++i) {
          others.push_back(Tensor::empty({1024}, DType::Int32, Device::SharedCpu));
          others.back().fill(9);
        }
        from_origin.close();
        CHILD_CHECK(done_rx.recv().value() == 3);
      });
  from_origin.detach();
  done_rx.close();
  auto [go_tx, go_rx] = channel<int>(Transport::Pipe);
  auto [verdict_tx, verdict_rx] = channel<int>(Transport::Pipe);
  Sevens sevens{"sevens", {Tensor::empty({1024}, DType::Int32, Device::SharedCpu), to_parent.recv().value()}};
  sevens.tensors[0].fill(7);
  auto workers = spawn(options(), 1, check_sevens_after_go, sevens, std::move(go_rx), std::move(verdict_tx));
  const std::weak_ptr<Storage> kept_for_the_worker = sevens.tensors[0].storage();
  sevens = Sevens{};  // the parent's only copies
  done_tx.send(1);
  EXPECT_FALSE(to_parent.recv().value().storage());
  done_tx.send(2);
  EXPECT_FALSE(to_parent.recv().value().storage());
  EXPECT_FALSE(to_parent.recv().has_value());  // the origin allocated over what it took back
  std::vector<Tensor> others;
  for (int i = 0; i < 64; ++i) {
    others.push_back(Tensor::empty({1024}, DType::Int32, Device::SharedCpu));
    others.back().fill(9);
  }
  go_tx.send(1);
  EXPECT_EQ(verdict_rx.recv().value(), 1) << "a worker's tensor was recycled after the parent dropped its copy";
  workers.join();
  // Fork: given back once the worker was reaped, while the group itself lives on. (Spawn's
  // pins are its argument frame's, taken back by the hold ledger's next check.)
  if (GetParam() == StartMethod::Fork) {
    EXPECT_TRUE(kept_for_the_worker.expired()) << "the group kept a reaped worker's storage";
  }
  done_tx.send(3);
  EXPECT_TRUE(test::child_succeeded(origin));
}

TEST_P(SpawnTest, TensorsInMoreSegmentsThanOneSocketMessageCarriesReachTheWorker) {
  // Each tensor is larger than an eighth of the pool's segments, so it gets a segment (an
  // fd) of its own: 300 fds, more than SCM_RIGHTS passes at once. A worker started by exec
  // inherits them instead, where that limit does not apply.
  SharedAllocatorSettings settings;
  settings.segment_bytes = 64 << 10;
  const SharedAllocator pool(settings);
  std::vector<Tensor> tensors;
  for (int i = 0; i < 300; ++i) {
    tensors.push_back(Tensor::zeros({4096}, DType::Int32, pool));
    tensors.back().data<std::int32_t>()[0] = i;
  }
  auto [tx, rx] = channel<std::int64_t>(Transport::Pipe);
  auto workers = spawn(options(), 1, sum_first_elements, std::move(tensors), std::move(tx));
  EXPECT_EQ(rx.recv_for(60s).value(), 299 * 300 / 2);
  workers.join();
}

TEST_P(SpawnTest, JoinWithTimeoutReportsWhetherWorkersFinished) {
  auto [tx, rx] = channel<int>(Transport::Pipe);
  auto workers = spawn(options(), 1, wait_for_message, std::move(rx));
  EXPECT_FALSE(workers.join(20ms));  // it cannot finish before we send
  EXPECT_EQ(workers.running(), 1);
  tx.send(1);
  EXPECT_TRUE(workers.join(std::chrono::milliseconds::max()));  // as long as it takes, not "at once"
  EXPECT_EQ(workers.running(), 0);
  workers.join();  // joining again is harmless
}

TEST_P(SpawnTest, IostreamOutputIsWrittenOnceByEachProcess) {
  // With std::ios::sync_with_stdio(false), std::cout has a buffer of its own, which
  // fflush() does not empty: what the parent buffered must not be copied into a forked
  // worker (and written twice), and what a worker writes must not be lost when it exits.
  const SpawnOptions spawn_options = options();
  const pid_t child = test::fork_child([&] {
    const int output = ::memfd_create("spawn-test-stdout", MFD_CLOEXEC);
    CHILD_CHECK(output >= 0);
    CHILD_CHECK(::dup2(output, STDOUT_FILENO) == STDOUT_FILENO);
    std::ios::sync_with_stdio(false);
    std::cout << "parent, before spawn\n";
    auto workers = spawn(spawn_options, 1, print_line, std::string("worker"));
    workers.join();
    std::cout << "parent, after join" << std::endl;
    std::string text(4096, '\0');
    const ssize_t got = ::pread(output, text.data(), text.size(), 0);
    CHILD_CHECK(got >= 0);
    text.resize(static_cast<std::size_t>(got));
    if (text != "parent, before spawn\nworker\nparent, after join\n") {
      throw std::runtime_error("standard output holds \"" + text + "\"");
    }
  });
  EXPECT_TRUE(test::child_succeeded(child));
}

// ---- failures ------------------------------------------------------------------------

WorkerFailed join_failure(WorkerGroup& workers) {
  try {
    workers.join();
  } catch (const WorkerFailed& failure) {
    return failure;
  }
  ADD_FAILURE() << "join() did not throw WorkerFailed";
  return WorkerFailed({});
}

TEST_P(SpawnTest, ExceptionNamesRankTypeAndMessage) {
  auto workers = spawn(options(), 3, fail_on_rank, 1, static_cast<int>(Throw));
  const WorkerFailed failure = join_failure(workers);
  EXPECT_EQ(failure.failure(), WorkerFailure::Exception);
  EXPECT_EQ(failure.rank(), 1);
  EXPECT_EQ(failure.pid(), workers.pid(1));
  EXPECT_EQ(failure.exception_type(), "std::runtime_error");
  EXPECT_EQ(failure.message(), "rank 1 gave up");
  const std::string what = failure.what();
  EXPECT_NE(what.find("worker 1 of 3"), std::string::npos) << what;
  EXPECT_NE(what.find("std::runtime_error: rank 1 gave up"), std::string::npos) << what;
  // The whole message, as docs/design/workers.md shows it.
  EXPECT_EQ(what, "worker 1 of 3 (pid " + std::to_string(workers.pid(1)) +
                      ") failed: std::runtime_error: rank 1 gave up; the 2 other running workers were terminated");
  // The others were terminated, and join() keeps reporting the failure.
  EXPECT_EQ(failure.details().terminated_siblings, 2);
  for (const int rank : {0, 2}) {
    ASSERT_TRUE(workers.exit_status(rank).has_value());
    EXPECT_EQ(workers.exit_status(rank)->signal, SIGTERM);
  }
  EXPECT_THROW(workers.join(), WorkerFailed);
}

TEST_P(SpawnTest, ExceptionTypeIsDemangled) {
  auto workers = spawn(options(), 1, fail_on_rank, 0, static_cast<int>(ThrowCustom));
  const WorkerFailed failure = join_failure(workers);
  EXPECT_EQ(failure.exception_type(), "ferry::spawn_test::CustomFailure");
  EXPECT_EQ(failure.message(), "custom trouble");
}

TEST_P(SpawnTest, NonStandardExceptionIsReportedByType) {
  auto workers = spawn(options(), 1, fail_on_rank, 0, static_cast<int>(ThrowInt));
  const WorkerFailed failure = join_failure(workers);
  EXPECT_EQ(failure.failure(), WorkerFailure::Exception);
  EXPECT_EQ(failure.exception_type(), "int");
}

TEST_P(SpawnTest, ExitCodeIsReported) {
  auto workers = spawn(options(), 2, fail_on_rank, 0, static_cast<int>(ExitThree));
  const WorkerFailed failure = join_failure(workers);
  EXPECT_EQ(failure.failure(), WorkerFailure::ExitCode);
  EXPECT_EQ(failure.rank(), 0);
  EXPECT_EQ(failure.exit_code(), 3);
  EXPECT_NE(std::string(failure.what()).find("exited with status 3"), std::string::npos) << failure.what();
}

TEST_P(SpawnTest, SignalIsReportedByName) {
  for (const auto& [how, signal, name] :
       {std::tuple{Segfault, SIGSEGV, "SIGSEGV"}, std::tuple{KillSelf, SIGKILL, "SIGKILL"}}) {
    auto workers = spawn(options(), 2, fail_on_rank, 1, static_cast<int>(how));
    const WorkerFailed failure = join_failure(workers);
    EXPECT_EQ(failure.failure(), WorkerFailure::Signal);
    EXPECT_EQ(failure.rank(), 1);
    EXPECT_EQ(failure.signal(), signal);
    EXPECT_NE(std::string(failure.what()).find(std::string("killed by signal ") + name), std::string::npos)
        << failure.what();
  }
}

TEST_P(SpawnTest, SiblingIgnoringSigtermIsKilledAfterTheGracePeriod) {
  auto [ready_tx, ready_rx] = channels<int>(2);
  auto [go_tx, go_rx] = channels<int>(2);
  auto workers = spawn(options(100ms), 2, stubborn, per_rank(std::move(ready_tx)), per_rank(std::move(go_rx)));
  EXPECT_EQ(ready_rx[0].recv().value(), 0);
  EXPECT_EQ(ready_rx[1].recv().value(), 1);  // rank 1 ignores SIGTERM from now on
  go_tx[0].send(1);
  const WorkerFailed failure = join_failure(workers);
  EXPECT_EQ(failure.rank(), 0);
  EXPECT_EQ(failure.message(), "rank 0 fails on request");
  ASSERT_TRUE(workers.exit_status(1).has_value());
  EXPECT_EQ(workers.exit_status(1)->signal, SIGKILL);
}

TEST_P(SpawnTest, UnboundedGracePeriodLetsSiblingsFinishTheirCleanup) {
  // A grace period "for ever": ferry must not overflow adding it to the clock (which, at
  // milliseconds::max(), lands 1 ms in the past and sends SIGKILL at once).
  auto [ready_tx, ready_rx] = channels<int>(2);
  auto [go_tx, go_rx] = channels<int>(2);
  auto workers = spawn(options(std::chrono::milliseconds::max()), 2, slow_to_stop, per_rank(std::move(ready_tx)),
                       per_rank(std::move(go_rx)));
  EXPECT_EQ(ready_rx[0].recv().value(), 0);
  EXPECT_EQ(ready_rx[1].recv().value(), 1);  // rank 1 handles SIGTERM from now on
  go_tx[0].send(1);
  const WorkerFailed failure = join_failure(workers);
  EXPECT_EQ(failure.rank(), 0);
  ASSERT_TRUE(workers.exit_status(1).has_value());
  EXPECT_TRUE(workers.exit_status(1)->success()) << "rank 1 " << workers.exit_status(1)->describe();
}

TEST_P(SpawnTest, AForkedCopyOfTheGroupLeavesTheParentsWorkersAlone) {
  auto [tx, rx] = channel<int>(Transport::Pipe);
  auto workers = spawn(options(), 1, wait_for_message, std::move(rx));
  // A process forked by the program (not a worker) that unwinds its stack destroys its
  // copy of the group: the workers are not its children, and must not be touched.
  const pid_t child = test::fork_child([&, &workers = workers] { WorkerGroup copy = std::move(workers); });
  EXPECT_TRUE(test::child_succeeded(child));
  tx.send(1);
  workers.join();
  EXPECT_TRUE(workers.exit_status(0)->success()) << workers.exit_status(0)->describe();
}

TEST_P(SpawnTest, DestroyingAnUnjoinedGroupTerminatesItsWorkers) {
  {
    auto workers = spawn(options(), 2, fail_on_rank, -1, 0);  // both wait for ever
    EXPECT_EQ(workers.running(), 2);
  }
  // TearDown checks that no process is left.
}

TEST_P(SpawnTest, WorkersDieWithTheirParentAndTheirPeersSeeIt) {
  // The test process adopts orphans (child subreaper), so that it can see the workers of a
  // killed middle process die.
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  auto [senders, receivers] = channels<int>(2);
  const SpawnOptions spawn_options = options();
  const pid_t middle = test::fork_child([&, &senders = senders, &receivers = receivers] {
    for (auto& receiver : receivers) receiver.close();
    auto workers = spawn(spawn_options, 2, report_pid_and_wait, per_rank(std::move(senders)));
    wait_for_ever();
  });
  for (auto& sender : senders) sender.detach();
  std::vector<pid_t> worker_pids;
  for (auto& receiver : receivers) {
    auto pid = receiver.recv_for(60s);
    ASSERT_TRUE(pid.has_value());
    worker_pids.push_back(*pid);
  }
  ASSERT_EQ(::kill(middle, SIGKILL), 0);
  EXPECT_EQ(test::wait_child(middle).signal, SIGKILL);
  // The workers' channels report their death (bounded: a hang here would be the bug).
  for (auto& receiver : receivers) EXPECT_THROW((void)receiver.recv_for(60s), PeerDied);
  for (const pid_t pid : worker_pids) {
    const test::ChildExit exit = test::wait_child(pid, 60s);
    EXPECT_FALSE(exit.exited);
    EXPECT_EQ(exit.signal, SIGKILL) << "worker " << pid << " " << exit.describe();
  }
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 0), 0);
}

// ---- bad input: clear errors, and no process started ----------------------------------

template <class Call>
void expect_spawn_error(Call&& call, const std::string& expected) {
  try {
    call();
    ADD_FAILURE() << "no SpawnError; expected one saying: " << expected;
  } catch (const SpawnError& error) {
    EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
  }
  EXPECT_TRUE(test::has_no_children()) << "a process was started before the error";
}

TEST_P(SpawnTest, BadRequestsFailBeforeAnyProcessStarts) {
  const SpawnOptions opts = options();
  expect_spawn_error([&] { (void)spawn(opts, 0, fail_on_rank, 0, 0); }, "must be at least 1");
  expect_spawn_error([&] { (void)spawn(opts, -2, fail_on_rank, 0, 0); }, "must be at least 1");
  expect_spawn_error([&] { (void)spawn(opts, 1, "no_such_worker", 1); }, "no worker is registered as 'no_such_worker'");
  expect_spawn_error([&] { (void)spawn(opts, 1, "fail_on_rank", std::string("x")); }, "takes the arguments");
  expect_spawn_error(
      [&] {
        (void)spawn(opts, 3, fail_on_rank, per_rank(std::vector<int>{1, 2}), 0);
      },
      "per_rank needs exactly one value per worker");
  {
    auto [tx, rx] = channel<int>(Transport::Pipe);
    expect_spawn_error([&, &rx = rx] { (void)spawn(opts, 2, wait_for_message, std::move(rx)); },
                       "would be shared by 2 workers");
  }
  {
    auto [tx, rx] = channel<int>(Transport::Pipe);
    rx.close();
    expect_spawn_error([&, &rx = rx] { (void)spawn(opts, 1, wait_for_message, std::move(rx)); },
                       "closed or empty channel end");
  }
  {
    auto [tx, rx] = channel<int>(Transport::InProcess);
    expect_spawn_error([&, &rx = rx] { (void)spawn(opts, 1, wait_for_message, std::move(rx)); },
                       "an end of an in_process channel, which cannot reach another process");
  }
  {
    struct sigaction previous {};
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ASSERT_EQ(::sigaction(SIGCHLD, &ignore, &previous), 0);
    expect_spawn_error([&] { (void)spawn(opts, 1, fail_on_rank, 0, 0); }, "ignores SIGCHLD");
    ASSERT_EQ(::sigaction(SIGCHLD, &previous, nullptr), 0);
  }
}

TEST(SpawnMethodTest, RequiresRegisteredFunctionsAndFreshEnds) {
  SpawnOptions opts;
  opts.start_method = StartMethod::Spawn;
  expect_spawn_error([&] { (void)spawn(opts, 1, never_registered, 1); }, "this function is not registered");
  expect_spawn_error(
      [&] {
        (void)spawn(
            opts, 1, [](WorkerContext&, int) {}, 1);
      },
      "cannot run a lambda");
  auto [tx, rx] = channel<int>(Transport::Pipe);
  tx.send(1);
  (void)rx.recv();
  expect_spawn_error([&, &rx = rx] { (void)spawn(opts, 1, wait_for_message, std::move(rx)); },
                     "already carried messages");
}

TEST(SpawnMethodTest, NameRegisteredByTwoFunctionsFailsBeforeAnyProcessStarts) {
  SpawnOptions opts;
  opts.start_method = StartMethod::Spawn;
  const std::string expected = "worker name 'taken_twice' is registered by two different functions";
  expect_spawn_error([&] { (void)spawn(opts, 1, "taken_twice", 1); }, expected);
  expect_spawn_error([&] { (void)spawn(opts, 1, first_of_a_name, 1); }, expected);
  expect_spawn_error([&] { (void)spawn(opts, 1, second_of_a_name, 1); }, expected);
}

// The descriptors an exec'd worker would inherit for `description`: fresh copies, so that
// taking them does not touch the end described.
EndDescription with_copied_descriptors(EndDescription description) {
  for (auto& fd : description.fds) {
    fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) throw_errno("fcntl(F_DUPFD_CLOEXEC)");
  }
  return description;
}

bool is_open_fd(int fd) { return ::fcntl(fd, F_GETFD) >= 0; }

TEST(EndDescriptionTest, RebuildingAsAnotherTypeOrRoleIsATypeMismatchThatStillTakesTheDescriptors) {
  auto [tx, rx] = channel<int>(Transport::Pipe);
  const EndDescription sender = describe_end(tx);
  EXPECT_EQ(sender.role, EndRole::Sender);
  EXPECT_EQ(sender.fds.size(), 2u);
  // The call takes ownership of the descriptors, also when it refuses the description.
  const std::size_t fds_before = test::count_open_fds();
  const EndDescription as_float = with_copied_descriptors(sender);
  EXPECT_THROW((void)sender_from_description<float>(as_float), TypeMismatch);
  for (const int fd : as_float.fds) EXPECT_FALSE(is_open_fd(fd)) << "fd " << fd << " was left open";
  const EndDescription as_receiver = with_copied_descriptors(sender);
  EXPECT_THROW((void)receiver_from_description<int>(as_receiver), TypeMismatch);
  for (const int fd : as_receiver.fds) EXPECT_FALSE(is_open_fd(fd)) << "fd " << fd << " was left open";
  EXPECT_EQ(test::count_open_fds(), fds_before);
  // The end described is untouched: the channel still works.
  tx.send(5);
  EXPECT_EQ(rx.recv().value(), 5);
}

TEST(EndDescriptionTest, EveryFailedRebuildClosesTheDescriptorsItWasHanded) {
  auto [tx, rx] = channel<int>(Transport::ShmRing);
  const std::size_t fds_before = test::count_open_fds();
  // One descriptor is not open: the others are closed all the same.
  EndDescription missing = with_copied_descriptors(describe_end(rx));
  ASSERT_EQ(missing.fds.size(), 2u);
  ASSERT_EQ(::close(missing.fds[1]), 0);
  EXPECT_THROW((void)receiver_from_description<int>(missing), Error);
  EXPECT_FALSE(is_open_fd(missing.fds[0]));
  // The transport refuses what it is handed (a ring rebuilt from a pipe's descriptors).
  auto [pipe_tx, pipe_rx] = channel<int>(Transport::Pipe);
  const std::size_t with_pipe = test::count_open_fds();
  EndDescription lying = with_copied_descriptors(describe_end(pipe_rx));
  lying.transport = Transport::ShmRing;
  EXPECT_THROW((void)receiver_from_description<int>(lying), Error);
  for (const int fd : lying.fds) EXPECT_FALSE(is_open_fd(fd)) << "fd " << fd << " was left open";
  // A description that names one descriptor twice is refused, and the descriptor closed once.
  EndDescription twice = with_copied_descriptors(describe_end(pipe_rx));
  ASSERT_EQ(::close(twice.fds[1]), 0);
  twice.fds[1] = twice.fds[0];
  EXPECT_THROW((void)receiver_from_description<int>(twice), ProtocolError);
  EXPECT_FALSE(is_open_fd(twice.fds[0]));
  EXPECT_EQ(test::count_open_fds(), with_pipe);
  pipe_tx.close();
  pipe_rx.close();
  EXPECT_EQ(test::count_open_fds(), fds_before);
  tx.send(1);
  EXPECT_EQ(rx.recv().value(), 1);
}

TEST(EndDescriptionTest, TransportsCheckWhatTheyAreRebuiltFrom) {
  try {
    (void)detail::reader_from_descriptors(Transport::InProcess, {}, FrameLimits{}, 0);
    FAIL() << "an in_process end was rebuilt from descriptors";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("in_process"), std::string::npos) << error.what();
  }
  EXPECT_THROW((void)detail::writer_from_descriptors(Transport::UnixSocket, {}, FrameLimits{}, 0), ProtocolError);
}

// A worker started by exec rebuilds its ends from their descriptions: every setting of the
// end must survive the trip (a ring's spin and peer check among them), and an isolated
// end gets a pool of the same settings.
TEST(EndDescriptionTest, EveryOptionSurvivesTheTripToAnExecdWorker) {
  ChannelOptions options;
  options.limits.max_body_bytes = 12345;
  options.limits.max_handles = 11;
  options.limits.max_segments = 12;
  options.limits.max_fds = 13;
  options.limits.max_releases = 14;
  options.limits.max_type_name_bytes = 1500;
  options.ring_capacity = 8192;
  options.ring_spin = std::chrono::nanoseconds(0);
  options.peer_check_interval = std::chrono::milliseconds(7);
  options.close_linger = std::chrono::milliseconds(250);
  options.pool = SharedAllocator(SharedAllocatorSettings{4 << 20, 1 << 20});
  auto [tx, rx] = channel<int>(Transport::ShmRing, options);
  std::stringstream bytes;
  {
    cereal::BinaryOutputArchive out(bytes);
    out(describe_end(rx));
  }
  EndDescription loaded;
  {
    cereal::BinaryInputArchive in(bytes);
    in(loaded);
  }
  const ChannelOptions& got = loaded.options;
  EXPECT_EQ(got.limits.max_body_bytes, 12345u);
  EXPECT_EQ(got.limits.max_handles, 11u);
  EXPECT_EQ(got.limits.max_segments, 12u);
  EXPECT_EQ(got.limits.max_fds, 13u);
  EXPECT_EQ(got.limits.max_releases, 14u);
  EXPECT_EQ(got.limits.max_type_name_bytes, 1500u);
  EXPECT_EQ(got.ring_capacity, 8192u);
  EXPECT_EQ(got.ring_spin, std::chrono::nanoseconds(0));
  EXPECT_EQ(got.peer_check_interval, std::chrono::milliseconds(7));
  EXPECT_EQ(got.close_linger, std::chrono::milliseconds(250));
  ASSERT_TRUE(got.pool.has_value());
  EXPECT_EQ(got.pool->settings().segment_bytes, std::size_t{4} << 20);
  EXPECT_EQ(got.pool->settings().max_cached_bytes, std::size_t{1} << 20);
}

TEST(SpawnForkTest, RunsLambdasWithCaptures) {
  const std::string prefix = "from a lambda";
  auto [senders, receivers] = channels<std::string>(2);
  auto workers = spawn(
      2,
      [&prefix](WorkerContext& context, Sender<std::string> out) {
        out.send(prefix + " " + std::to_string(context.rank()));
      },
      per_rank(std::move(senders)));
  EXPECT_EQ(receivers[0].recv().value(), "from a lambda 0");
  EXPECT_EQ(receivers[1].recv().value(), "from a lambda 1");
  workers.join();
}

// A forked worker is a copy of the whole process: while another thread runs, it may hold a
// lock the worker then waits for for ever. Fork refuses, and says what to do instead.
// Two threads: under ThreadSanitizer, whose own thread the check does not count, one of them
// could pass for it.
TEST(SpawnForkTest, RefusesToForkWhileOtherThreadsRunUnlessTold) {
  std::promise<void> stop;
  std::shared_future<void> done = stop.get_future().share();
  std::thread first([done] { done.wait(); });
  std::thread second([done] { done.wait(); });
  expect_spawn_error([] { (void)spawn(1, [](WorkerContext&) {}); }, "other thread(s), and a forked worker hangs");
  expect_spawn_error([] { (void)spawn(1, [](WorkerContext&) {}); }, "StartMethod::Spawn");
  SpawnOptions told;
  told.fork_with_threads = true;
  auto allowed = spawn(told, 1, [](WorkerContext&) {});
  allowed.join();
  stop.set_value();
  first.join();
  second.join();
  auto alone = spawn(1, [](WorkerContext&) {});
  alone.join();
}

// A thread whose function returned lingers in /proc/self/task for a moment (until the kernel
// has released it; after a join too), and one about to end is gone a moment later: Fork
// waits that moment out instead of refusing.
TEST(SpawnForkTest, ForksOnceAThreadThatIsEndingHasGone) {
  for (int i = 0; i < 20; ++i) {
    std::thread([] {}).detach();
    auto workers = spawn(1, [](WorkerContext&) {});
    workers.join();
  }
  std::thread joined([] {});
  joined.join();
  auto workers = spawn(1, [](WorkerContext&) {});
  workers.join();
}

// Fork copies arguments without serializing them, so containers of types cereal cannot
// save (walked for the tensors they hold) are fine, as they always were.
struct NotSerializable {
  int value = 0;
};

TEST(SpawnForkTest, TakesContainersOfTypesCerealCannotSave) {
  auto [tx, rx] = channel<int>(Transport::Pipe);
  std::map<int, std::function<int()>> functions{{1, [] { return 3; }}};
  auto workers = spawn(
      1,
      [](WorkerContext&, std::vector<NotSerializable> values, std::shared_ptr<NotSerializable> shared,
         std::map<int, std::function<int()>> calls,
         Sender<int> out) { out.send(values.at(0).value + shared->value + calls.at(1)()); },
      std::vector<NotSerializable>{{1}}, std::make_shared<NotSerializable>(NotSerializable{2}), functions,
      std::move(tx));
  EXPECT_EQ(rx.recv().value(), 6);
  workers.join();
}

// A polymorphic value cereal cannot save (its derived type is not registered with
// CEREAL_REGISTER_TYPE): cereal finds out only at run time, and Fork, which never saves
// it, passes it on as before.
struct Shape {
  virtual ~Shape() = default;
  virtual int corners() const = 0;
  template <class Archive>
  void serialize(Archive&) {}
};
struct Square : Shape {
  int corners() const override { return 4; }
  template <class Archive>
  void serialize(Archive&) {}
};

TEST(SpawnForkTest, TakesPolymorphicValuesCerealCannotSaveAtRunTime) {
  auto [tx, rx] = channel<int>(Transport::Pipe);
  auto workers = spawn(
      1, [](WorkerContext&, std::shared_ptr<Shape> shape, Sender<int> out) { out.send(shape->corners()); },
      std::shared_ptr<Shape>(std::make_shared<Square>()), std::move(tx));
  EXPECT_EQ(rx.recv().value(), 4);
  workers.join();
}

}  // namespace spawn_test
}  // namespace ferry
