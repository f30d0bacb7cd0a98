#include "ucx_registrations.hpp"

#include "ferry/allocation.hpp"
#include "ferry/detail/shared_segment.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/storage.hpp"

namespace ferry::ucx::detail {

UcxRegistrations::~UcxRegistrations() {
  for (auto& [id, entry] : entries_) {
    if (entry.handle != nullptr) (void)ucp_mem_unmap(context_, entry.handle);  // nothing to do if it fails
  }
}

ucp_mem_h UcxRegistrations::handle_for(const Storage& storage) {
  const Allocation* allocation = storage.allocation();
  const SharedBlock* block = allocation != nullptr ? allocation->shared_block() : nullptr;
  if (block == nullptr) return nullptr;
  const std::shared_ptr<ferry::detail::SharedSegment>& segment = block->segment();
  const ferry::detail::MutexLock lock(mutex_);
  if (const auto found = entries_.find(segment->id()); found != entries_.end()) return found->second.handle;
  drop_dead_locked();
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = segment->data();
  params.length = segment->size();
  ucp_mem_h handle = nullptr;
  if (ucp_mem_map(context_, &params, &handle) != UCS_OK) handle = nullptr;
  entries_.emplace(segment->id(), Entry{segment, handle});
  return handle;
}

std::size_t UcxRegistrations::size() {
  const ferry::detail::MutexLock lock(mutex_);
  return entries_.size();
}

void UcxRegistrations::drop_dead_locked() noexcept {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (!it->second.segment.expired()) {
      ++it;
      continue;
    }
    if (it->second.handle != nullptr) (void)ucp_mem_unmap(context_, it->second.handle);
    it = entries_.erase(it);
  }
}

}  // namespace ferry::ucx::detail
