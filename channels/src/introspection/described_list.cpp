#include "introspection/described_list.hpp"

#include <pthread.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "ferry/error.hpp"

namespace ferry::detail {

namespace {

struct DescribedList {
  std::mutex mutex;
  std::vector<const Described*> members;
};

DescribedList& described_list() {
  static DescribedList* instance = [] {
    auto* created = new DescribedList();  // never destroyed: members may outlive static destruction
    const int rc = ::pthread_atfork([] { described_list().mutex.lock(); }, [] { described_list().mutex.unlock(); },
                                    [] { described_list().mutex.unlock(); });
    if (rc != 0) throw_system_error("pthread_atfork", rc);
    return created;
  }();
  return *instance;
}

// Made before main(): a fork() while another thread is still making it would leave the child
// waiting for ever on the static's initialization guard.
[[maybe_unused]] const DescribedList& g_described_list_made_at_start = described_list();

}  // namespace

void Described::list() {
  DescribedList& list = described_list();
  std::lock_guard lock(list.mutex);
  list.members.push_back(this);
}

void Described::unlist() noexcept {
  DescribedList& list = described_list();
  std::lock_guard lock(list.mutex);
  std::erase(list.members, this);
}

void describe_listed(Snapshot& out) {
  DescribedList& list = described_list();
  std::lock_guard lock(list.mutex);
  for (const Described* member : list.members) member->describe(out);
}

}  // namespace ferry::detail
