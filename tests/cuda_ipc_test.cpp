// CUDA tensors between processes, on a real GPU, and staged through host memory for a
// connection without shared memory (ucx://). Every test skips, naming the reason, when
// no CUDA device can be used. CUDA does not survive fork(): the test process never touches
// CUDA; it forks a producer and a consumer, which do.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <numeric>
#include <set>
#include <string>
#include <thread>

#include "ferry/cuda.hpp"
#include "ferry/cuda/runtime.hpp"
#include "ferry/detail/cuda/hold_counter_board.hpp"
#include "ferry/detail/message_decoder.hpp"
#include "ferry/detail/message_encoder.hpp"
#include "ferry/detail/unique_fd.hpp"
#include "ferry/ferry.hpp"
#include "support/copied_frame.hpp"
#include "support/cuda_kernels.hpp"
#include "support/cuda_probe.hpp"
#include "support/leak_check.hpp"
#include "support/process.hpp"
#include "support/transports.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::fork_child;

struct CudaMessage {
  std::int64_t step = 0;
  std::vector<Tensor> tensors;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(step, tensors);
  }
};

// Both directions between a producer and a consumer process.
struct Link {
  explicit Link(Transport transport) {
    std::tie(tx, rx) = channel<CudaMessage>(transport);
    std::tie(back_tx, back_rx) = channel<CudaMessage>(transport);
  }
  Sender<CudaMessage> tx;
  Receiver<CudaMessage> rx;
  Sender<CudaMessage> back_tx;
  Receiver<CudaMessage> back_rx;
};

void check(cudaError_t status, const char* what) { cuda::check_cuda(status, what); }

std::vector<float> iota(std::size_t count, float first = 0.0f) {
  std::vector<float> values(count);
  std::iota(values.begin(), values.end(), first);
  return values;
}

std::vector<float> host_values(const Tensor& tensor) { return tensor.clone(Device::Cpu).to_vector<float>(); }

// Counts, with a kernel, the elements of a contiguous float CUDA tensor that are not `expected`.
unsigned long long mismatches(const Tensor& tensor, float expected) {
  unsigned long long count = 0;
  check(test::count_mismatches_on_device(static_cast<const float*>(tensor.data_ptr()), tensor.numel(), expected,
                                         cuda::current_stream(tensor.device().index), &count),
        "count_mismatches_on_device");
  return count;
}

// Tests that exercise the transport (how the hold-counter board reaches the receiver) run over
// every transport (CudaIpcTest); the others run over a Unix socket (CudaIpcFixture), which
// keeps the GPU check short: every test starts two CUDA processes.
class CudaIpcFixture : public test::LeakCheckedTest {
 protected:
  // Forks the producer and the consumer, each with its ends of `link`, and waits for both.
  void run(Link& link, const std::function<void()>& producer, const std::function<void()>& consumer,
           std::chrono::milliseconds timeout = 60s) {
    const pid_t producer_pid = fork_child([&] {
      link.rx.close();
      link.back_tx.detach();
      link.tx.adopt();
      producer();
    });
    const pid_t consumer_pid = fork_child([&] {
      link.tx.detach();
      link.back_rx.close();
      link.back_tx.adopt();
      consumer();
    });
    link.tx.detach();
    link.rx.close();
    link.back_tx.detach();
    link.back_rx.close();
    EXPECT_TRUE(test::child_succeeded(producer_pid, timeout)) << "the producer failed (its stderr says why)";
    EXPECT_TRUE(test::child_succeeded(consumer_pid, timeout)) << "the consumer failed (its stderr says why)";
  }

  // The sender queues a slow kernel that writes the tensor and sends at once; the receiver's
  // copy must see what the kernel wrote (its stream waited for the sender's signal), and the
  // send must not have waited for the kernel on the host, except with `signal` "synchronize".
  // `signal`: FERRY_CUDA_SEND_SIGNAL in the producer (nullptr: the default, a fence).
  void check_signal_ordering(Link& link, const char* signal, bool own_stream) {
    constexpr std::int64_t kCount = 1 << 16;
    constexpr std::uint64_t kDelayNs = 1'000'000'000;
    const bool synchronize_sends = signal != nullptr && std::string(signal) == "synchronize";
    run(
        link,
        [&] {
          if (signal != nullptr) ::setenv("FERRY_CUDA_SEND_SIGNAL", signal, 1);
          cudaStream_t stream = nullptr;
          if (own_stream) check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
          {
            cuda::StreamGuard guard(0, stream);
            Tensor tensor = Tensor::zeros({kCount}, DType::Float32, Device::Cuda(0));
            link.tx.send(CudaMessage{0, {tensor}});  // warm up: block export, signal, board
            CHILD_CHECK(link.back_rx.recv().has_value());
            check(test::slow_fill_on_device(static_cast<float*>(tensor.data_ptr()), kCount, 42.0f, kDelayNs, stream),
                  "slow_fill_on_device");
            const auto start = std::chrono::steady_clock::now();
            link.tx.send(CudaMessage{1, {tensor}});
            const auto took = std::chrono::steady_clock::now() - start;
            if (synchronize_sends) {
              CHILD_CHECK(took > 500ms);  // the fallback waits for the kernel
            } else {
              CHILD_CHECK(took < 300ms);  // no host synchronization on the hot path
            }
            CHILD_CHECK(link.back_rx.recv().has_value());
            link.tx.close();
          }
          if (stream != nullptr) check(cudaStreamDestroy(stream), "cudaStreamDestroy");
        },
        [&] {
          auto warm = link.rx.recv();
          CHILD_CHECK(warm.has_value());
          warm = std::nullopt;
          link.back_tx.send(CudaMessage{});
          auto message = link.rx.recv();
          CHILD_CHECK(message.has_value());
          const Tensor& tensor = message->tensors.at(0);
          CHILD_CHECK(mismatches(tensor, 42.0f) == 0);
          CHILD_CHECK(host_values(tensor) == std::vector<float>(kCount, 42.0f));
          const CudaIpcStats stats = cuda_ipc_stats();
          if (signal == nullptr) CHILD_CHECK(stats.fence_buffers_opened == 1 && stats.events_opened == 0);
          if (signal != nullptr && std::string(signal) == "event") {
            CHILD_CHECK(stats.fence_buffers_opened == 0 && stats.events_opened == 1);
          }
          link.back_tx.send(CudaMessage{});
          CHILD_CHECK(!link.rx.recv().has_value());
        });
  }
};

class CudaIpcTest : public CudaIpcFixture, public ::testing::WithParamInterface<Transport> {};

INSTANTIATE_TEST_SUITE_P(Transports, CudaIpcTest, ::testing::ValuesIn(test::interprocess_transports()),
                         test::transport_test_name);

TEST_P(CudaIpcTest, RoundTripSharesTheProducersMemory) {
  FERRY_SKIP_WITHOUT_GPU();
  constexpr std::int64_t kCount = 1 << 16;
  Link link(GetParam());
  run(
      link,
      [&] {
        Tensor tensor = Tensor::from(iota(kCount), {kCount}, Device::Cuda(0));
        link.tx.send(CudaMessage{1, {tensor}});
        auto reply = link.back_rx.recv();  // the consumer wrote 7 into the received tensor
        CHILD_CHECK(reply.has_value());
        CHILD_CHECK(mismatches(tensor, 7.0f) == 0);  // so the producer's memory holds 7: no copy was made
        link.tx.close();
      },
      [&] {
        auto message = link.rx.recv();
        CHILD_CHECK(message.has_value() && message->tensors.size() == 1);
        const Tensor& tensor = message->tensors[0];
        CHILD_CHECK(tensor.device() == Device::Cuda(0));
        CHILD_CHECK(tensor.storage()->received());
        CHILD_CHECK(host_values(tensor) == iota(kCount));
        check(test::fill_on_device(static_cast<float*>(tensor.data_ptr()), kCount, 7.0f, cuda::current_stream(0)),
              "fill_on_device");
        check(cudaStreamSynchronize(cuda::current_stream(0)), "cudaStreamSynchronize");
        link.back_tx.send(CudaMessage{2, {}});
        CHILD_CHECK(!link.rx.recv().has_value());
      });
}

TEST_P(CudaIpcTest, RepeatedSendsOpenTheBlockOnce) {
  FERRY_SKIP_WITHOUT_GPU();
  constexpr int kSends = 100;
  Link link(GetParam());
  run(
      link,
      [&] {
        Tensor tensor = Tensor::from(iota(1024, 1.0f), {1024}, Device::Cuda(0));
        for (int i = 0; i < kSends; ++i) link.tx.send(CudaMessage{i, {tensor}});
        for (int i = 0; i < kSends; ++i) CHILD_CHECK(link.back_rx.recv().has_value());
        link.tx.close();
      },
      [&] {
        Tensor first;
        const void* address = nullptr;
        for (int i = 0; i < kSends; ++i) {
          auto message = link.rx.recv();
          CHILD_CHECK(message.has_value());
          const Tensor& tensor = message->tensors.at(0);
          if (i == 0) {
            first = tensor;
            address = tensor.data_ptr();
          }
          // The first half keeps the first tensor alive: every later one is the same Storage.
          // The second half drops it: the lease keeps the block open, only a new Storage is made.
          if (i < kSends / 2) CHILD_CHECK(tensor.shares_storage_with(first));
          if (i == kSends / 2) first = Tensor();
          CHILD_CHECK(tensor.data_ptr() == address);
          link.back_tx.send(CudaMessage{i, {}});
        }
        const CudaIpcStats stats = cuda_ipc_stats();
        CHILD_CHECK(stats.blocks_opened == 1);
        CHILD_CHECK(stats.fence_buffers_opened + stats.events_opened == 1);  // one signal, opened once
        CHILD_CHECK(!link.rx.recv().has_value());
      });
}

TEST_F(CudaIpcFixture, StoragesAreOffsetsInsideOneBlock) {
  FERRY_SKIP_WITHOUT_GPU();
  Link link(Transport::UnixSocket);
  run(
      link,
      [&] {
        Tensor a = Tensor::from(iota(1024, 0.0f), {1024}, Device::Cuda(0));     // 4 KiB
        Tensor b = Tensor::from(iota(1024, 5000.0f), {1024}, Device::Cuda(0));  // the next 4 KiB of the block
        CHILD_CHECK(static_cast<const std::byte*>(b.data_ptr()) - static_cast<const std::byte*>(a.data_ptr()) == 4096);
        CHILD_CHECK(cuda_memory_stats(0).blocks == 1);
        link.tx.send(CudaMessage{1, {b}});     // an offset of 4096 in the block
        link.tx.send(CudaMessage{2, {a, b}});  // both, from the one opened block
        CHILD_CHECK(link.back_rx.recv().has_value());
        link.tx.close();
      },
      [&] {
        auto only_b = link.rx.recv();
        CHILD_CHECK(only_b.has_value());
        CHILD_CHECK(host_values(only_b->tensors.at(0)) == iota(1024, 5000.0f));
        auto both = link.rx.recv();
        CHILD_CHECK(both.has_value());
        const Tensor& a = both->tensors.at(0);
        const Tensor& b = both->tensors.at(1);
        CHILD_CHECK(host_values(a) == iota(1024, 0.0f));
        CHILD_CHECK(b.shares_storage_with(only_b->tensors.at(0)));
        CHILD_CHECK(static_cast<const std::byte*>(b.data_ptr()) - static_cast<const std::byte*>(a.data_ptr()) == 4096);
        CHILD_CHECK(cuda_ipc_stats().blocks_opened == 1);
        link.back_tx.send(CudaMessage{});
        CHILD_CHECK(!link.rx.recv().has_value());
      });
}

TEST_F(CudaIpcFixture, ViewsOfOneStorageArriveAsViewsOfOneStorage) {
  FERRY_SKIP_WITHOUT_GPU();
  Link link(Transport::UnixSocket);
  const Tensor host = Tensor::from(iota(32), {4, 8}, Device::Cpu);
  const std::vector<Tensor> host_views{host, host.slice(1, 2, 6), host.transpose(0, 1), host.select(0, 3),
                                       host.slice(0, 1, 4, 2)};
  run(
      link,
      [&] {
        Tensor tensor = host.clone(Device::Cuda(0));
        link.tx.send(CudaMessage{
            1, {tensor, tensor.slice(1, 2, 6), tensor.transpose(0, 1), tensor.select(0, 3), tensor.slice(0, 1, 4, 2)}});
        CHILD_CHECK(link.back_rx.recv().has_value());
        link.tx.close();
      },
      [&] {
        auto message = link.rx.recv();
        CHILD_CHECK(message.has_value() && message->tensors.size() == host_views.size());
        for (std::size_t i = 0; i < host_views.size(); ++i) {
          const Tensor& view = message->tensors[i];
          CHILD_CHECK(view.shares_storage_with(message->tensors[0]));
          CHILD_CHECK(view.shape() == host_views[i].shape());
          CHILD_CHECK(view.strides() == host_views[i].strides());
          CHILD_CHECK(view.storage_offset() == host_views[i].storage_offset());
          CHILD_CHECK(host_values(view) == host_views[i].to_vector<float>());
        }
        CHILD_CHECK(cuda_ipc_stats().blocks_opened == 1);
        link.back_tx.send(CudaMessage{});
        CHILD_CHECK(!link.rx.recv().has_value());
      });
}

TEST_F(CudaIpcFixture, ReceiverWaitsForTheSendersSlowKernel) {
  FERRY_SKIP_WITHOUT_GPU();
  Link link(Transport::UnixSocket);
  check_signal_ordering(link, nullptr, false);
}

TEST_F(CudaIpcFixture, ReceiverWaitsForASlowKernelOnTheSendersOwnStream) {
  FERRY_SKIP_WITHOUT_GPU();
  Link link(Transport::UnixSocket);
  check_signal_ordering(link, nullptr, true);
}

TEST_F(CudaIpcFixture, EventFallbackOrdersTheReceiverToo) {
  FERRY_SKIP_WITHOUT_GPU();
  const std::set<std::string> before = test::dev_shm_entries();
  Link link(Transport::UnixSocket);
  check_signal_ordering(link, "event", false);
  // The CUDA driver leaves one /dev/shm/cuda.shm.* file behind for every process that made an
  // interprocess event, even after cudaEventDestroy and exit (seen with driver 580): not
  // ferry's to keep, and the reason fences are the default. Remove the producer's, so that
  // the leak check sees what ferry itself left.
  int driver_files = 0;
  for (const std::string& name : test::dev_shm_entries()) {
    if (before.contains(name) || !name.starts_with("cuda.shm.")) continue;
    EXPECT_EQ(::unlink(("/dev/shm/" + name).c_str()), 0) << name;
    ++driver_files;
  }
  EXPECT_LE(driver_files, 1);
}

TEST_F(CudaIpcFixture, FallbackSynchronizesTheSender) {
  FERRY_SKIP_WITHOUT_GPU();
  Link link(Transport::UnixSocket);
  check_signal_ordering(link, "synchronize", false);
}

// A sender that moves to another stream: the new stream's signal must not let a receiver go
// on before the work that the earlier frame's signal covers (the new stream waits for the
// earlier signal first). Without that, the second frame's fence value would be written at
// once, and the receiver's wait for the first frame's smaller value would end with it.
TEST_F(CudaIpcFixture, ASignalOnAnotherStreamDoesNotOvertakeTheEarlierOne) {
  FERRY_SKIP_WITHOUT_GPU();
  constexpr std::int64_t kCount = 1 << 16;
  Link link(Transport::UnixSocket);
  run(
      link,
      [&] {
        cudaStream_t first = nullptr;
        cudaStream_t second = nullptr;
        check(cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking), "cudaStreamCreate");
        check(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking), "cudaStreamCreate");
        {
          Tensor slow = Tensor::zeros({kCount}, DType::Float32, Device::Cuda(0));
          Tensor quick = Tensor::zeros({kCount}, DType::Float32, Device::Cuda(0));
          {
            cuda::StreamGuard guard(0, first);
            check(test::slow_fill_on_device(static_cast<float*>(slow.data_ptr()), kCount, 42.0f, 1'000'000'000, first),
                  "slow_fill_on_device");
            link.tx.send(CudaMessage{1, {slow}});
          }
          {
            cuda::StreamGuard guard(0, second);  // nothing queued here
            link.tx.send(CudaMessage{2, {quick}});
          }
          CHILD_CHECK(link.back_rx.recv().has_value());
          link.tx.close();
        }
        check(cudaStreamDestroy(first), "cudaStreamDestroy");
        check(cudaStreamDestroy(second), "cudaStreamDestroy");
      },
      [&] {
        auto slow = link.rx.recv();
        auto quick = link.rx.recv();
        CHILD_CHECK(slow.has_value() && quick.has_value());
        CHILD_CHECK(mismatches(slow->tensors.at(0), 42.0f) == 0);
        CHILD_CHECK(mismatches(quick->tensors.at(0), 0.0f) == 0);
        link.back_tx.send(CudaMessage{});
        CHILD_CHECK(!link.rx.recv().has_value());
      });
}

// A producer SIGKILLed while the work before its send is still queued never writes the
// fence: the receiver's stream would wait for ever. The receiving process watches the
// producer and writes the value itself once the producer has exited. `through_ferry`: the
// consumer waits in ferry's own calls (a copy to the CPU, then letting go of the storage)
// instead of polling the stream itself.
void check_dead_producer_releases_the_consumer(bool through_ferry) {
  constexpr std::int64_t kCount = 1 << 16;
  constexpr std::uint64_t kWorkNs = 5'000'000'000;  // queued before the signal
  Link link(Transport::UnixSocket);
  const pid_t producer = fork_child([&] {
    link.rx.close();
    link.back_tx.detach();
    link.tx.adopt();
    Tensor tensor = Tensor::zeros({kCount}, DType::Float32, Device::Cuda(0));
    link.tx.send(CudaMessage{0, {tensor}});  // warm up: the fence buffer is open
    CHILD_CHECK(link.back_rx.recv().has_value());
    check(test::slow_fill_on_device(static_cast<float*>(tensor.data_ptr()), kCount, 42.0f, kWorkNs,
                                    cuda::current_stream(0)),
          "slow_fill_on_device");
    link.tx.send(CudaMessage{1, {tensor}});
    ::pause();  // until the consumer kills it
  });
  const pid_t consumer = fork_child([&] {
    link.tx.detach();
    link.back_rx.close();
    link.back_tx.adopt();
    auto warm = link.rx.recv();
    CHILD_CHECK(warm.has_value());
    warm = std::nullopt;
    link.back_tx.send(CudaMessage{});
    auto message = link.rx.recv();  // its fence waits for the producer's work
    CHILD_CHECK(message.has_value());
    const detail::UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, producer, 0)));
    CHILD_CHECK(static_cast<bool>(pidfd));
    const auto killed_at = std::chrono::steady_clock::now();
    auto since_kill = [&] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - killed_at)
          .count();
    };
    CHILD_CHECK(::kill(producer, SIGKILL) == 0);
    if (through_ferry) {
      (void)host_values(message->tensors.at(0));  // the values are undefined
      std::fprintf(stderr, "consumer: the copy to the CPU returned %lld ms after the kill\n",
                   static_cast<long long>(since_kill()));
    } else {
      long long exited = -1, released = -1, done = -1;
      while (done < 0 && since_kill() < 20'000) {
        pollfd entry{pidfd.get(), POLLIN, 0};
        if (exited < 0 && ::poll(&entry, 1, 0) == 1) exited = since_kill();
        if (released < 0 && cuda_ipc_stats().fences_released > 0) released = since_kill();
        const cudaError_t status = cudaStreamQuery(cuda::current_stream(0));
        if (status == cudaSuccess) done = since_kill();
        CHILD_CHECK(status == cudaSuccess || status == cudaErrorNotReady);
        std::this_thread::sleep_for(1ms);
      }
      std::fprintf(stderr,
                   "consumer: after the kill (ms): producer exited %lld, fence released %lld, stream done %lld\n",
                   exited, released, done);
      CHILD_CHECK(done >= 0);
    }
    CHILD_CHECK(since_kill() < 20'000);
    CHILD_CHECK(cuda_ipc_stats().fences_released == 1);
    message = std::nullopt;  // letting go synchronizes the stream: no hang there either
    try {
      (void)link.rx.recv();
      CHILD_CHECK(false);
    } catch (const PeerDied&) {
    }
  });
  link.tx.detach();
  link.rx.close();
  link.back_tx.detach();
  link.back_rx.close();
  EXPECT_TRUE(test::child_succeeded(consumer, 25s)) << "the consumer failed or hung (its stderr says why)";
  EXPECT_EQ(test::wait_child(producer).signal, SIGKILL);
}

TEST_F(CudaIpcFixture, AProducerKilledBeforeItsSignalDoesNotHangTheConsumer) {
  FERRY_SKIP_WITHOUT_GPU();
  check_dead_producer_releases_the_consumer(false);
}

TEST_F(CudaIpcFixture, AProducerKilledBeforeItsSignalDoesNotHangACopyToTheCpu) {
  FERRY_SKIP_WITHOUT_GPU();
  check_dead_producer_releases_the_consumer(true);
}

TEST_P(CudaIpcTest, ProducerKeepsMemoryInLimboUntilTheConsumerLetsGo) {
  FERRY_SKIP_WITHOUT_GPU();
  constexpr std::int64_t kCount = 1 << 20;  // 4 MiB: a range of a 20 MiB block
  constexpr std::size_t kBytes = kCount * sizeof(float);
  Link link(GetParam());
  run(
      link,
      [&] {
        const void* address = nullptr;
        {
          Tensor tensor = Tensor::from(std::vector<float>(kCount, 3.0f), {kCount}, Device::Cuda(0));
          address = tensor.data_ptr();
          link.tx.send(CudaMessage{1, {tensor}});
          CHILD_CHECK(link.back_rx.recv().has_value());  // the consumer holds it
        }
        CudaMemoryStats stats = cuda_memory_stats(0);
        CHILD_CHECK(stats.limbo_ranges == 1);
        CHILD_CHECK(stats.limbo_bytes == kBytes);
        CHILD_CHECK(cuda_collect() == 0);
        Tensor other = Tensor::zeros({kCount}, DType::Float32, Device::Cuda(0));
        CHILD_CHECK(other.data_ptr() != address);      // held memory is not handed out again
        link.tx.send(CudaMessage{2, {}});              // also announces that slot's release
        CHILD_CHECK(link.back_rx.recv().has_value());  // the consumer dropped it
        std::size_t freed = 0;
        for (int i = 0; i < 500 && freed == 0; ++i, std::this_thread::sleep_for(10ms)) freed = cuda_collect();
        CHILD_CHECK(freed == kBytes);
        stats = cuda_memory_stats(0);
        CHILD_CHECK(stats.limbo_ranges == 0);
        CHILD_CHECK(stats.allocated_bytes == kBytes);  // `other` only
        link.tx.close();
      },
      [&] {
        auto message = link.rx.recv();
        CHILD_CHECK(message.has_value());
        Tensor held = message->tensors.at(0);
        message = std::nullopt;
        link.back_tx.send(CudaMessage{});
        auto drop = link.rx.recv();  // the producer dropped its tensor before this frame
        CHILD_CHECK(drop.has_value());
        CHILD_CHECK(mismatches(held, 3.0f) == 0);  // still valid: the producer kept it in limbo
        CHILD_CHECK(cuda_ipc_stats().blocks_open == 1);
        held = Tensor();
        CHILD_CHECK(cuda_ipc_stats().blocks_open == 0);  // the lease was released: the block closed
        link.back_tx.send(CudaMessage{});
        CHILD_CHECK(!link.rx.recv().has_value());
      });
}

TEST_F(CudaIpcFixture, ConsumerKilledWithSigkillDoesNotPinTheProducer) {
  FERRY_SKIP_WITHOUT_GPU();
  Link link(Transport::UnixSocket);
  auto ready = channel<std::int64_t>(Transport::Pipe);   // producer -> test
  auto killed = channel<std::int64_t>(Transport::Pipe);  // test -> producer
  Sender<std::int64_t>& ready_tx = ready.first;
  Receiver<std::int64_t>& ready_rx = ready.second;
  Sender<std::int64_t>& killed_tx = killed.first;
  Receiver<std::int64_t>& killed_rx = killed.second;
  pid_t consumer_pid = 0;
  const pid_t producer = fork_child([&] {
    link.rx.close();
    link.back_tx.detach();
    link.tx.adopt();
    ready_rx.close();
    ready_tx.adopt();
    killed_tx.detach();
    {
      Tensor tensor = Tensor::zeros({1 << 18}, DType::Float32, Device::Cuda(0));
      link.tx.send(CudaMessage{1, {tensor}});
      CHILD_CHECK(link.back_rx.recv().has_value());
    }
    CHILD_CHECK(cuda_memory_stats(0).limbo_ranges == 1);  // the consumer holds it
    ready_tx.send(1);
    CHILD_CHECK(killed_rx.recv().has_value());
    std::size_t freed = 0;
    for (int i = 0; i < 500 && freed == 0; ++i, std::this_thread::sleep_for(10ms)) freed = cuda_collect();
    CHILD_CHECK(freed > 0);
    CHILD_CHECK(cuda_memory_stats(0).limbo_ranges == 0);
    CHILD_CHECK(cuda::outstanding_holds().counters == 0);
    // Sending to the dead consumer fails instead of hanging.
    try {
      for (int i = 0; i < 1000; ++i)
        link.tx.send(CudaMessage{2, {Tensor::zeros({16}, DType::Float32, Device::Cuda(0))}});
      CHILD_CHECK(false);
    } catch (const ChannelClosed&) {
    }
  });
  consumer_pid = fork_child([&] {
    link.tx.detach();
    link.back_rx.close();
    link.back_tx.adopt();
    ready_tx.detach();
    ready_rx.close();
    killed_tx.detach();
    killed_rx.close();
    auto message = link.rx.recv();
    CHILD_CHECK(message.has_value());
    link.back_tx.send(CudaMessage{});
    ::pause();  // holds the tensor until killed
  });
  link.tx.detach();
  link.rx.close();
  link.back_tx.detach();
  link.back_rx.close();
  ready_tx.detach();
  killed_rx.close();
  EXPECT_TRUE(ready_rx.recv_for(60s).has_value());
  ASSERT_EQ(::kill(consumer_pid, SIGKILL), 0);
  EXPECT_EQ(test::wait_child(consumer_pid).signal, SIGKILL);
  killed_tx.send(1);
  EXPECT_TRUE(test::child_succeeded(producer, 60s));
  ready_rx.close();
  killed_tx.close();
}

TEST_F(CudaIpcFixture, AReceivedTensorIsNotResentButItsCloneIs) {
  FERRY_SKIP_WITHOUT_GPU();
  Link link(Transport::UnixSocket);
  run(
      link,
      [&] {
        Tensor tensor = Tensor::from(iota(256), {256}, Device::Cuda(0));
        link.tx.send(CudaMessage{1, {tensor}});
        auto copy = link.back_rx.recv();  // the consumer's clone, in the consumer's memory
        CHILD_CHECK(copy.has_value());
        const Tensor& back = copy->tensors.at(0);
        CHILD_CHECK(back.storage()->received());
        CHILD_CHECK(!back.shares_storage_with(tensor));
        CHILD_CHECK(host_values(back) == iota(256));
        link.tx.close();
      },
      [&] {
        auto message = link.rx.recv();
        CHILD_CHECK(message.has_value());
        const Tensor received = message->tensors.at(0);
        try {
          link.back_tx.send(CudaMessage{1, {received.slice(0, 0, 10)}});
          CHILD_CHECK(false);
        } catch (const ChannelClosed&) {
          CHILD_CHECK(false);
        } catch (const Error& error) {
          CHILD_CHECK(std::string(error.what()).find("clone()") != std::string::npos);
        }
        link.back_tx.send(CudaMessage{2, {received.clone()}});
        CHILD_CHECK(!link.rx.recv().has_value());
      });
}

TEST(CudaCopyTest, CopiesBetweenHostAndDeviceKeepLayouts) {
  FERRY_SKIP_WITHOUT_GPU();
  const pid_t child = fork_child([] {
    const Tensor host = Tensor::from(iota(6 * 5), {6, 5}, Device::Cpu);
    Tensor device = host.clone(Device::Cuda(0));
    CHILD_CHECK(device.device() == Device::Cuda(0));
    CHILD_CHECK(host_values(device) == host.to_vector<float>());
    // Strided device source, to the host.
    CHILD_CHECK(host_values(device.transpose(0, 1)) == host.transpose(0, 1).to_vector<float>());
    CHILD_CHECK(host_values(device.slice(1, 1, 5, 2)) == host.slice(1, 1, 5, 2).to_vector<float>());
    // Host source into a strided device destination: only the view's elements change.
    Tensor column = device.select(1, 2);
    column.copy_from(Tensor::from(std::vector<float>(6, -1.0f), {6}, Device::Cpu));
    Tensor expected = host.clone();
    expected.select(1, 2).copy_from(Tensor::from(std::vector<float>(6, -1.0f), {6}, Device::Cpu));
    CHILD_CHECK(host_values(device) == expected.to_vector<float>());
    // Device to device, strided, and contiguous() of a device view.
    CHILD_CHECK(host_values(device.transpose(0, 1).contiguous()) == expected.transpose(0, 1).to_vector<float>());
    CHILD_CHECK(host_values(Tensor::zeros({7}, DType::Float32, Device::Cuda(0))) == std::vector<float>(7, 0.0f));
    CHILD_CHECK(Tensor::empty({0, 3}, DType::Float32, Device::Cuda(0)).device() == Device::Cuda(0));
  });
  EXPECT_TRUE(test::child_succeeded(child));
}

// A CUDA tensor on a connection without shared memory (ucx://: UCX as Debian builds it
// has no CUDA transport) travels as a copy of its storage's bytes in host memory, staged
// at the sender, and arrives on the receiver's CPU, each view with its layout.
TEST(CudaStagingTest, ACudaStorageOnACopyingConnectionTravelsAsAHostCopyOfItsBytes) {
  FERRY_SKIP_WITHOUT_GPU();
  const pid_t child = fork_child([] {
    const std::vector<float> values = iota(6 * 5);
    const Tensor host = Tensor::from(values, {6, 5}, Device::Cpu);
    const Tensor device = host.clone(Device::Cuda(0));
    detail::MessageEncoder encoder(detail::HandlePassing::Copying);
    const CudaMessage message{1, {device, device.transpose(0, 1), device.slice(1, 1, 5, 2)}};
    const test::CopiedFrame encoded = test::encode_copied(encoder, message);
    CHILD_CHECK(encoded.copies.size() == 1);  // one storage, staged once
    CHILD_CHECK(encoded.copies[0].iov_len == device.nbytes());
    CHILD_CHECK(encoded.copies[0].iov_base != device.data_ptr());
    CHILD_CHECK(std::memcmp(encoded.copies[0].iov_base, host.data_ptr(), host.nbytes()) == 0);
    detail::MessageDecoder decoder(detail::type_fingerprint<CudaMessage>(), detail::type_name<CudaMessage>());
    std::deque<detail::UniqueFd> fds;
    auto storages = test::deliver_copies(encoded.copies);
    decoder.decode(encoded.header, encoded.payload, fds, &storages);
    const CudaMessage received = decoder.read<CudaMessage>();
    CHILD_CHECK(received.tensors.size() == 3);
    CHILD_CHECK(received.tensors[0].device() == Device::SharedCpu);
    CHILD_CHECK(received.tensors[0].to_vector<float>() == values);
    CHILD_CHECK(received.tensors[1].to_vector<float>() == host.transpose(0, 1).to_vector<float>());
    CHILD_CHECK(received.tensors[2].to_vector<float>() == host.slice(1, 1, 5, 2).to_vector<float>());
    CHILD_CHECK(received.tensors[1].storage() == received.tensors[0].storage());
    CHILD_CHECK(device.device() == Device::Cuda(0));  // the sender's tensor stays where it was
  });
  EXPECT_TRUE(test::child_succeeded(child));
}

}  // namespace
}  // namespace ferry
