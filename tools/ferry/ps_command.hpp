// `ferry ps`: one line per process with introspection on. Contract: render_ps() returns a
// table (header first) with pid, program, role (and rank), the number of channel ends,
// listeners and workers, and shared memory in use and mapped, in human units; pids ascending.
#pragma once

#include <string>
#include <vector>

#include "snapshot.hpp"

namespace ferry::cli {

std::string render_ps(const std::vector<Snapshot>& snapshots);

/// "main", "worker 3" (a worker with its rank), or the role as sent.
std::string role_text(const Snapshot& snapshot);

}  // namespace ferry::cli
