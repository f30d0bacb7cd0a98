// Diagnostics (not a benchmark): what the CUDA calls on a CUDA tensor's path cost on this
// machine, and which /dev/shm entries CUDA's interprocess events leave behind. Plain CUDA
// runtime calls between two forked processes, no ferry code, so that ferry's own figures
// (roundtrip/ferry/*/cuda_*) can be read against the platform's floor.
//
// Usage: ferry_cuda_call_costs [ITERATIONS]     (default 2000; prints medians in microseconds)
#include <cuda.h>  // types and enums of the driver's stream memory operations (resolved at run time)
#include <cuda_runtime.h>
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "cuda_call_costs: %s failed: %s\n", what, cudaGetErrorString(status));
  std::exit(1);
}

void check_io(bool ok, const char* what) {
  if (ok) return;
  std::perror(what);
  std::exit(1);
}

void write_all(int fd, const void* data, std::size_t size) {
  check_io(::write(fd, data, size) == static_cast<ssize_t>(size), "write");
}

void read_all(int fd, void* data, std::size_t size) {
  auto* bytes = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t got = ::read(fd, bytes, size);
    check_io(got > 0, "read");
    bytes += got;
    size -= static_cast<std::size_t>(got);
  }
}

std::set<std::string> dev_shm_entries() {
  std::set<std::string> names;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return names;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.insert(name);
  }
  ::closedir(dir);
  return names;
}

void print_new_entries(const char* when, const std::set<std::string>& before) {
  std::string list;
  for (const auto& name : dev_shm_entries()) {
    if (!before.contains(name)) list += " " + name;
  }
  std::printf("  /dev/shm %-58s:%s\n", when, list.empty() ? " (nothing new)" : list.c_str());
  std::fflush(stdout);
}

double median_us(std::vector<double>& samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// Times `call` `iterations` times; median in microseconds.
double time_call(int iterations, const std::function<void()>& call) {
  std::vector<double> samples;
  samples.reserve(static_cast<std::size_t>(iterations));
  for (int i = 0; i < iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    call();
    samples.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  return median_us(samples);
}

// Driver functions, resolved through the runtime (no link to libcuda).
struct DriverCalls {
  CUresult (*write_value64)(CUstream, CUdeviceptr, cuuint64_t, unsigned int) = nullptr;
  CUresult (*wait_value64)(CUstream, CUdeviceptr, cuuint64_t, unsigned int) = nullptr;
  CUresult (*device_attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  bool memory_operations = false;  // 64-bit stream write/wait supported on device 0

  DriverCalls() {
    resolve("cuStreamWriteValue64", write_value64);
    resolve("cuStreamWaitValue64", wait_value64);
    resolve("cuDeviceGetAttribute", device_attribute);
    int supported = 0;
    if (write_value64 != nullptr && wait_value64 != nullptr && device_attribute != nullptr &&
        device_attribute(&supported, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 0) == CUDA_SUCCESS) {
      memory_operations = supported != 0;
    }
  }
  template <class Function>
  static void resolve(const char* name, Function& function) {
    void* address = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion(name, &address, 12000, cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      function = reinterpret_cast<Function>(address);
    }
  }
};

void check_driver(CUresult status, const char* what) {
  if (status == CUDA_SUCCESS) return;
  std::fprintf(stderr, "cuda_call_costs: %s failed: CUresult %d\n", what, static_cast<int>(status));
  std::exit(1);
}

struct Pipes {
  int to_consumer[2];
  int to_producer[2];
  Pipes() {
    check_io(::pipe(to_consumer) == 0, "pipe");
    check_io(::pipe(to_producer) == 0, "pipe");
  }
  // Each child keeps only its own ends, so that it reads end-of-file when its peer is gone.
  void keep_producer_ends() {
    ::close(to_consumer[0]);
    ::close(to_producer[1]);
  }
  void keep_consumer_ends() {
    ::close(to_consumer[1]);
    ::close(to_producer[0]);
  }
  // The parent's copies: closed once both children have theirs, so that a child whose peer
  // failed reads end-of-file instead of waiting for ever.
  void close_all() {
    for (int fd : {to_consumer[0], to_consumer[1], to_producer[0], to_producer[1]}) ::close(fd);
  }
};

pid_t fork_process(const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  check_io(pid >= 0, "fork");
  if (pid == 0) {
    const int status = body();
    std::fflush(nullptr);
    ::_exit(status);
  }
  return pid;
}

bool wait_ok(pid_t pid) {
  int status = 0;
  return ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

enum class Ending { DestroyThenExit, ExitWithoutDestroy, UnderscoreExitWithoutDestroy };

// Which /dev/shm entries an interprocess event makes, and which stay after each way to end.
void study_dev_shm(Ending ending, const char* title) {
  std::printf("%s\n", title);
  const std::set<std::string> before = dev_shm_entries();
  Pipes pipes;
  const pid_t producer = fork_process([&] {
    pipes.keep_producer_ends();
    check(cudaSetDevice(0), "cudaSetDevice");
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming), "cudaEventCreate");
    print_new_entries("producer: interprocess event created", before);
    cudaIpcEventHandle_t handle{};
    check(cudaIpcGetEventHandle(&handle, event), "cudaIpcGetEventHandle");
    print_new_entries("producer: cudaIpcGetEventHandle", before);
    check(cudaEventRecord(event, nullptr), "cudaEventRecord");
    write_all(pipes.to_consumer[1], &handle, sizeof handle);
    char done = 0;
    read_all(pipes.to_producer[0], &done, 1);
    if (ending == Ending::DestroyThenExit) {
      check(cudaEventDestroy(event), "cudaEventDestroy");
      print_new_entries("producer: event destroyed", before);
    }
    if (ending != Ending::UnderscoreExitWithoutDestroy) std::exit(0);
    return 0;
  });
  const pid_t consumer = fork_process([&] {
    pipes.keep_consumer_ends();
    cudaIpcEventHandle_t handle{};
    read_all(pipes.to_consumer[0], &handle, sizeof handle);
    check(cudaSetDevice(0), "cudaSetDevice");
    cudaEvent_t event = nullptr;
    check(cudaIpcOpenEventHandle(&event, handle), "cudaIpcOpenEventHandle");
    print_new_entries("consumer: cudaIpcOpenEventHandle", before);
    check(cudaStreamWaitEvent(nullptr, event, 0), "cudaStreamWaitEvent");
    check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
    if (ending == Ending::DestroyThenExit) {
      check(cudaEventDestroy(event), "cudaEventDestroy");
      print_new_entries("consumer: opened event destroyed", before);
    }
    const char done = 1;
    write_all(pipes.to_producer[1], &done, 1);
    if (ending != Ending::UnderscoreExitWithoutDestroy) std::exit(0);
    return 0;
  });
  pipes.close_all();
  const bool producer_ok = wait_ok(producer);
  const bool ok = wait_ok(consumer) && producer_ok;
  print_new_entries(ok ? "both processes ended" : "both processes ended (one FAILED)", before);
}

// One message of the round trips: what to do, and the flag value to wait for.
struct Ping {
  char kind;
  std::uint64_t sequence;
};

// The round trips measured, each against the plain one ('p').
struct RoundTripKind {
  char kind;
  const char* what;
};
constexpr RoundTripKind kRoundTrips[] = {
    {'p', "pipe round trip, no CUDA call"},
    {'e', "+ IPC event record / stream wait (default streams)"},
    {'o', "+ IPC event record / stream wait (own streams)"},
    {'E', "+ IPC event record / wait, consumer synchronizes"},
    {'S', "+ consumer synchronizes only (no event)"},
    {'v', "+ flag write / wait value (stream memory operations)"},
    {'V', "+ flag write / wait value, consumer synchronizes"},
};

bool uses_flag(char kind) { return kind == 'v' || kind == 'V'; }
bool uses_event(char kind) { return kind == 'e' || kind == 'o' || kind == 'E'; }

// The costs: single calls in each process, and pipe round trips with and without what a
// CUDA tensor adds (an event record / wait, or a flag write / wait, and the consumer's
// synchronization when it lets go of a storage).
void measure_costs(int iterations) {
  std::printf("\nmedian cost over %d calls (us)\n", iterations);
  Pipes pipes;
  struct Handles {
    cudaIpcEventHandle_t event;
    cudaIpcMemHandle_t flag;
    bool memory_operations;
  };
  const pid_t producer = fork_process([&] {
    pipes.keep_producer_ends();
    check(cudaSetDevice(0), "cudaSetDevice");
    const DriverCalls driver;
    Handles handles{};
    cudaEvent_t ipc_event = nullptr;
    check(cudaEventCreateWithFlags(&ipc_event, cudaEventInterprocess | cudaEventDisableTiming), "cudaEventCreate");
    check(cudaIpcGetEventHandle(&handles.event, ipc_event), "cudaIpcGetEventHandle");
    void* flag = nullptr;
    check(cudaMalloc(&flag, 4096), "cudaMalloc");
    check(cudaMemset(flag, 0, 4096), "cudaMemset");
    check(cudaIpcGetMemHandle(&handles.flag, flag), "cudaIpcGetMemHandle");
    handles.memory_operations = driver.memory_operations;
    cudaEvent_t local_event = nullptr;
    check(cudaEventCreateWithFlags(&local_event, cudaEventDisableTiming), "cudaEventCreate");
    cudaStream_t own_stream = nullptr;
    check(cudaStreamCreateWithFlags(&own_stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    write_all(pipes.to_consumer[1], &handles, sizeof handles);

    auto print = [](const char* what, double us) { std::printf("  producer %-56s %8.2f\n", what, us); };
    std::printf("  64-bit stream memory operations: %s\n", driver.memory_operations ? "supported" : "NOT supported");
    int device = 0;
    print("cudaGetDevice", time_call(iterations, [&] { check(cudaGetDevice(&device), "cudaGetDevice"); }));
    print("cudaEventRecord, local event, default stream",
          time_call(iterations, [&] { check(cudaEventRecord(local_event, nullptr), "record"); }));
    print("cudaEventRecord, interprocess event, default stream",
          time_call(iterations, [&] { check(cudaEventRecord(ipc_event, nullptr), "record"); }));
    print("cudaEventRecord, interprocess event, own stream",
          time_call(iterations, [&] { check(cudaEventRecord(ipc_event, own_stream), "record"); }));
    std::uint64_t sequence = 0;
    const auto flag_address = reinterpret_cast<CUdeviceptr>(flag);
    if (driver.memory_operations) {
      print("cuStreamWriteValue64, default stream", time_call(iterations, [&] {
              check_driver(driver.write_value64(nullptr, flag_address, ++sequence, 0), "cuStreamWriteValue64");
            }));
      print("cuStreamWaitValue64 (value reached), default stream", time_call(iterations, [&] {
              check_driver(driver.wait_value64(nullptr, flag_address, sequence, CU_STREAM_WAIT_VALUE_GEQ),
                           "cuStreamWaitValue64");
            }));
    }
    print("cudaIpcGetMemHandle (same block again)", time_call(iterations, [&] {
            cudaIpcMemHandle_t memory{};
            check(cudaIpcGetMemHandle(&memory, flag), "cudaIpcGetMemHandle");
          }));
    print("cudaStreamSynchronize (idle default stream)",
          time_call(iterations, [&] { check(cudaStreamSynchronize(nullptr), "sync"); }));
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::fflush(stdout);

    for (const RoundTripKind& round_trip : kRoundTrips) {
      if (uses_flag(round_trip.kind) && !driver.memory_operations) continue;
      std::vector<double> samples;
      for (int i = 0; i < iterations; ++i) {
        const auto start = std::chrono::steady_clock::now();
        if (uses_event(round_trip.kind)) {
          check(cudaEventRecord(ipc_event, round_trip.kind == 'o' ? own_stream : nullptr), "record");
        }
        if (uses_flag(round_trip.kind)) {
          check_driver(driver.write_value64(nullptr, flag_address, ++sequence, 0), "cuStreamWriteValue64");
        }
        const Ping ping{round_trip.kind, sequence};
        write_all(pipes.to_consumer[1], &ping, sizeof ping);
        char reply = 0;
        read_all(pipes.to_producer[0], &reply, 1);
        samples.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
      }
      print(round_trip.what, median_us(samples));
      std::fflush(stdout);
    }
    const Ping stop{'s', 0};
    write_all(pipes.to_consumer[1], &stop, sizeof stop);
    char done = 0;
    read_all(pipes.to_producer[0], &done, 1);
    check(cudaEventDestroy(ipc_event), "cudaEventDestroy");
    check(cudaEventDestroy(local_event), "cudaEventDestroy");
    check(cudaFree(flag), "cudaFree");
    std::exit(0);
    return 0;
  });
  const pid_t consumer = fork_process([&] {
    pipes.keep_consumer_ends();
    Handles handles{};
    read_all(pipes.to_consumer[0], &handles, sizeof handles);
    check(cudaSetDevice(0), "cudaSetDevice");
    const DriverCalls driver;
    cudaEvent_t ipc_event = nullptr;
    const auto open_start = std::chrono::steady_clock::now();
    check(cudaIpcOpenEventHandle(&ipc_event, handles.event), "cudaIpcOpenEventHandle");
    const double open_event_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - open_start).count();
    void* flag = nullptr;
    const auto open_flag_start = std::chrono::steady_clock::now();
    check(cudaIpcOpenMemHandle(&flag, handles.flag, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    const double open_flag_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - open_flag_start).count();
    cudaEvent_t local_event = nullptr;
    check(cudaEventCreateWithFlags(&local_event, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(local_event, nullptr), "record");
    cudaStream_t own_stream = nullptr;
    check(cudaStreamCreateWithFlags(&own_stream, cudaStreamNonBlocking), "cudaStreamCreate");
    std::vector<double> waits_default, waits_own, waits_value, syncs_after_event, syncs_after_value;
    auto since = [](std::chrono::steady_clock::time_point start) {
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    };
    for (;;) {
      Ping ping{};
      read_all(pipes.to_consumer[0], &ping, sizeof ping);
      if (ping.kind == 's') break;
      auto start = std::chrono::steady_clock::now();
      if (uses_event(ping.kind)) {
        check(cudaStreamWaitEvent(ping.kind == 'o' ? own_stream : nullptr, ipc_event, 0), "cudaStreamWaitEvent");
        (ping.kind == 'o' ? waits_own : waits_default).push_back(since(start));
      }
      if (uses_flag(ping.kind)) {
        check_driver(
            driver.wait_value64(nullptr, reinterpret_cast<CUdeviceptr>(flag), ping.sequence, CU_STREAM_WAIT_VALUE_GEQ),
            "cuStreamWaitValue64");
        waits_value.push_back(since(start));
      }
      if (ping.kind == 'E' || ping.kind == 'S' || ping.kind == 'V') {
        start = std::chrono::steady_clock::now();
        check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
        if (ping.kind == 'E') syncs_after_event.push_back(since(start));
        if (ping.kind == 'V') syncs_after_value.push_back(since(start));
      }
      write_all(pipes.to_producer[1], &ping.kind, 1);
    }
    auto print = [](const char* what, double us) { std::printf("  consumer %-56s %8.2f\n", what, us); };
    print("cudaIpcOpenEventHandle (once)", open_event_us);
    print("cudaIpcOpenMemHandle of the flag buffer (once)", open_flag_us);
    print("cudaStreamWaitEvent, interprocess event, default stream", median_us(waits_default));
    print("cudaStreamWaitEvent, interprocess event, own stream", median_us(waits_own));
    print("cudaStreamSynchronize after waiting for an IPC event", median_us(syncs_after_event));
    if (!waits_value.empty()) {
      print("cuStreamWaitValue64 on the producer's flag", median_us(waits_value));
      print("cudaStreamSynchronize after waiting for a flag value", median_us(syncs_after_value));
    }
    print("cudaStreamWaitEvent, local event, default stream",
          time_call(iterations, [&] { check(cudaStreamWaitEvent(nullptr, local_event, 0), "cudaStreamWaitEvent"); }));
    std::fflush(stdout);
    const char done = 1;
    write_all(pipes.to_producer[1], &done, 1);
    check(cudaEventDestroy(ipc_event), "cudaEventDestroy");
    check(cudaEventDestroy(local_event), "cudaEventDestroy");
    check(cudaIpcCloseMemHandle(flag), "cudaIpcCloseMemHandle");
    std::exit(0);
    return 0;
  });
  pipes.close_all();
  const bool producer_ok = wait_ok(producer);
  const bool ok = wait_ok(consumer) && producer_ok;
  if (!ok) std::printf("  a process FAILED (its stderr says why)\n");
}

// What a consumer's stream does when it waits for a producer that is SIGKILLed before its
// stream reached the signal: the producer's stream is held back by a gate that never opens,
// then signals (a fence write or an IPC event record); the consumer's stream waits for that
// signal; the producer is killed. Does the consumer's stream stay blocked, and can the
// consumer free it by writing the fence value itself?
void study_dead_producer(bool fence) {
  std::printf("\nconsumer waiting on a %s of a producer killed before signalling\n",
              fence ? "fence (flag value)" : "interprocess event");
  const std::set<std::string> before = dev_shm_entries();
  Pipes pipes;
  int from_parent[2];  // tells the consumer that the producer is dead
  check_io(::pipe(from_parent) == 0, "pipe");
  const int waiting_fd = ::dup(pipes.to_producer[0]);
  check_io(waiting_fd >= 0, "dup");
  struct Handles {
    cudaIpcEventHandle_t event;
    cudaIpcMemHandle_t flag;
  };
  const pid_t producer = fork_process([&] {
    pipes.keep_producer_ends();
    ::close(from_parent[0]);
    ::close(from_parent[1]);
    ::close(waiting_fd);
    check(cudaSetDevice(0), "cudaSetDevice");
    const DriverCalls driver;
    if (!driver.memory_operations) {
      std::printf("  skipped: no 64-bit stream memory operations here\n");
      std::exit(1);
    }
    Handles handles{};
    void* buffer = nullptr;  // word 0: the gate, word 1: the fence
    check(cudaMalloc(&buffer, 4096), "cudaMalloc");
    check(cudaMemset(buffer, 0, 4096), "cudaMemset");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    check(cudaIpcGetMemHandle(&handles.flag, buffer), "cudaIpcGetMemHandle");
    const auto gate = reinterpret_cast<CUdeviceptr>(buffer);
    check_driver(driver.wait_value64(nullptr, gate, 1, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue64 (gate)");
    if (fence) {
      check_driver(driver.write_value64(nullptr, gate + 8, 1, 0), "cuStreamWriteValue64");
    } else {
      cudaEvent_t event = nullptr;
      check(cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming), "cudaEventCreate");
      check(cudaEventRecord(event, nullptr), "cudaEventRecord");
      check(cudaIpcGetEventHandle(&handles.event, event), "cudaIpcGetEventHandle");
    }
    write_all(pipes.to_consumer[1], &handles, sizeof handles);
    for (;;) ::pause();  // until SIGKILL
    return 0;
  });
  const pid_t consumer = fork_process([&] {
    pipes.keep_consumer_ends();
    ::close(from_parent[1]);
    ::close(waiting_fd);
    Handles handles{};
    read_all(pipes.to_consumer[0], &handles, sizeof handles);
    check(cudaSetDevice(0), "cudaSetDevice");
    const DriverCalls driver;
    void* buffer = nullptr;
    check(cudaIpcOpenMemHandle(&buffer, handles.flag, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    const auto fence_word = reinterpret_cast<CUdeviceptr>(buffer) + 8;
    if (fence) {
      check_driver(driver.wait_value64(stream, fence_word, 1, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue64");
    } else {
      cudaEvent_t event = nullptr;
      check(cudaIpcOpenEventHandle(&event, handles.event), "cudaIpcOpenEventHandle");
      check(cudaStreamWaitEvent(stream, event, 0), "cudaStreamWaitEvent");
    }
    const char waiting = 1;
    write_all(pipes.to_producer[1], &waiting, 1);  // the parent kills the producer now
    char killed = 0;
    read_all(from_parent[0], &killed, 1);
    auto poll = [&](std::chrono::milliseconds limit) {
      const auto start = std::chrono::steady_clock::now();
      for (;;) {
        const cudaError_t status = cudaStreamQuery(stream);
        const auto waited =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
        if (status == cudaSuccess) return "completed after " + std::to_string(waited.count()) + " ms";
        if (status != cudaErrorNotReady) return std::string("failed: ") + cudaGetErrorName(status);
        if (waited > limit) return "STILL BLOCKED after " + std::to_string(waited.count()) + " ms";
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    };
    std::printf("  consumer's stream after the producer's death: %s\n", poll(std::chrono::milliseconds(3000)).c_str());
    if (fence && cudaStreamQuery(stream) == cudaErrorNotReady) {
      cudaStream_t helper = nullptr;
      check(cudaStreamCreateWithFlags(&helper, cudaStreamNonBlocking), "cudaStreamCreate");
      check_driver(driver.write_value64(helper, fence_word, 1, 0), "cuStreamWriteValue64 (consumer)");
      std::printf("  ... after the consumer wrote the fence value itself: %s\n",
                  poll(std::chrono::milliseconds(3000)).c_str());
    }
    std::fflush(stdout);
    ::_exit(0);
    return 0;
  });
  ::close(from_parent[0]);
  pipes.close_all();  // the consumer's "waiting" arrives through a duplicate kept below
  char waiting = 0;
  const bool consumer_waits = ::read(waiting_fd, &waiting, 1) == 1;
  ::close(waiting_fd);
  ::kill(producer, SIGKILL);
  wait_ok(producer);
  if (consumer_waits) {
    const char killed = 1;
    write_all(from_parent[1], &killed, 1);
  }
  ::close(from_parent[1]);
  int status = 0;
  for (int i = 0; i < 150 && ::waitpid(consumer, &status, WNOHANG) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (::waitpid(consumer, &status, WNOHANG) == 0) {
    std::printf("  the consumer did not end within 15 s: killed\n");
    ::kill(consumer, SIGKILL);
    ::waitpid(consumer, &status, 0);
  }
  print_new_entries("after both ended", before);
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::max(10, std::atoi(argv[1])) : 2000;
  std::printf("/dev/shm entries of interprocess events\n");
  study_dev_shm(Ending::DestroyThenExit, " each process destroys its event, then exit()");
  study_dev_shm(Ending::ExitWithoutDestroy, " no cudaEventDestroy, exit()");
  study_dev_shm(Ending::UnderscoreExitWithoutDestroy, " no cudaEventDestroy, _exit()");
  measure_costs(iterations);
  study_dead_producer(true);
  study_dead_producer(false);
  return 0;
}
