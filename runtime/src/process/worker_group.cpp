#include "ferry/worker_group.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <string>
#include <thread>

#include "ferry/detail/worker_table.hpp"
#include "ferry/wait_interruption.hpp"
#include "process/worker_launch.hpp"
#include "process/worker_report.hpp"

extern char** environ;

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;
// Waits longer than this wait for ever (and never overflow the clock).
constexpr std::chrono::hours kForever{24 * 365 * 100};

std::pair<detail::UniqueFd, detail::UniqueFd> make_report_pipe() {
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) throw_errno("pipe2 for a worker's report pipe");
  detail::UniqueFd read_end(ends[0]);
  detail::UniqueFd write_end(ends[1]);
  // Only the parent's end is non-blocking: a worker's report must not be cut short.
  if (::fcntl(read_end.get(), F_SETFL, O_NONBLOCK) != 0) throw_errno("fcntl(O_NONBLOCK) on a report pipe");
  return {std::move(read_end), std::move(write_end)};
}

// Empties the output buffers: before fork() (the child would write its copy of them again)
// and before a forked worker's _exit() (which would drop them). The standard C++ streams
// keep buffers of their own after std::ios::sync_with_stdio(false), which fflush() misses.
void flush_output() noexcept {
  try {
    std::cout.flush();
    std::clog.flush();
    std::wcout.flush();
    std::wclog.flush();
  } catch (...) {
    // A stream set to throw on failure: its output is lost either way.
  }
  std::fflush(nullptr);
}

// Polls `fds` until one is ready or `deadline`; false on timeout. Honours the thread's
// wait-interruption check (its exception leaves here); retries on other EINTRs.
bool poll_until(std::vector<pollfd>& fds, Clock::time_point deadline) {
  while (true) {
    timespec left{};
    const timespec* timeout = nullptr;
    const std::chrono::nanoseconds slice = detail::wait_interruption_slice();
    std::chrono::nanoseconds sleep = std::chrono::nanoseconds::max();
    if (deadline != Clock::time_point::max()) {
      sleep = std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::max(Clock::duration::zero(), deadline - Clock::now()));
    }
    const bool sliced = slice < sleep;  // cut short for the check
    sleep = std::min(sleep, slice);
    if (sleep != std::chrono::nanoseconds::max()) {
      left.tv_sec = static_cast<time_t>(sleep.count() / 1'000'000'000);
      left.tv_nsec = static_cast<long>(sleep.count() % 1'000'000'000);
      timeout = &left;
    }
    const int rc = ::ppoll(fds.data(), fds.size(), timeout, nullptr);
    if (rc > 0) return true;
    if (rc == 0 && !sliced) return false;
    if (rc < 0 && errno != EINTR) throw_errno("ppoll while supervising workers");
    detail::wait_interruption_point(rc < 0);  // may throw: the workers are left as they are
  }
}

Clock::time_point deadline_after(std::chrono::nanoseconds timeout) {
  if (timeout <= std::chrono::nanoseconds::zero()) return Clock::now();
  if (timeout > kForever) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
}

[[noreturn]] void throw_missing_init() {
  throw SpawnError(
      "the spawn start method re-executes this program, so main() must call ferry::init(argc, argv) before "
      "anything else; add that line (or use StartMethod::Fork)");
}

void check_descriptor(int fd, std::string_view what) {
  if (fd < 0 || ::fcntl(fd, F_GETFD) < 0) {
    throw SpawnError("cannot hand " + std::string(what) + " (fd " + std::to_string(fd) +
                     ") to a worker: the descriptor is not open");
  }
}

// The threads of this process (the entries of /proc/self/task); 0 when /proc cannot tell.
std::size_t thread_count() noexcept {
  std::error_code error;
  std::size_t count = 0;
  for (std::filesystem::directory_iterator it("/proc/self/task", error), end; !error && it != end;
       it.increment(error)) {
    ++count;
  }
  return error ? 0 : count;
}

// ThreadSanitizer runs a thread of its own in some processes (after a fork, for one): not
// counted there, so under it the check may miss one thread of the program.
#if defined(__SANITIZE_THREAD__)
constexpr std::size_t kSanitizerThreads = 1;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr std::size_t kSanitizerThreads = 1;
#else
constexpr std::size_t kSanitizerThreads = 0;
#endif
#else
constexpr std::size_t kSanitizerThreads = 0;
#endif

// Before a fork (see SpawnOptions::fork_with_threads).
void check_no_other_threads(const SpawnOptions& options) {
  if (options.fork_with_threads) return;
  // ferry's background threads (introspection's server) hold no lock a worker needs.
  const std::size_t allowed =
      1 + kSanitizerThreads + static_cast<std::size_t>(std::max(0, detail::background_threads()));
  std::size_t threads = thread_count();
  // A thread whose function returned (joined, or detached) stays listed until the kernel has
  // released it, a moment after join() returned: only a thread still listed a while later runs.
  const auto patience_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (threads > allowed && std::chrono::steady_clock::now() < patience_end) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    threads = thread_count();
  }
  if (threads <= allowed) return;
  throw SpawnError(
      "cannot fork a worker: this process runs " + std::to_string(threads - allowed) +
      " other thread(s), and a forked worker hangs if one of them held a lock at the fork (inside malloc, "
      "iostreams, a logger, a mutex of yours); use SpawnOptions::start_method = StartMethod::Spawn (the worker "
      "registered with FERRY_WORKER, and ferry::init in main), spawn before starting the threads, or set "
      "SpawnOptions::fork_with_threads if no other thread can hold a lock a worker needs");
}

}  // namespace

std::string_view start_method_name(StartMethod method) {
  switch (method) {
    case StartMethod::Fork: return "fork";
    case StartMethod::Spawn: return "spawn";
  }
  return "invalid";
}

WorkerGroup::WorkerGroup(int world_size, const SpawnOptions& options)
    : options_(options), parent_(::getpid()), table_key_(detail::new_worker_group_key()) {
  if (world_size <= 0) {
    throw SpawnError("cannot spawn " + std::to_string(world_size) +
                     " workers: the number of workers must be at least 1");
  }
  if (options.termination_grace.count() < 0) throw SpawnError("SpawnOptions::termination_grace must not be negative");
  if (options.parent_death_signal <= 0 || options.parent_death_signal >= NSIG) {
    throw SpawnError("SpawnOptions::parent_death_signal must be a signal number (SIGKILL, SIGTERM ...), not " +
                     std::to_string(options.parent_death_signal) + ": workers must never outlive their parent");
  }
  if (options.start_method == StartMethod::Spawn && detail::recorded_arguments() == nullptr) throw_missing_init();
  if (options.start_method == StartMethod::Fork) check_no_other_threads(options);
  struct sigaction current {};
  if (::sigaction(SIGCHLD, nullptr, &current) != 0) throw_errno("sigaction(SIGCHLD)");
  if (current.sa_handler == SIG_IGN || (current.sa_flags & SA_NOCLDWAIT) != 0) {
    throw SpawnError(
        "this process ignores SIGCHLD (or set SA_NOCLDWAIT), so the kernel would reap workers before ferry could "
        "read how they ended; restore the default action with signal(SIGCHLD, SIG_DFL) before spawning");
  }
  workers_.resize(static_cast<std::size_t>(world_size));
}

WorkerGroup& WorkerGroup::operator=(WorkerGroup&& other) noexcept {
  if (this != &other) {
    terminate();
    if (!workers_.empty()) detail::forget_worker_group(table_key_);
    table_key_ = other.table_key_;  // other's workers_ is left empty: its destructor forgets nothing
    options_ = other.options_;
    parent_ = other.parent_;
    workers_ = std::move(other.workers_);
    failure_ = std::move(other.failure_);
  }
  return *this;
}

WorkerGroup::~WorkerGroup() {
  if (running() > 0) terminate();
  if (!workers_.empty()) detail::forget_worker_group(table_key_);  // empty: moved from
}

WorkerGroup::Worker& WorkerGroup::prepare(int rank) {
  if (rank < 0 || rank >= size()) {
    throw SpawnError("worker rank " + std::to_string(rank) + " is outside this group of " + std::to_string(size()));
  }
  Worker& worker = workers_[static_cast<std::size_t>(rank)];
  if (worker.started) throw SpawnError("worker " + std::to_string(rank) + " was started already");
  return worker;
}

void WorkerGroup::start_forked(int rank, const std::function<void(WorkerContext&)>& body) {
  Worker& worker = prepare(rank);
  check_no_other_threads(options_);  // threads started since the group was made count too
  auto [report_read, report_write] = make_report_pipe();
  flush_output();  // buffered output must not be written twice
  const pid_t pid = ::fork();
  if (pid < 0) throw_errno("fork of worker " + std::to_string(rank));
  if (pid == 0) {
    // The worker. Never return into the caller's stack: always _exit.
    report_read.reset();
    const int bound = detail::bind_to_parent(parent_, options_.parent_death_signal);
    if (bound == -1) ::_exit(1);
    if (bound != 0) {
      detail::report_start_failure(report_write.get(), detail::StartStep::ParentDeathSignal, bound);
      ::_exit(127);
    }
    detail::unblock_all_signals();
    detail::set_worker_rank(rank);
    detail::run_forked_worker_hook();  // introspection's server, when the parent ran one
    const int status = detail::run_reported(report_write.get(), [&] {
      WorkerContext context(rank, size(), StartMethod::Fork, parent_);
      body(context);
    });
    flush_output();
    ::_exit(status);
  }
  report_write.reset();
  worker.process = detail::ChildProcess(pid);
  worker.report = std::move(report_read);
  worker.started = true;
  worker.method = StartMethod::Fork;
  detail::record_worker_started(table_key_, rank, pid);
}

void WorkerGroup::start_exec(int rank, std::string_view name, int payload_fd, std::span<const int> inherited) {
  const std::vector<std::string>* arguments = detail::recorded_arguments();
  if (arguments == nullptr) throw_missing_init();
  Worker& worker = prepare(rank);
  check_descriptor(payload_fd, "the argument payload");
  for (const int fd : inherited) check_descriptor(fd, "a channel end or tensor");
  auto [report_read, report_write] = make_report_pipe();

  // Everything the child needs is built before fork(): between fork() and exec() the child
  // may only make async-signal-safe calls (the parent may have other threads).
  std::vector<int> keep(inherited.begin(), inherited.end());
  keep.push_back(payload_fd);
  keep.push_back(report_write.get());
  detail::ExecWorkerSpec spec;
  spec.parent = parent_;
  spec.rank = rank;
  spec.world_size = size();
  spec.report_fd = report_write.get();
  spec.payload_fd = payload_fd;
  spec.parent_death_signal = options_.parent_death_signal;
  spec.name = std::string(name);
  std::vector<std::string> environment;
  const std::string prefix = std::string(detail::kWorkerVariable) + "=";
  // A parent that runs introspection (ferry::enable_introspection()) passes it on.
  const bool introspected = detail::introspection_for_workers();
  constexpr std::string_view kIntrospect = "FERRY_INTROSPECT=";
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view variable(*entry);
    if (variable.substr(0, prefix.size()) == prefix) continue;
    if (introspected && variable.substr(0, kIntrospect.size()) == kIntrospect) continue;
    environment.emplace_back(*entry);
  }
  if (introspected) environment.push_back(std::string(kIntrospect) + "1");
  environment.push_back(prefix + detail::encode_spec(spec));
  std::vector<char*> argv;
  argv.reserve(arguments->size() + 1);
  for (const std::string& argument : *arguments) argv.push_back(const_cast<char*>(argument.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  envp.reserve(environment.size() + 1);
  for (const std::string& variable : environment) envp.push_back(const_cast<char*>(variable.c_str()));
  envp.push_back(nullptr);
  const int report_fd = report_write.get();
  const pid_t parent = parent_;
  const int death_signal = options_.parent_death_signal;

  flush_output();
  const pid_t pid = ::fork();
  if (pid < 0) throw_errno("fork of worker " + std::to_string(rank));
  if (pid == 0) {
    const int bound = detail::bind_to_parent(parent, death_signal);
    if (bound == -1) ::_exit(1);
    if (bound != 0) {
      detail::report_start_failure(report_fd, detail::StartStep::ParentDeathSignal, bound);
      ::_exit(127);
    }
    detail::unblock_all_signals();
    for (const int fd : keep) {
      const int flags = ::fcntl(fd, F_GETFD);
      if (flags < 0 || ::fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC) != 0) {
        detail::report_start_failure(report_fd, detail::StartStep::InheritDescriptor, errno);
        ::_exit(127);
      }
    }
    ::execve("/proc/self/exe", argv.data(), envp.data());
    detail::report_start_failure(report_fd, detail::StartStep::Exec, errno);
    ::_exit(127);
  }
  report_write.reset();
  worker.process = detail::ChildProcess(pid);
  worker.report = std::move(report_read);
  worker.started = true;
  worker.method = StartMethod::Spawn;
  detail::record_worker_started(table_key_, rank, pid);
}

// ---- supervision -------------------------------------------------------------

void WorkerGroup::keep_until_exit(int rank, std::vector<std::shared_ptr<const void>> objects) {
  if (rank < 0 || rank >= size()) throw Error("worker rank " + std::to_string(rank) + " is outside the group");
  Worker& worker = workers_[static_cast<std::size_t>(rank)];
  if (!worker.process.running()) return;  // reaped already: nothing reads them any more
  worker.kept.insert(worker.kept.end(), std::make_move_iterator(objects.begin()),
                     std::make_move_iterator(objects.end()));
}

int WorkerGroup::running() const noexcept {
  return static_cast<int>(
      std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.process.running(); }));
}

pid_t WorkerGroup::pid(int rank) const {
  if (rank < 0 || rank >= size()) throw Error("worker rank " + std::to_string(rank) + " is outside the group");
  return workers_[static_cast<std::size_t>(rank)].process.pid();
}

std::optional<ExitStatus> WorkerGroup::exit_status(int rank) const {
  if (rank < 0 || rank >= size()) throw Error("worker rank " + std::to_string(rank) + " is outside the group");
  return workers_[static_cast<std::size_t>(rank)].process.status();
}

void WorkerGroup::drain_report(Worker& worker) {
  if (!worker.report) return;
  std::array<char, 4096> chunk{};
  while (true) {
    const ssize_t got = ::read(worker.report.get(), chunk.data(), chunk.size());
    if (got > 0) {
      worker.report_bytes.append(chunk.data(), static_cast<std::size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got == 0 || errno != EAGAIN) worker.report.reset();  // EOF (or a broken pipe): nothing more comes
    return;
  }
}

std::optional<WorkerFailed::Details> WorkerGroup::evaluate(int rank, Worker& worker, const ExitStatus& status) const {
  const detail::WorkerReport report = detail::parse_report(worker.report_bytes);
  WorkerFailed::Details details;
  details.rank = rank;
  details.world_size = size();
  details.pid = worker.process.pid();
  details.exit_code = status.exited ? status.code : 0;
  details.signal = status.exited ? 0 : status.signal;
  if (report.start_failed) {
    details.failure = WorkerFailure::StartFailed;
    details.message = report.start_failure;
  } else if (report.threw) {
    details.failure = WorkerFailure::Exception;
    details.exception_type = report.exception_type;
    details.message = report.exception_message;
  } else if (!status.exited) {
    details.failure = WorkerFailure::Signal;
  } else if (!report.started) {
    details.failure = WorkerFailure::StartFailed;
    details.message = status.describe() + " before running its worker function";
    if (worker.method == StartMethod::Spawn) {
      details.message +=
          "; a program that uses the spawn start method must call ferry::init(argc, argv) first "
          "thing in main()";
    }
  } else if (status.code != 0) {
    details.failure = WorkerFailure::ExitCode;
  } else {
    return std::nullopt;
  }
  return details;
}

std::optional<WorkerFailed::Details> WorkerGroup::collect() {
  std::optional<WorkerFailed::Details> first;
  for (std::size_t rank = 0; rank < workers_.size(); ++rank) {
    Worker& worker = workers_[rank];
    if (!worker.process.running()) continue;
    drain_report(worker);
    const std::optional<ExitStatus> status = worker.process.try_wait();
    if (!status) continue;
    drain_report(worker);  // everything it wrote is in the pipe now
    worker.report.reset();
    worker.kept.clear();
    auto failure = evaluate(static_cast<int>(rank), worker, *status);
    if (failure && !first) first = std::move(failure);
  }
  return first;
}

bool WorkerGroup::wait_until(Clock::time_point deadline) {
  if (failure_) throw *failure_;
  std::vector<pollfd> fds;
  while (true) {
    if (auto failure = collect()) {
      failure->terminated_siblings = stop_all();
      failure_.emplace(std::move(*failure));
      throw *failure_;
    }
    if (running() == 0) return true;
    fds.clear();
    for (const Worker& worker : workers_) {
      if (!worker.process.running()) continue;
      fds.push_back(pollfd{worker.process.pidfd(), POLLIN, 0});
      if (worker.report) fds.push_back(pollfd{worker.report.get(), POLLIN, 0});
    }
    if (!poll_until(fds, deadline)) {
      if (auto failure = collect()) {  // something may have ended right at the deadline
        failure->terminated_siblings = stop_all();
        failure_.emplace(std::move(*failure));
        throw *failure_;
      }
      return running() == 0;
    }
  }
}

void WorkerGroup::join() { wait_until(Clock::time_point::max()); }

bool WorkerGroup::join(Timeout timeout) { return wait_until(deadline_after(timeout.nanoseconds())); }

int WorkerGroup::stop_all() noexcept {
  const detail::WaitInterruptionSuspended uninterrupted;  // noexcept: stopping runs to its end
  int signalled = 0;
  for (Worker& worker : workers_) {
    if (!worker.process.running()) continue;
    try {
      worker.process.send_signal(SIGTERM);
      ++signalled;
    } catch (const Error&) {
      // Already gone or not ours any more: the reaping below settles it.
    }
  }
  // Compared in milliseconds: milliseconds::max() ("for ever") overflows in nanoseconds.
  const Clock::time_point grace_end =
      options_.termination_grace > kForever ? Clock::time_point::max() : Clock::now() + options_.termination_grace;
  std::vector<pollfd> fds;
  while (true) {
    fds.clear();
    for (Worker& worker : workers_) {
      if (!worker.process.running()) continue;
      try {
        if (worker.process.try_wait()) continue;
      } catch (const Error&) {
        continue;  // reaped by someone else: nothing to wait for
      }
      fds.push_back(pollfd{worker.process.pidfd(), POLLIN, 0});
    }
    if (fds.empty()) break;
    try {
      if (!poll_until(fds, grace_end)) break;
    } catch (const Error&) {
      break;
    }
  }
  for (Worker& worker : workers_) {
    if (!worker.process.running()) continue;
    try {
      worker.process.send_signal(SIGKILL);
      worker.process.wait();
    } catch (const Error&) {
      // See above.
    }
  }
  for (Worker& worker : workers_) {
    worker.report.reset();
    if (!worker.process.running()) worker.kept.clear();
  }
  return signalled;
}

void WorkerGroup::terminate() noexcept { stop_all(); }

}  // namespace ferry
