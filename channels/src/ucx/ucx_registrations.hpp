// The shared segments a UCP context has registered (ucp_mem_map), once per segment: a
// storage in the caching allocator's shared memory travels by rendezvous with its
// segment's memory handle, so a transport that needs registered memory (RDMA) finds it
// registered once instead of at every transfer. Over TCP a handle costs nothing and changes
// nothing. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>

#include <ucp/api/ucp.h>

#include "ferry/detail/thread_annotations.hpp"

namespace ferry {
class Storage;
}  // namespace ferry
namespace ferry::detail {
class SharedSegment;
}  // namespace ferry::detail

namespace ferry::ucx::detail {

class UcxRegistrations {
 public:
  explicit UcxRegistrations(ucp_context_h context) noexcept : context_(context) {}
  /// Unregisters every segment (before the context is cleaned up).
  ~UcxRegistrations();
  UcxRegistrations(const UcxRegistrations&) = delete;
  UcxRegistrations& operator=(const UcxRegistrations&) = delete;

  /// The memory handle of the segment `storage` lies in, registered on first use; nullptr
  /// for memory outside a shared segment (heap, CUDA) and for a segment UCX refused to
  /// register (its transfers then go without a handle, as before). Registrations of
  /// segments that died are dropped when a new segment is registered.
  ucp_mem_h handle_for(const Storage& storage);
  /// Segments registered now (dead ones not yet dropped included).
  std::size_t size();

 private:
  struct Entry {
    std::weak_ptr<ferry::detail::SharedSegment> segment;
    ucp_mem_h handle = nullptr;  // nullptr: UCX refused it
  };
  void drop_dead_locked() noexcept FERRY_REQUIRES(mutex_);

  ucp_context_h context_;
  ferry::detail::Mutex mutex_;
  std::unordered_map<std::uint64_t, Entry> entries_ FERRY_GUARDED_BY(mutex_);  // by SharedSegment::id()
};

}  // namespace ferry::ucx::detail
