// The watch over fence producers (see fence_watch.hpp): one thread per receiving process,
// started with the first fence it waits for, polling a pidfd per producer.
#include "cuda/fence_watch.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/memory_operations.hpp"
#include "ferry/detail/process_handle.hpp"
#include "ferry/detail/unique_fd.hpp"

namespace ferry::cuda {
namespace {

std::atomic<std::uint64_t> g_released{0};

// What the watch writes into a dead producer's fence word: far above any value a sender
// reaches (one per frame), and no more than 2^63 above any of them, since cuStreamWaitValue64's
// GEQ compares cyclically ((int64_t)(word - value) >= 0). The same value for every word and
// every process: a word may be waited on by several connections (words are lent again) and
// several receiving processes, whose watches all write it, in any order, and a lower value
// written after a higher one would take the word back below what a stream waits for.
constexpr std::uint64_t kDeadProducerFence = std::uint64_t{1} << 62;

struct WatchedFence {
  std::weak_ptr<ReceivedCudaRange> buffer;  // weak: the connection decides when it is closed
  std::uint64_t offset = 0;
  int device = 0;
};

struct Producer {
  ferry::detail::ProcessHandle pidfd;
  std::map<std::pair<const void*, std::uint64_t>, WatchedFence> fences;  // by (buffer, offset)
};

class FenceWatch {
 public:
  static FenceWatch& get() {
    static auto* instance = new FenceWatch();  // leaked: its thread runs until the process exits
    return *instance;
  }

  void watch(pid_t producer, const std::shared_ptr<ReceivedCudaRange>& buffer, std::uint64_t offset, int device) {
    (void)stream_for(device);  // now, not when a producer has died
    std::unique_lock lock(mutex_);
    auto it = producers_.find(producer);
    if (it == producers_.end()) {
      ferry::detail::ProcessHandle pidfd = ferry::detail::ProcessHandle::open(producer);
      if (!pidfd) {
        const bool gone = pidfd.error() == ESRCH;
        lock.unlock();
        if (gone) {  // exited already: nobody else will write the value
          Producer dead;
          dead.fences[{buffer.get(), offset}] = WatchedFence{buffer, offset, device};
          release(dead);
        } else {
          static std::once_flag once;
          std::call_once(once, [] {
            std::fprintf(stderr,
                         "ferry: warning: cannot watch CUDA producers (no pidfd_open): a stream waiting for a "
                         "producer that dies before its GPU work is done stays blocked\n");
          });
        }
        return;
      }
      it = producers_.emplace(producer, Producer{std::move(pidfd), {}}).first;
      start_locked();
      wake();
    }
    WatchedFence& fence = it->second.fences[{buffer.get(), offset}];
    if (fence.buffer.expired()) fence = WatchedFence{buffer, offset, device};
  }

 private:
  FenceWatch() = default;

  void start_locked() {
    if (thread_started_) return;
    wake_fd_ = ferry::detail::UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake_fd_) return;  // retried with the next producer
    try {
      std::thread([this] { run(); }).detach();
    } catch (const std::system_error& error) {
      // No thread now (out of threads or memory): the frame goes on unwatched, and the next
      // producer tries again. An exception here would escape the frame's CUDA error handling.
      std::fprintf(stderr, "ferry: warning: cannot start the watch over CUDA producers: %s\n", error.what());
      return;
    }
    thread_started_ = true;
  }

  void wake() {
    const std::uint64_t one = 1;
    if (wake_fd_) (void)!::write(wake_fd_.get(), &one, sizeof one);
  }

  void run() {
    std::vector<pollfd> polled;
    std::vector<pid_t> pids;
    for (;;) {
      {
        std::lock_guard lock(mutex_);
        polled.assign(1, pollfd{wake_fd_.get(), POLLIN, 0});
        pids.assign(1, 0);
        for (const auto& [pid, producer] : producers_) {
          polled.push_back(pollfd{producer.pidfd.fd(), POLLIN, 0});
          pids.push_back(pid);
        }
      }
      if (::poll(polled.data(), polled.size(), -1) < 0) {
        if (errno == EINTR) continue;
        std::fprintf(stderr, "ferry: warning: the watch over CUDA producers stopped (poll failed)\n");
        return;
      }
      if (polled[0].revents != 0) {
        std::uint64_t count = 0;
        (void)!::read(wake_fd_.get(), &count, sizeof count);
      }
      for (std::size_t i = 1; i < polled.size(); ++i) {
        if (polled[i].revents == 0) continue;
        Producer dead;
        {
          std::lock_guard lock(mutex_);
          auto it = producers_.find(pids[i]);
          if (it == producers_.end()) continue;
          dead = std::move(it->second);
          producers_.erase(it);
        }
        release(dead);
      }
    }
  }

  // Writes every fence of a dead producer, on a stream of this process's own (made when the
  // device's first fence was watched, so that the release needs no more than the write and
  // its synchronization). kDeadProducerFence is written, which every wait, earlier or later,
  // on the word passes.
  void release(Producer& dead) noexcept {
    const MemoryOperations& operations = MemoryOperations::get();
    for (auto& [key, fence] : dead.fences) {
      const std::shared_ptr<ReceivedCudaRange> buffer = fence.buffer.lock();
      if (!buffer) continue;  // closed: nobody waits on it any more
      try {
        DeviceGuard guard(fence.device);
        const cudaStream_t stream = stream_for(fence.device);
        const auto address = reinterpret_cast<CUdeviceptr>(buffer->data() + fence.offset);
        check_driver(operations.write_value(stream, address, kDeadProducerFence, 0),
                     "cuStreamWriteValue64 for a dead producer's fence");
        check_cuda(cuda::cudart().cudaStreamSynchronize(stream),
                   "cudaStreamSynchronize after writing a dead producer's fence");
        g_released.fetch_add(1, std::memory_order_relaxed);
      } catch (const std::exception& error) {
        std::fprintf(stderr, "ferry: warning: cannot free a stream waiting for a dead producer: %s\n", error.what());
      }
    }
  }

  // The watch's own stream on `device` (made on first use, kept for the process's life).
  cudaStream_t stream_for(int device) {
    std::lock_guard lock(streams_mutex_);
    auto it = streams_.find(device);
    if (it != streams_.end()) return it->second;
    DeviceGuard guard(device);
    cudaStream_t stream = nullptr;
    check_cuda(cuda::cudart().cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
               "cudaStreamCreate for the fence watch");
    return streams_.emplace(device, stream).first->second;
  }

  std::mutex mutex_;
  std::map<pid_t, Producer> producers_;
  std::mutex streams_mutex_;
  std::map<int, cudaStream_t> streams_;
  ferry::detail::UniqueFd wake_fd_;
  bool thread_started_ = false;
};

}  // namespace

void watch_fence(pid_t producer, const std::shared_ptr<ReceivedCudaRange>& buffer, std::uint64_t offset, int device) {
  FenceWatch::get().watch(producer, buffer, offset, device);
}

std::uint64_t fences_released_for_dead_producers() noexcept { return g_released.load(std::memory_order_relaxed); }

}  // namespace ferry::cuda
