#include "ferry/introspection.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <mutex>

#include "ferry/cuda.hpp"
#include "ferry/detail/endpoint_core.hpp"
#include "ferry/detail/fanout_registry.hpp"
#include "ferry/detail/live_ends.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/detail/worker_table.hpp"
#include "introspection/describe_end.hpp"
#include "introspection/described_list.hpp"
#include "introspection/server.hpp"

namespace ferry {
namespace detail {

void describe_end(Snapshot& out, const EndStats& stats, const EndFacts& facts) {
  EndSnapshot& end = out.ends.emplace_back();
  constexpr auto relaxed = std::memory_order_relaxed;
  end.id = stats.id;
  end.sends = facts.sends;
  end.label = facts.label;
  end.transport = std::string(transport_name(facts.transport));
  // An endpoint's handshake names the peer; a pair made together tells it in shared memory.
  if (const std::int32_t peer = stats.peer_pid.load(relaxed); peer > 0) {
    end.peer_pid = peer;
  } else if (facts.pair_peer > 0) {
    end.peer_pid = facts.pair_peer;
  }
  end.state = stats.peer_died.load(relaxed) ? "peer_died" : facts.open ? "open" : "closed";
  end.messages = stats.messages.load(relaxed);
  end.bytes = stats.bytes_moved();
  end.tensors = stats.tensors.load(relaxed);
  end.new_segments = stats.new_segments.load(relaxed);
  end.in_flight = facts.in_flight;
  const std::int64_t since = stats.blocked_since_ns.load(relaxed);
  end.blocked_now = since != 0;
  end.blocked_ns = stats.blocked_ns.load(relaxed);
  // The wait in progress counts too: a stalled end's figure grows while it stalls.
  if (since != 0 && out.monotonic_ns > since) end.blocked_ns += static_cast<std::uint64_t>(out.monotonic_ns - since);
  end.last_activity_ns = stats.last_activity_ns.load(relaxed);
}

// ---- listeners ------------------------------------------------------------------

const char* ListenerCore::refusal_name(Refusal refusal) noexcept {
  switch (refusal) {
    case Refusal::NotAllowed: return "not_allowed";
    case Refusal::VersionMismatch: return "version_mismatch";
    case Refusal::TypeMismatch: return "type_mismatch";
    case Refusal::TransportMismatch: return "transport_mismatch";
    case Refusal::Malformed: return "malformed";
    case Refusal::HandshakeTimeout: return "handshake_timeout";
    case Refusal::Unavailable: return "unavailable";
    case Refusal::ClientLeft: return "client_left";
  }
  return "unknown";
}

void ListenerCore::count_accepted() noexcept { EndStats::add(accepted_, 1); }

void ListenerCore::count_refusal(Refusal refusal) noexcept {
  EndStats::add(refused_[static_cast<std::size_t>(refusal)], 1);
}

void ListenerCore::describe(Snapshot& out) const {
  ListenerSnapshot& listener = out.listeners.emplace_back();
  listener.address = address();
  listener.accepted = accepted_.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < kRefusals; ++i) {
    if (const std::uint64_t count = refused_[i].load(std::memory_order_relaxed)) {
      listener.refused[refusal_name(static_cast<Refusal>(i))] = count;
    }
  }
  listener.handshakes_in_progress = pending_now_.load(std::memory_order_relaxed);
}

// ---- fan-outs -------------------------------------------------------------------

namespace {

struct RegisteredFanout {
  const char* kind;
  void* fanout;
  TryFanoutStats stats;
  std::string label;
  std::vector<ConsumerStats> last;  // what try_stats() gave last
};

struct FanoutList {
  detail::Mutex mutex;
  std::vector<RegisteredFanout> fanouts FERRY_GUARDED_BY(mutex);
};

FanoutList& fanout_list() {
  static FanoutList* instance = [] {
    auto* created = new FanoutList();  // never destroyed: fan-outs may outlive static destruction
    // (The analysis cannot follow a lock taken in one handler and released in another.)
    const int rc = ::pthread_atfork([]() FERRY_NO_THREAD_SAFETY_ANALYSIS { fanout_list().mutex.lock(); },
                                    []() FERRY_NO_THREAD_SAFETY_ANALYSIS { fanout_list().mutex.unlock(); },
                                    []() FERRY_NO_THREAD_SAFETY_ANALYSIS { fanout_list().mutex.unlock(); });
    if (rc != 0) throw_system_error("pthread_atfork", rc);
    return created;
  }();
  return *instance;
}

[[maybe_unused]] const FanoutList& g_fanout_list_made_at_start = fanout_list();

}  // namespace

FanoutRegistration::FanoutRegistration(const char* kind, void* fanout, TryFanoutStats stats, std::string label)
    : fanout_(fanout) {
  FanoutList& list = fanout_list();
  const detail::MutexLock lock(list.mutex);
  list.fanouts.push_back(RegisteredFanout{kind, fanout, stats, std::move(label), {}});
}

FanoutRegistration::~FanoutRegistration() {
  FanoutList& list = fanout_list();
  const detail::MutexLock lock(list.mutex);
  std::erase_if(list.fanouts, [&](const RegisteredFanout& entry) { return entry.fanout == fanout_; });
}

void describe_fanouts(Snapshot& out) {
  FanoutList& list = fanout_list();
  const detail::MutexLock lock(list.mutex);
  for (RegisteredFanout& entry : list.fanouts) {
    if (auto now = entry.stats(entry.fanout)) entry.last = std::move(*now);
    out.fanouts.push_back(FanoutSnapshot{entry.kind, entry.label, entry.last});
  }
}

}  // namespace detail

// ---- the snapshot -----------------------------------------------------------------

namespace {

std::string program_name() {
  std::string name;
  const int fd = ::open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    std::array<char, 64> buffer{};
    ssize_t got = -1;
    do {
      got = ::read(fd, buffer.data(), buffer.size());
    } while (got < 0 && errno == EINTR);
    ::close(fd);
    if (got > 0) name.assign(buffer.data(), static_cast<std::size_t>(got));
  }
  while (!name.empty() && (name.back() == '\n' || name.back() == '\0')) name.pop_back();
  return name;
}

std::optional<CudaSnapshot> cuda_figures() {
  CudaSnapshot cuda;
  const CudaIpcStats ipc = cuda_ipc_stats();
  bool used = ipc.blocks_opened != 0 || ipc.events_opened != 0 || ipc.fence_buffers_opened != 0;
  cuda.figures["ipc_blocks_opened"] = ipc.blocks_opened;
  cuda.figures["ipc_blocks_closed"] = ipc.blocks_closed;
  cuda.figures["ipc_blocks_open"] = ipc.blocks_open;
  cuda.figures["ipc_events_opened"] = ipc.events_opened;
  cuda.figures["ipc_fence_buffers_opened"] = ipc.fence_buffers_opened;
  cuda.figures["ipc_fences_released"] = ipc.fences_released;
  // The allocator of each device this process allocated on (asking makes no CUDA call).
  constexpr int kDevicesLookedAt = 16;
  for (int device = 0; device < kDevicesLookedAt; ++device) {
    const CudaMemoryStats memory = cuda_memory_stats(device);
    if (memory.blocks == 0 && memory.reserved_bytes == 0 && memory.limbo_ranges == 0) continue;
    used = true;
    const std::string prefix = "device" + std::to_string(device) + "_";
    cuda.figures[prefix + "reserved_bytes"] = memory.reserved_bytes;
    cuda.figures[prefix + "allocated_bytes"] = memory.allocated_bytes;
    cuda.figures[prefix + "limbo_bytes"] = memory.limbo_bytes;
    cuda.figures[prefix + "limbo_ranges"] = memory.limbo_ranges;
    cuda.figures[prefix + "blocks"] = memory.blocks;
  }
  if (!used) return std::nullopt;
  return cuda;
}

WorkerSnapshot worker_snapshot(const detail::StartedWorker& entry) {
  WorkerSnapshot worker;
  worker.rank = entry.rank;
  worker.pid = entry.pid;
  if (!entry.status) {
    worker.state = "running";
  } else {
    worker.state = entry.status->success() ? "exited" : "failed";
    if (entry.status->exited) {
      worker.exit_code = entry.status->code;
    } else {
      worker.signal = entry.status->signal;
    }
  }
  return worker;
}

}  // namespace

Snapshot snapshot() {
  Snapshot out;
  out.pid = ::getpid();
  out.program = program_name();
  out.rank = detail::worker_rank();
  out.role = out.rank ? "worker" : "main";
  out.monotonic_ns = detail::monotonic_ns();
  // One lock at a time (each list's, then the allocator's): a fork() in another thread,
  // whose handlers take these locks one by one, never waits on this thread in a cycle.
  // Where the server samples last activity every tick, a snapshot samples too: an end that
  // moved a message since the last tick shows as active now.
  if (introspection_enabled()) detail::sample_live_ends_activity(out.monotonic_ns);
  detail::describe_live_ends(out);
  detail::describe_listed(out);
  std::sort(out.ends.begin(), out.ends.end(), [](const EndSnapshot& a, const EndSnapshot& b) { return a.id < b.id; });
  out.shared_memory = shared_memory_stats();
  out.cuda = cuda_figures();
  for (const detail::StartedWorker& entry : detail::recorded_workers()) out.workers.push_back(worker_snapshot(entry));
  detail::describe_fanouts(out);
  out.introspection = detail::introspection_server_stats();
  return out;
}

}  // namespace ferry
