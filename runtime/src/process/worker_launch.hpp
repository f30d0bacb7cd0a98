// How a worker process is told what to run, and its first steps (private to runtime/).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::detail {

/// The environment variable that makes a re-executed program a worker.
inline constexpr const char* kWorkerVariable = "FERRY_WORKER";

/// What a re-executed worker needs before it can read its payload.
struct ExecWorkerSpec {
  pid_t parent = -1;
  int rank = 0;
  int world_size = 1;
  int report_fd = -1;
  int payload_fd = -1;
  int parent_death_signal = 0;
  std::string name;
};

/// "1:<parent>:<rank>:<world>:<report fd>:<payload fd>:<signal>:<name>" (the name last: it may hold ':').
std::string encode_spec(const ExecWorkerSpec& spec);
/// Parses encode_spec()'s text; std::nullopt when it is malformed.
std::optional<ExecWorkerSpec> decode_spec(std::string_view text);

/// Arranges for `signal` to reach this process when its parent dies, then checks that the
/// parent is still `parent` (it may have died before the arrangement). Returns 0, the
/// errno of a failed prctl, or -1 when the parent is gone. Async-signal-safe.
int bind_to_parent(pid_t parent, int signal) noexcept;

/// Unblocks every signal (a worker must be able to receive SIGTERM). Async-signal-safe.
void unblock_all_signals() noexcept;

/// The arguments init() recorded; nullptr when init() was not called.
const std::vector<std::string>* recorded_arguments() noexcept;

}  // namespace ferry::detail
