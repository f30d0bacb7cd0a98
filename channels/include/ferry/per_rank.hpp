// ferry::per_rank: a spawn() argument that gives each worker a value of its own.
#pragma once

#include <utility>
#include <vector>

namespace ferry {

/// One value per worker: worker r receives element r. The vector must hold exactly as
/// many values as there are workers. Channel ends must be given this way when there is
/// more than one worker, since an end belongs to one process:
///
/// ```cpp
/// std::vector<ferry::Receiver<Job>> job_ends = ...;   // one per worker
/// ferry::spawn(4, work, ferry::per_rank(std::move(job_ends)));
/// ```
template <class T>
class PerRank {
 public:
  explicit PerRank(std::vector<T> values) : values_(std::move(values)) {}
  std::vector<T>& values() noexcept { return values_; }
  const std::vector<T>& values() const noexcept { return values_; }

 private:
  std::vector<T> values_;
};

/// Gives worker r `values[r]` (see PerRank).
template <class T>
PerRank<T> per_rank(std::vector<T> values) {
  return PerRank<T>(std::move(values));
}

}  // namespace ferry
