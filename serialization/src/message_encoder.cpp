#include "ferry/detail/message_encoder.hpp"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "ferry/detail/peer_fd.hpp"
#include "ferry/detail/return_board.hpp"

namespace ferry {
namespace {

// Frames with more storages than this find repeated ones through a hash index.
constexpr std::size_t kLinearSearchLimit = 16;
constexpr std::uint32_t kNoSlot = UINT32_MAX;

std::size_t pointer_hash(const void* pointer) noexcept {
  return static_cast<std::size_t>((reinterpret_cast<std::uintptr_t>(pointer) >> 4) * 0x9e3779b97f4a7c15ull >> 20);
}

}  // namespace

detail::MessageEncoder::MessageEncoder(detail::HandlePassing passing, std::optional<SharedAllocator> pool)
    : passing_(passing), pool_(std::move(pool)) {}

detail::MessageEncoder::~MessageEncoder() { closed(detail::UniqueFd()); }

void detail::MessageEncoder::begin() {
  body_.reset(nullptr);
  board_in_frame_ = false;
  takeable_this_frame_.reset();
  // What the last frame filled; a frame without storages or segments (a small message)
  // filled none of it.
  if (tables_filled_) {
    tables_filled_ = false;
    storages_.clear();
    // Empty the entries the last frame filled (not the whole table).
    for (const std::uint32_t at : source_index_used_) source_index_[at] = {nullptr, 0};
    source_index_used_.clear();
    sources_.clear();
    segment_entries_.clear();
    entries_.clear();
    fds_.clear();
    copies_.clear();
    new_slots_.clear();
    new_segment_ids_.clear();
    new_pins_.clear();
    remember_batch_.clear();
  }
  if (connection_.cuda) connection_.cuda->begin_frame();
  if (connection_.holds.passed_upstream_boards()) retire_dead_upstream_boards();
}

void detail::MessageEncoder::retire_dead_upstream_boards() {
  retired_scratch_.clear();
  connection_.holds.retire_dead_upstream_boards(retired_scratch_);
  for (const detail::FileIdentity& identity : retired_scratch_) {
    detail::SegmentEntry entry;
    entry.kind = static_cast<std::uint32_t>(detail::SegmentKind::NoFd);
    entry.role = static_cast<std::uint32_t>(detail::SegmentRole::RetiredUpstreamBoard);
    entry.device = identity.device;
    entry.inode = identity.inode;
    segment_entries_.push_back(entry);
    tables_filled_ = true;
  }
}

void detail::MessageEncoder::track_delivery() {
  if (connection_.delivery_tracked) return;
  connection_.delivery_tracked = true;
  tracked_from_ = sequence();  // every message frame from the next one on is tracked
  publish_delivery_board();    // a board made before (for storages) counts deliveries from now
}

void detail::MessageEncoder::publish_delivery_board() {
  if (board_published_.load(std::memory_order_relaxed) || !has_delivery_board()) return;
  published_board_ = connection_.holds.shared_board();
  board_published_.store(true, std::memory_order_release);
}

std::optional<std::uint32_t> detail::MessageEncoder::find_source(const Storage* storage) {
  if (sources_.size() <= kLinearSearchLimit) {
    for (std::size_t i = 0; i < sources_.size(); ++i) {
      if (sources_[i] == storage) return static_cast<std::uint32_t>(i);
    }
    return std::nullopt;
  }
  const std::size_t mask = source_index_.size() - 1;
  for (std::size_t at = pointer_hash(storage) & mask;; at = (at + 1) & mask) {
    if (source_index_[at].second == 0) return std::nullopt;
    if (source_index_[at].first == storage) return source_index_[at].second - 1;
  }
}

void detail::MessageEncoder::place_source(const Storage* storage, std::uint32_t index) {
  const std::size_t mask = source_index_.size() - 1;
  std::size_t at = pointer_hash(storage) & mask;
  while (source_index_[at].second != 0) at = (at + 1) & mask;
  source_index_[at] = {storage, index + 1};
  source_index_used_.push_back(static_cast<std::uint32_t>(at));
}

void detail::MessageEncoder::index_source(const Storage* storage, std::uint32_t index) {
  if (sources_.size() <= kLinearSearchLimit) return;
  if (source_index_.size() < 2 * sources_.size()) {
    // Grow at a load of one half (the table is kept, empty, for the next frames).
    source_index_.assign(std::max<std::size_t>(64, std::bit_ceil(4 * sources_.size())), {nullptr, 0});
    source_index_used_.clear();
    for (std::uint32_t i = 0; i < sources_.size(); ++i) place_source(sources_[i], i);
    return;
  }
  if (sources_.size() == kLinearSearchLimit + 1) {
    // The frame outgrew linear search: index every source so far (the table is empty).
    for (std::uint32_t i = 0; i < sources_.size(); ++i) place_source(sources_[i], i);
    return;
  }
  place_source(storage, index);
}

std::uint32_t detail::MessageEncoder::append_storage(std::shared_ptr<Storage> travelling, const Storage* source) {
  tables_filled_ = true;
  const auto index = static_cast<std::uint32_t>(storages_.size());
  storages_.push_back(std::move(travelling));
  sources_.push_back(source);
  index_source(source, index);
  return index;
}

std::shared_ptr<Storage> detail::MessageEncoder::staged_on_host(const std::shared_ptr<Storage>& device_storage) {
  const auto bytes = static_cast<std::int64_t>(device_storage->nbytes());
  auto host = Storage::allocate(device_storage->nbytes(), Device::SharedCpu);
  // Byte views of both: copy_from() waits for the device's current stream, then copies.
  const auto whole = [bytes](const std::shared_ptr<Storage>& storage) {
    return Tensor::from_storage(storage, DType::UInt8, {bytes}, {1}, 0);
  };
  whole(host).copy_from(whole(device_storage));
  return host;
}

std::uint32_t detail::MessageEncoder::add_other_storage(const std::shared_ptr<Storage>& storage) {
  if (const auto found = find_source(storage.get())) return *found;
  if (passing_ == detail::HandlePassing::Copying) {
    // Its bytes travel, read in place; a CUDA storage's from a copy in host memory (UCX as
    // Debian builds it has no CUDA transport), so the receiver gets them on its CPU.
    if (storage->device().kind == DeviceKind::Cuda) return append_storage(staged_on_host(storage), storage.get());
    return append_storage(storage, storage.get());
  }
  if (storage->device().kind == DeviceKind::Cuda) return add_cuda_storage(storage);
  std::shared_ptr<Storage> travelling = storage;
  if (pool_) {
    // Isolation: only segments of the channel's pool may reach this receiver.
    storage->share_memory(*pool_);
    if (!pool_->owns(*storage->shared_block())) {
      travelling = Storage::allocate(storage->nbytes(), *pool_);
      std::memcpy(travelling->data(), storage->data(), storage->nbytes());
    }
  } else {
    // Like torch's share_memory_(): a heap storage moves into shared memory once, in place.
    storage->share_memory();
  }
  return append_storage(std::move(travelling), storage.get());
}

void detail::MessageEncoder::flush_remember_batch() {
  if (remember_batch_.empty()) return;
  (*remember_batch_.front())->shared_block()->segment()->remember_storages(remember_batch_);
  remember_batch_.clear();
}

std::uint32_t detail::MessageEncoder::lease_storage(const std::shared_ptr<Storage>& storage, bool returned) {
  const std::uint32_t slot = connection_.storage_slots.take(LeasedStorage{storage->id(), storage}, returned);
  connection_.leased_ids.insert(storage->id(), slot);
  new_slots_.push_back(slot);
  ++connection_.storages_passed;
  storage->mark_sent();
  return slot;
}

void detail::MessageEncoder::free_storage_slot(std::uint32_t slot) {
  if (connection_.storage_slots.state(slot) == detail::SlotTable<LeasedStorage>::State::Live) {
    connection_.leased_ids.erase(connection_.storage_slots.at(slot).storage_id);
  }
  connection_.storage_slots.free(slot);
}

void detail::MessageEncoder::collect_returned_slots() {
  returned_scratch_.clear();
  connection_.holds.take_returned(returned_scratch_);
  for (const std::uint32_t slot : returned_scratch_) {
    // Live: the receiver dropped its leases. Not returnable: a CUDA slot is never given
    // back on the board (a lying receiver).
    if (connection_.storage_slots.returnable(slot)) free_storage_slot(slot);
  }
}

void detail::MessageEncoder::collect_dead_storages() {
  if (!connection_.storage_slots.saw_deaths(sent_storage_deaths())) return;
  connection_.storage_slots.retire_where([this](std::uint32_t, const LeasedStorage& leased) {
    if (!leased.storage.expired()) return false;
    connection_.leased_ids.erase(leased.storage_id);
    return true;
  });
}

void detail::MessageEncoder::collect_dead_segments() {
  if (!connection_.segment_slots.saw_deaths(sent_segment_deaths())) return;
  connection_.segment_slots.retire_where([this](std::uint32_t, const LeasedSegment& leased) {
    if (!leased.segment.expired()) return false;
    connection_.sent_segments.erase(leased.segment_id);
    if (leased.segment_id == connection_.last_segment_id) connection_.last_segment_id = 0;
    return true;
  });
}

bool detail::MessageEncoder::passes_fd_now() {
  if (passing_ != detail::HandlePassing::ProcFdWhileTakeable) return passing_ == detail::HandlePassing::FdPassing;
  // Asked once per frame that introduces segments: a process may stop being dumpable at
  // any time (prctl, setuid).
  if (!takeable_this_frame_) takeable_this_frame_ = detail::fds_takeable_by_peers();
  return !*takeable_this_frame_;
}

bool detail::MessageEncoder::add_segment_entry(detail::SegmentRole role, std::uint32_t slot_or_reclaims, int fd,
                                               std::size_t size, const detail::FileIdentity& identity) {
  detail::SegmentEntry entry;
  entry.role = static_cast<std::uint32_t>(role);
  entry.slot_or_reclaims = slot_or_reclaims;
  entry.size = size;
  const bool by_fd = passes_fd_now();
  if (by_fd) {
    entry.kind = static_cast<std::uint32_t>(detail::SegmentKind::NewFd);
    fds_.push_back(fd);
  } else {
    entry.kind = static_cast<std::uint32_t>(detail::SegmentKind::NewProcFd);
    entry.pid = ::getpid();
    entry.fd = fd;
    entry.device = identity.device;
    entry.inode = identity.inode;
  }
  segment_entries_.push_back(entry);
  tables_filled_ = true;
  return !by_fd;
}

std::uint32_t detail::MessageEncoder::segment_slot_for(const std::shared_ptr<detail::SharedSegment>& segment) {
  // The storages of a frame mostly lie in one segment (a slab of small blocks).
  if (segment->id() == connection_.last_segment_id) return connection_.last_segment_slot;
  const auto it = connection_.sent_segments.find(segment->id());
  connection_.last_segment_slot = it != connection_.sent_segments.end() ? it->second : lease_segment(segment);
  connection_.last_segment_id = segment->id();
  return connection_.last_segment_slot;
}

std::uint32_t detail::MessageEncoder::lease_segment(const std::shared_ptr<SharedSegment>& segment) {
  const std::uint32_t slot = connection_.segment_slots.take(LeasedSegment{segment->id(), segment}, false);
  connection_.sent_segments.emplace(segment->id(), slot);
  new_segment_ids_.push_back(segment->id());
  segment->mark_sent();
  // /proc/<pid>/fd/<n> only works while our fd is open: keep the segment until the receiver
  // acknowledges that it opened it.
  if (add_segment_entry(detail::SegmentRole::Data, slot, segment->fd(), segment->size(), segment->identity())) {
    connection_.holds.keep_until_acknowledged(sequence(), segment);
  }
  return slot;
}

void detail::MessageEncoder::pass_upstream_boards(const SharedBlock& block) {
  upstream_scratch_.clear();
  connection_.holds.upstream_boards_to_pass(block, upstream_scratch_);
  for (const std::shared_ptr<detail::ReturnBoard>& board : upstream_scratch_) {
    // We hold the block (its frame on `board` is resolved and we registered there), so the
    // count read now is one no reclaim of this block can have moved.
    // Like a segment's: the frame may introduce no segment that makes close() wait for it.
    if (add_segment_entry(detail::SegmentRole::UpstreamBoard, board->reclaims(), board->fd(),
                          detail::ReturnBoard::bytes(), board->identity())) {
      connection_.holds.keep_until_acknowledged(sequence(), board);
    }
  }
  upstream_scratch_.clear();
}

const detail::EncodedFrame& detail::MessageEncoder::encode(const void* message, const detail::SentType& type,
                                                           detail::BodySpace* space) {
  begin();
  body_.reset(space);
  detail::FrameOutputArchive& archive = output_archive();
  try {
    type.write(archive, message);
  } catch (...) {
    archive_.reset();  // cereal's state may be half made
    throw;
  }
  if (!archive.reusable()) archive_.reset();
  return finish(detail::FrameKind::Message, type.fingerprint, type.name);
}

const detail::EncodedFrame& detail::MessageEncoder::finish(detail::FrameKind kind, std::uint64_t fingerprint,
                                                           std::string_view name) {
  // Each step is skipped when it has nothing to do (no ledger yet, no storage ever sent, no
  // storage in the frame, no slot ever used, no death since the last frame), so that a small message pays for
  // none of them. Every pin, kept segment and passed board of the ledger came with a storage
  // slot: a connection that never had one (a Distributor's channel of plain values, whose
  // board only counts deliveries) has no returns to collect.
  if (connection_.holds.board() != nullptr && !connection_.storage_slots.never_used()) collect_returned_slots();
  if (!storages_.empty()) refresh_leased_storages();
  // A table that never held a slot has nothing to collect (nor a death count worth asking
  // the runtime for: the first frame that fills it looks at every death since).
  if (!connection_.storage_slots.never_used()) collect_dead_storages();
  if (!connection_.segment_slots.never_used()) collect_dead_segments();
  if (!storages_.empty()) fill_handle_table();
  pin_new_storages(kind);
  // The CUDA records lie at the front of the body.
  const std::span<const std::byte> cuda_records =
      connection_.cuda ? connection_.cuda->records() : std::span<const std::byte>();
  fill_header(kind, fingerprint, name, cuda_records.size());
  return assemble_frame(cuda_records);
}

void detail::MessageEncoder::refresh_leased_storages() {
  // A storage of this frame that the receiver still leases keeps its slot even if the
  // reference recorded for it died meanwhile (a receiver re-resolved a storage it received
  // into a new handle on the same Storage object): refresh it before dead entries are
  // collected, so that an echoed storage travels as a lease.
  // The slots found here stay leased below: their storages are alive (in storages_).
  leased_slots_.resize(storages_.size());
  for (std::size_t i = 0; i < storages_.size(); ++i) {
    // Only a storage marked sent can be leased (a new one skips the lookup).
    const auto slot = storages_[i]->was_sent() ? connection_.leased_ids.find(storages_[i]->id()) : std::nullopt;
    leased_slots_[i] = slot.value_or(kNoSlot);
    if (!slot) continue;
    // Mostly the slot still names this very reference (the same control block): assigning it
    // again would change two reference counts, locked operations in a threaded process.
    std::weak_ptr<Storage>& recorded = connection_.storage_slots.at(*slot).storage;
    if (recorded.owner_before(storages_[i]) || storages_[i].owner_before(recorded)) recorded = storages_[i];
  }
}

void detail::MessageEncoder::fill_handle_table() {
  entries_.resize(storages_.size());
  for (std::size_t i = 0; i < storages_.size(); ++i) {
    const std::shared_ptr<Storage>& storage = storages_[i];
    detail::HandleEntry& entry = entries_[i];
    if (passing_ == detail::HandlePassing::Copying) {
      entry = detail::HandleEntry{};
      entry.kind = static_cast<std::uint32_t>(detail::HandleKind::Copied);
      entry.nbytes = storage->nbytes();
      copies_.push_back(iovec{storage->data(), storage->nbytes()});
      continue;
    }
    if (storage->device().kind == DeviceKind::Cuda) {
      entry = cuda_entry(storage);
      continue;
    }
    entry.nbytes = storage->nbytes();
    if (leased_slots_[i] != kNoSlot) {
      entry.kind = static_cast<std::uint32_t>(detail::HandleKind::Leased);
      entry.slot = leased_slots_[i];
      continue;
    }
    fill_new_block_entry(storage, entry);
  }
  flush_remember_batch();
}

void detail::MessageEncoder::fill_new_block_entry(const std::shared_ptr<Storage>& storage, detail::HandleEntry& entry) {
  const SharedBlock* block = storage->shared_block();
  entry.kind = static_cast<std::uint32_t>(detail::HandleKind::NewBlock);
  entry.segment_slot = segment_slot_for(block->segment());
  entry.offset = block->offset();
  entry.slot = lease_storage(storage, true);
  if (block->received()) pass_upstream_boards(*block);  // a block of our own allocator came through no board
  new_pins_.push_back(HoldLedger::Pin{entry.slot, storage->shared_allocation()});
  // A block sent back to us (by a receiver that forwards it) resolves to this storage;
  // storages of one segment are remembered together, under one lock.
  if (!remember_batch_.empty() && (*remember_batch_.front())->shared_block()->segment() != block->segment()) {
    flush_remember_batch();
  }
  remember_batch_.push_back(&storage);
}

void detail::MessageEncoder::pin_new_storages(detail::FrameKind kind) {
  if (!new_pins_.empty()) connection_.holds.pin(new_pins_, sequence());
  // Without shared memory (Copying) there is no board: the reader reports deliveries on
  // its transport (FrameReader::frame_delivered()).
  const bool tracked =
      connection_.delivery_tracked && kind == detail::FrameKind::Message && passing_ != detail::HandlePassing::Copying;
  if (connection_.holds.board_sent() || (new_pins_.empty() && !tracked)) return;
  // The board goes first in the table, so that the receiver can give blocks back even when
  // a later entry fails. A frame sent for delivery tracking alone may be the first to need it.
  const std::shared_ptr<detail::ReturnBoard>& board = connection_.holds.ensure_board();
  const std::size_t segments = segment_entries_.size();
  const std::size_t fds = fds_.size();
  const bool by_path = add_segment_entry(detail::SegmentRole::ReturnBoard, 0, board->fd(), detail::ReturnBoard::bytes(),
                                         board->identity());
  std::rotate(segment_entries_.begin(), segment_entries_.begin() + static_cast<std::ptrdiff_t>(segments),
              segment_entries_.end());
  std::rotate(fds_.begin(), fds_.begin() + static_cast<std::ptrdiff_t>(fds), fds_.end());
  board_in_frame_ = true;
  // Named by /proc path, the board's fd must stay open until the receiver opened it (close()
  // waits for what the holds keep). A frame with new pins and no board yet introduces a
  // segment, which is kept for the frame; one sent for delivery tracking alone does not.
  if (by_path && new_pins_.empty()) connection_.holds.keep_until_acknowledged(sequence(), board);
  publish_delivery_board();  // made now for a tracked connection
}

void detail::MessageEncoder::fill_header(detail::FrameKind kind, std::uint64_t fingerprint, std::string_view name,
                                         std::size_t cuda_bytes) {
  header_ = detail::FrameHeader{};
  header_.kind = static_cast<std::uint8_t>(kind);
  header_.type_fingerprint = fingerprint;
  header_.sequence = sequence();
  const bool with_name = kind == detail::FrameKind::Message && !connection_.type_name_sent;
  type_name_ = with_name ? name.substr(0, std::min(name.size(), max_type_name_bytes_)) : std::string_view{};
  const bool truncated = with_name && type_name_.size() < name.size();
  header_.flags = static_cast<std::uint8_t>(
      (with_name ? detail::kFrameHasTypeName : 0) | (truncated ? detail::kFrameTypeNameTruncated : 0) |
      (connection_.delivery_tracked && kind == detail::FrameKind::Message ? detail::kFrameTracksDelivery : 0));
  header_.type_name_bytes = static_cast<std::uint32_t>(type_name_.size());
  header_.segment_count = static_cast<std::uint32_t>(segment_entries_.size());
  header_.handle_count = static_cast<std::uint32_t>(entries_.size());
  header_.fd_count = static_cast<std::uint32_t>(fds_.size());
  announced_releases_ = connection_.storage_slots.announce();
  header_.release_count = static_cast<std::uint32_t>(announced_releases_.size());
  announced_segment_releases_ = connection_.segment_slots.announce();
  header_.segment_release_count = static_cast<std::uint32_t>(announced_segment_releases_.size());
  header_.body_bytes = cuda_bytes + body_.size();
}

const detail::EncodedFrame& detail::MessageEncoder::assemble_frame(std::span<const std::byte> cuda_records) {
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
  add(segment_entries_.data(), segment_entries_.size() * sizeof(SegmentEntry));
  add(entries_.data(), entries_.size() * sizeof(HandleEntry));
  add(announced_releases_.data(), announced_releases_.size_bytes());
  add(announced_segment_releases_.data(), announced_segment_releases_.size_bytes());
  add(cuda_records.data(), cuda_records.size());
  add(body_.bytes().data(), body_.bytes().size());
  add(body_.borrowed().data(), body_.borrowed().size());
  frame_.fds = fds_;
  frame_.copies = copies_;
  frame_.copy_owners = passing_ == detail::HandlePassing::Copying ? std::span<const std::shared_ptr<Storage>>(storages_)
                                                                  : std::span<const std::shared_ptr<Storage>>();
  frame_.sequence = sequence();
  return frame_;
}

const detail::EncodedFrame& detail::MessageEncoder::encode_close() {
  begin();
  return finish(detail::FrameKind::Close, 0, {});
}

void detail::MessageEncoder::commit() {
  if (header_.flags & kFrameHasTypeName) connection_.type_name_sent = true;
  if (!announced_releases_.empty() || !announced_segment_releases_.empty()) commit_releases();
  connection_.holds.commit_frame();
  // Passed with the frame, the board's fd is the kernel's now; ours is no longer needed.
  if (board_in_frame_) connection_.holds.board_sent(sequence(), passing_ == detail::HandlePassing::FdPassing);
  // Release: a thread that reads the new count (frames_committed()) sees what the
  // sending end stored before committing (SenderCore::close()'s end-of-stream number).
  connection_.next_sequence.store(sequence() + 1, std::memory_order_release);
  if (tables_filled_) {
    storages_.clear();
    sources_.clear();
  }
  if (connection_.cuda) connection_.cuda->end_frame(true);
}

void detail::MessageEncoder::commit_releases() {
  // A CUDA slot is free at once: frames are ordered, so the receiver drops the lease
  // before it resolves any later use of the slot, and it gives nothing back on the board.
  // So is a segment slot. Other storage slots wait for the receiver's return.
  connection_.storage_slots.commit_announced();
  connection_.segment_slots.commit_announced();
  announced_releases_ = {};
  announced_segment_releases_ = {};
}

void detail::MessageEncoder::rollback() {
  // The receiver never saw the frame: forget the storages and segments it introduced and
  // give their slots back; releases stay unannounced for the next frame.
  connection_.storages_passed -= new_slots_.size();
  for (const std::uint32_t slot : new_slots_) free_storage_slot(slot);
  if (!new_slots_.empty()) connection_.holds.unpin(new_slots_);
  for (const std::uint64_t id : new_segment_ids_) {
    if (const auto it = connection_.sent_segments.find(id); it != connection_.sent_segments.end()) {
      connection_.segment_slots.free(it->second);
      if (id == connection_.last_segment_id) connection_.last_segment_id = 0;
      connection_.sent_segments.erase(it);
    }
  }
  connection_.holds.rollback_frame(sequence());
  board_in_frame_ = false;
  new_slots_.clear();
  new_segment_ids_.clear();
  storages_.clear();
  sources_.clear();
  if (connection_.cuda) connection_.cuda->end_frame(false);
}

void detail::MessageEncoder::acknowledge(std::uint64_t sequence) { connection_.holds.acknowledged(sequence); }

void detail::MessageEncoder::add_holder(const detail::ProcessIdentity& process) {
  connection_.holds.add_holder(process);
}

void detail::MessageEncoder::receiver_gone() { connection_.holds.receiver_gone(); }

void detail::MessageEncoder::hand_over() { connection_.holds.hand_over(); }

void detail::MessageEncoder::adopt() { connection_.holds.adopt(); }

void detail::MessageEncoder::closed(detail::UniqueFd probe, bool probe_by_send, std::chrono::milliseconds exit_linger) {
  connection_.holds.closed(std::move(probe), probe_by_send, exit_linger);
}

}  // namespace ferry
