// The snapshot a ferry process sends (JSON schema version 1), as the tool reads it.
// Contract: parse_snapshot() accepts a version-1 document; fields it does not know are
// ignored, missing counters read as 0 (a newer or leaner server still shows), and a field
// of the wrong type, a reply that is not JSON, an {"error": ...} reply, or another version
// is refused with a CliError (bad_reply, or permission for a refusal) naming the pid.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ferry::cli {

/// A number of an open-ended section (shared memory, CUDA, a consumer's stats), by its
/// dotted path in that section ("devices.0.bytes").
struct NamedNumber {
  std::string name;
  double value = 0;
};

struct EndSnapshot {
  std::uint64_t id = 0;
  std::string direction;  ///< "send" or "recv"
  std::string label;
  std::string transport;
  std::optional<std::int64_t> peer_pid;
  std::string state;  ///< "open", "closed", "peer_died"
  std::uint64_t messages = 0;
  std::uint64_t bytes = 0;
  std::uint64_t tensors = 0;
  std::uint64_t new_segments = 0;
  std::optional<std::int64_t> in_flight;  ///< null: not known (no return board, or a receiver)
  std::uint64_t blocked_ns = 0;
  bool blocked_now = false;
  std::uint64_t last_activity_ns = 0;
};

struct ListenerSnapshot {
  std::string address;
  std::uint64_t accepted = 0;
  std::vector<std::pair<std::string, std::uint64_t>> refused;  ///< by reason
  std::uint64_t handshakes_in_progress = 0;
};

struct WorkerSnapshot {
  std::optional<std::int64_t> rank;
  std::int64_t pid = 0;
  std::string state;  ///< "running", "exited", "failed"
  std::optional<std::int64_t> exit_code;
  std::optional<std::int64_t> signal;
};

struct ConsumerSnapshot {
  std::uint64_t index = 0;
  std::vector<NamedNumber> numbers;                        ///< the other numeric fields
  std::vector<std::pair<std::string, std::string>> texts;  ///< the string fields (transport, ...)
};

struct FanoutSnapshot {
  std::string kind;  ///< "distributor" or "broadcast"
  std::string label;
  std::vector<ConsumerSnapshot> consumers;
};

struct Snapshot {
  std::string raw;  ///< the document as received
  std::int64_t version = 0;
  pid_t pid = 0;
  std::string program;
  std::string role;  ///< "main" or "worker"
  std::optional<std::int64_t> rank;
  std::uint64_t monotonic_ns = 0;
  std::vector<EndSnapshot> ends;
  std::vector<ListenerSnapshot> listeners;
  std::vector<NamedNumber> shared_memory;
  std::optional<std::vector<NamedNumber>> cuda;  ///< absent when the process has no CUDA
  std::vector<WorkerSnapshot> workers;
  std::vector<FanoutSnapshot> fanouts;

  /// A shared-memory figure by name (0 when the process does not report it).
  double shared_memory_value(const std::string& name) const;
};

/// The schema version this tool reads.
inline constexpr std::int64_t snapshot_schema_version = 1;

/// Parses `reply` from process `pid`; throws CliError (see above).
Snapshot parse_snapshot(pid_t pid, const std::string& reply);

}  // namespace ferry::cli
