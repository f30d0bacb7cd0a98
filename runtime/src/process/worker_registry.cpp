#include "ferry/detail/worker_registry.hpp"

#include <functional>
#include <map>
#include <set>

#include "ferry/detail/thread_annotations.hpp"
#include "ferry/worker_error.hpp"

namespace ferry::detail {
namespace {

struct Registry {
  detail::Mutex mutex;
  std::map<std::string, RegisteredWorker, std::less<>> by_name FERRY_GUARDED_BY(mutex);
  std::set<std::string, std::less<>> conflicting FERRY_GUARDED_BY(mutex);
  std::map<FunctionIdentity, std::string> shadowed FERRY_GUARDED_BY(mutex);  // functions that came second to a name
};

Registry& registry() {
  static Registry instance;  // constructed on first use, also during static initialization
  return instance;
}

[[noreturn]] void throw_conflict(std::string_view name) {
  throw SpawnError("worker name '" + std::string(name) +
                   "' is registered by two different functions; give each FERRY_WORKER_NAMED a unique name");
}

}  // namespace

bool register_worker_entry(std::string_view name, FunctionIdentity identity, std::string_view signature,
                           WorkerEntry entry, WorkerInvoke invoke) noexcept {
  RegisteredWorker worker{std::string(name), identity, std::string(signature), entry, invoke};
  Registry& r = registry();
  const detail::MutexLock lock(r.mutex);
  auto it = r.by_name.find(worker.name);
  if (it == r.by_name.end()) {
    std::string name = worker.name;
    r.by_name.emplace(std::move(name), std::move(worker));
  } else if (it->second.identity != worker.identity) {
    r.conflicting.insert(worker.name);
    r.shadowed.emplace(worker.identity, worker.name);
  }
  return true;
}

const RegisteredWorker& find_worker(std::string_view name) {
  Registry& r = registry();
  const detail::MutexLock lock(r.mutex);
  if (r.conflicting.count(name) != 0) throw_conflict(name);
  auto it = r.by_name.find(name);
  if (it == r.by_name.end()) {
    std::string known;
    for (const auto& [known_name, worker] : r.by_name) known += (known.empty() ? "" : ", ") + known_name;
    throw SpawnError("no worker is registered as '" + std::string(name) +
                     "'; register the function with FERRY_WORKER(function) at namespace scope in a source "
                     "file of this program (registered: " +
                     (known.empty() ? std::string("none") : known) + ")");
  }
  return it->second;
}

const RegisteredWorker* find_worker(FunctionIdentity identity) {
  Registry& r = registry();
  const detail::MutexLock lock(r.mutex);
  // A worker started by exec looks its function up by name: a name shared with another
  // function would fail there, after the process started.
  const std::string* conflict = nullptr;
  for (const auto& [name, worker] : r.by_name) {
    if (worker.identity != identity) continue;
    if (r.conflicting.count(name) == 0) return &worker;
    conflict = &name;
  }
  if (const auto it = r.shadowed.find(identity); it != r.shadowed.end()) conflict = &it->second;
  if (conflict != nullptr) throw_conflict(*conflict);
  return nullptr;
}

}  // namespace ferry::detail
