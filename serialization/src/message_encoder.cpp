#include "ferry/message_encoder.hpp"

#include <unistd.h>

#include <algorithm>

namespace ferry {

void MessageEncoder::begin() {
  body_.clear();
  storages_.clear();
  entries_.clear();
  fds_.clear();
  new_storage_ids_.clear();
  cuda_begin_frame();
}

std::uint32_t MessageEncoder::add_storage(const std::shared_ptr<Storage>& storage) {
  for (std::size_t i = 0; i < storages_.size(); ++i) {
    if (storages_[i] == storage) return static_cast<std::uint32_t>(i);
  }
  if (storage->device().kind == DeviceKind::Cuda) return add_cuda_storage(storage);  // CUDA IPC: cuda_handles.cpp
  // Like torch's share_memory_(): a heap storage moves into shared memory once, in place.
  storage->share_memory();
  storages_.push_back(storage);
  return static_cast<std::uint32_t>(storages_.size() - 1);
}

void MessageEncoder::collect_dead_storages() {
  const std::uint64_t deaths = sent_storage_deaths();
  if (deaths == seen_deaths_) return;
  seen_deaths_ = deaths;
  for (auto it = sent_.begin(); it != sent_.end();) {
    if (it->second.storage.expired()) {
      unannounced_releases_.push_back(it->second.slot);
      it = sent_.erase(it);
    } else {
      ++it;
    }
  }
}

std::uint32_t MessageEncoder::take_slot() {
  if (!free_slots_.empty()) {
    const std::uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  return next_slot_++;
}

const EncodedFrame& MessageEncoder::finish(FrameKind kind, std::uint64_t fingerprint, std::string_view name) {
  // A storage of this frame that the receiver still leases keeps its slot even if the
  // handle recorded for it died meanwhile (a receiver re-resolved it into a new handle on
  // the same Storage): refresh the handle before dead entries are collected.
  for (const auto& storage : storages_) {
    if (auto it = sent_.find(storage->id()); it != sent_.end()) it->second.storage = storage;
  }
  collect_dead_storages();
  for (const auto& storage : storages_) {
    if (storage->device().kind == DeviceKind::Cuda) {  // CUDA IPC: cuda_handles.cpp
      entries_.push_back(cuda_entry(storage));
      continue;
    }
    HandleEntry entry;
    entry.nbytes = storage->nbytes();
    if (auto it = sent_.find(storage->id()); it != sent_.end()) {
      entry.kind = static_cast<std::uint32_t>(HandleKind::Leased);
      entry.slot = it->second.slot;
    } else {
      const SharedMemory* segment = storage->shared_memory();
      entry.slot = take_slot();
      if (passing_ == HandlePassing::FdPassing) {
        entry.kind = static_cast<std::uint32_t>(HandleKind::NewFd);
        fds_.push_back(segment->fd());
      } else {
        entry.kind = static_cast<std::uint32_t>(HandleKind::NewProcFd);
        entry.pid = ::getpid();  // a system call: only for storages new to the receiver
        entry.fd = segment->fd();
        entry.device = segment->identity().device;
        entry.inode = segment->identity().inode;
        // /proc/<pid>/fd/<n> only works while our fd is open: keep the storage alive until
        // the receiver acknowledges that it opened it.
        keepalive_.emplace_back(next_sequence_, storage);
      }
      sent_.emplace(storage->id(), SentStorage{entry.slot, storage});
      new_storage_ids_.push_back(storage->id());
      storage->mark_sent();
      ++storages_passed_;
    }
    entries_.push_back(entry);
  }

  header_ = FrameHeader{};
  header_.kind = static_cast<std::uint8_t>(kind);
  header_.type_fingerprint = fingerprint;
  header_.sequence = next_sequence_;
  const bool with_name = kind == FrameKind::Message && !type_name_sent_;
  type_name_ = with_name ? name : std::string_view{};
  header_.flags = with_name ? kFrameHasTypeName : 0;
  header_.type_name_bytes = static_cast<std::uint32_t>(type_name_.size());
  header_.handle_count = static_cast<std::uint32_t>(entries_.size());
  header_.fd_count = static_cast<std::uint32_t>(fds_.size());
  announced_release_count_ = unannounced_releases_.size();
  header_.release_count = static_cast<std::uint32_t>(announced_release_count_);
  const std::span<const std::byte> cuda_records = cuda_section();  // at the front of the body
  header_.body_bytes = cuda_records.size() + body_.size();

  // Reset field by field: zeroing the whole struct (its iovec array) costs a `rep stos`
  // per message, a noticeable share of a small message's cost on the ring.
  frame_.part_count = 0;
  frame_.bytes = 0;
  auto add = [this](const void* data, std::size_t size) {
    if (size == 0) return;
    frame_.parts[frame_.part_count++] = iovec{const_cast<void*>(data), size};
    frame_.bytes += size;
  };
  add(&header_, sizeof header_);
  add(type_name_.data(), type_name_.size());
  add(entries_.data(), entries_.size() * sizeof(HandleEntry));
  add(unannounced_releases_.data(), announced_release_count_ * sizeof(std::uint32_t));
  add(cuda_records.data(), cuda_records.size());
  add(body_.data(), body_.size());
  frame_.fds = fds_;
  frame_.sequence = next_sequence_;
  return frame_;
}

const EncodedFrame& MessageEncoder::encode_close() {
  begin();
  return finish(FrameKind::Close, 0, {});
}

void MessageEncoder::commit() {
  if (header_.flags & kFrameHasTypeName) type_name_sent_ = true;
  free_slots_.insert(free_slots_.end(), unannounced_releases_.begin(),
                     unannounced_releases_.begin() + static_cast<std::ptrdiff_t>(announced_release_count_));
  unannounced_releases_.erase(unannounced_releases_.begin(),
                              unannounced_releases_.begin() + static_cast<std::ptrdiff_t>(announced_release_count_));
  ++next_sequence_;
  storages_.clear();
  cuda_end_frame(true);
}

void MessageEncoder::rollback() {
  // The receiver never saw the frame: forget the storages it introduced and give their
  // slots back; releases stay unannounced for the next frame.
  storages_passed_ -= new_storage_ids_.size();
  for (const std::uint64_t id : new_storage_ids_) {
    if (auto it = sent_.find(id); it != sent_.end()) {
      free_slots_.push_back(it->second.slot);
      sent_.erase(it);
    }
  }
  while (!keepalive_.empty() && keepalive_.back().first == next_sequence_) keepalive_.pop_back();
  storages_.clear();
  cuda_end_frame(false);
}

void MessageEncoder::acknowledge(std::uint64_t sequence) {
  while (!keepalive_.empty() && keepalive_.front().first <= sequence) keepalive_.pop_front();
}

}  // namespace ferry
