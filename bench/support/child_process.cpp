#include "support/child_process.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <thread>

namespace ferry::bench {

namespace {

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  (void)::sched_setaffinity(0, sizeof set, &set);  // best effort: an unpinned run is still valid
}

}  // namespace

ChildProcess::ChildProcess(const std::function<void()>& body, Placement placement, std::chrono::milliseconds grace)
    : grace_(grace) {
  std::fflush(nullptr);
  cpu_set_t allowed;
  const bool pin = placement != Placement::Anywhere && ::sched_getaffinity(0, sizeof allowed, &allowed) == 0 &&
                   CPU_COUNT(&allowed) >= 2;
  int first = -1, last = -1;
  for (int cpu = 0; pin && cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    if (first < 0) first = cpu;
    last = cpu;
  }
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    if (pin) pin_to(placement == Placement::FirstCpu ? first : last);
    int status = 0;
    try {
      body();
    } catch (const std::exception& error) {
      std::fprintf(stderr, "benchmark child failed: %s\n", error.what());
      status = 1;
    }
    std::fflush(nullptr);
    ::_exit(status);
  }
  if (pin && placement == Placement::AcrossFromCaller) {
    saved_affinity_ = allowed;
    restore_affinity_ = true;
    pin_to(first);
  }
}

ChildProcess::~ChildProcess() {
  if (restore_affinity_) (void)::sched_setaffinity(0, sizeof saved_affinity_, &saved_affinity_);
  const auto deadline = std::chrono::steady_clock::now() + grace_;
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace ferry::bench
