// One round of asking processes for snapshots: fetch (client.hpp) and parse (snapshot.hpp).
// Contract: returns the snapshots that could be had, in pid order, and a problem for each
// pid that could not be read (its message names the pid); nothing is thrown for one
// process's failure.
#pragma once

#include <chrono>
#include <vector>

#include "client.hpp"
#include "snapshot.hpp"

namespace ferry::cli {

struct Collection {
  std::vector<Snapshot> snapshots;
  std::vector<FetchProblem> problems;
};

/// Asks `pids` (all at once, within `timeout`).
Collection collect(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout);

/// Asks every process with introspection on (discovery.hpp).
Collection collect_all(std::chrono::milliseconds timeout);

}  // namespace ferry::cli
