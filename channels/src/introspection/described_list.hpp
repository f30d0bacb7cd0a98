// The process-wide list of things introspection describes that are not frame ends (those are
// in live_ends.hpp, kept for fork): the queues of in-process channels. Contract:
// - A Described object is listed for its lifetime (list() last in its constructor,
//   unlist() first in its destructor); describe_listed() calls describe() on each under
//   the list's lock, so that none is destroyed meanwhile.
// - describe() is called from any thread and must not wait for a lock a send or recv holds.
// - Thread-safe; a fork() while another thread changes the list leaves the child a usable
//   list (pthread_atfork).
#pragma once

namespace ferry {
struct Snapshot;
}

namespace ferry::detail {

class Described {
 public:
  Described(const Described&) = delete;
  Described& operator=(const Described&) = delete;
  /// Appends this object's figures to `out`.
  virtual void describe(Snapshot& out) const = 0;

 protected:
  Described() = default;
  ~Described() = default;
  void list();
  void unlist() noexcept;
};

/// Calls describe(out) on everything listed.
void describe_listed(Snapshot& out);

}  // namespace ferry::detail
