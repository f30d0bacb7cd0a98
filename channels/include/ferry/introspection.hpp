// Introspection of a running process: what its channel ends, listeners, fan-outs, workers
// and shared memory are doing, as a Snapshot (in code) or as JSON over an abstract Unix
// socket that the `ferry` command reads (ferry ps / top / show / metrics).
//
// Contract:
// - snapshot() works whether introspection is on or off. The per-end counters (messages,
//   bytes, tensors, new segments, blocked time, last activity) are kept only while it is
//   on, so that a process that does not look pays nothing per message: they count from
//   when it was turned on. In flight is read off the connection as the snapshot is taken,
//   on or off.
// - Introspection is off by default. It is on when the environment variable
//   FERRY_INTROSPECT=1 is set as ferry starts in the process (read once), or after
//   enable_introspection(). While on, one background thread serves snapshots on the
//   abstract Unix socket "\0ferry-introspect.<pid>" to processes of the same user (or
//   root): nothing on disk, nothing left after the process dies. The wire protocol and the
//   JSON schema: docs/design/introspection.md.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ferry/fanout.hpp"
#include "ferry/shared_allocator.hpp"

namespace ferry {

/// One channel end alive in this process.
struct EndSnapshot {
  std::uint64_t id = 0;            ///< unique among this process's ends while they live
  bool sends = true;               ///< direction: "send" or "recv"
  std::string label;               ///< ChannelOptions::name
  std::string transport;           ///< transport_name(): "shm_ring", "pipe", "unix_socket", "ucx", "in_process"
  std::optional<pid_t> peer_pid;   ///< when known (endpoint connections)
  std::string state;               ///< "open", "closed" or "peer_died"
  std::uint64_t messages = 0;      ///< sent or received
  std::uint64_t bytes = 0;         ///< frame bytes on the wire (tensor data in shared memory not counted)
  std::uint64_t tensors = 0;       ///< tensor storages named by those messages
  std::uint64_t new_segments = 0;  ///< shared-memory segments they introduced to the receiver
  /// Sender: messages sent since Sender::track_delivery() (which fan-outs call) that its
  /// receiver has not returned from recv() yet, where the receiver records deliveries on
  /// the connection's return board (one host); nullopt (not known) otherwise, and for a
  /// receiver. Still told once the sender is closed.
  std::optional<std::uint64_t> in_flight;
  std::uint64_t blocked_ns = 0;       ///< total time waiting for room or for a message
  bool blocked_now = false;           ///< inside such a wait right now
  std::int64_t last_activity_ns = 0;  ///< CLOCK_MONOTONIC of the last message (0: none seen)
};

/// One listening endpoint.
struct ListenerSnapshot {
  std::string address;
  std::uint64_t accepted = 0;
  std::map<std::string, std::uint64_t> refused;  ///< by reason: "not_allowed", "malformed", ...
  std::uint64_t handshakes_in_progress = 0;
};

/// One worker this process spawned (whose group is still alive).
struct WorkerSnapshot {
  int rank = 0;
  pid_t pid = -1;
  std::string state;  ///< "running", "exited" (status 0) or "failed"
  std::optional<int> exit_code;
  std::optional<int> signal;
};

/// One Distributor or Broadcast.
struct FanoutSnapshot {
  std::string kind;  ///< "distributor" or "broadcast"
  std::string label;
  std::vector<ConsumerStats> consumers;
};

/// CUDA figures of the process (when ferry was built with CUDA and a device is in use).
struct CudaSnapshot {
  std::map<std::string, std::uint64_t> figures;
};

/// The introspection server's own counters.
struct IntrospectionServerStats {
  std::uint64_t served = 0;              ///< snapshots sent whole
  std::uint64_t refused_other_user = 0;  ///< clients of another user (not root): closed at once
  std::uint64_t dropped = 0;             ///< clients over the limit, too slow, or gone early
};

/// Everything introspection tells about this process (schema version 1).
struct Snapshot {
  int version = 1;
  pid_t pid = 0;
  std::string program;            ///< /proc/self/comm
  std::string role;               ///< "main" or "worker"
  std::optional<int> rank;        ///< a worker's rank
  std::int64_t monotonic_ns = 0;  ///< CLOCK_MONOTONIC when taken
  std::vector<EndSnapshot> ends;
  std::vector<ListenerSnapshot> listeners;
  SharedMemoryStats shared_memory;
  std::optional<CudaSnapshot> cuda;
  std::vector<WorkerSnapshot> workers;
  std::vector<FanoutSnapshot> fanouts;
  IntrospectionServerStats introspection;
};

/// The process's state now. Thread-safe; takes no lock a send or recv holds.
Snapshot snapshot();

/// `snapshot` as one line of JSON (schema: docs/design/introspection.md), ending in '\n'.
std::string to_json(const Snapshot& snapshot);

/// Turns introspection on: starts the thread that serves snapshots on
/// "\0ferry-introspect.<pid>". Idempotent; thread-safe. Throws SystemError when the socket
/// or thread cannot be made (another process cannot have this pid's name).
void enable_introspection();
/// Turns it off: stops the thread and closes the socket. Idempotent.
void disable_introspection() noexcept;
/// Whether introspection is on.
bool introspection_enabled() noexcept;

}  // namespace ferry
