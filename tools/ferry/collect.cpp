#include "collect.hpp"

#include "discovery.hpp"

namespace ferry::cli {

Collection collect(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout) {
  Collection collection;
  for (FetchResult& result : fetch_snapshots(pids, timeout)) {
    if (result.problem) {
      collection.problems.push_back(std::move(*result.problem));
      continue;
    }
    try {
      collection.snapshots.push_back(parse_snapshot(result.pid, result.reply));
    } catch (const CliError& error) {
      collection.problems.push_back(FetchProblem{error.code(), error.what()});
    }
  }
  return collection;
}

Collection collect_all(std::chrono::milliseconds timeout) { return collect(discover_introspectable_pids(), timeout); }

}  // namespace ferry::cli
