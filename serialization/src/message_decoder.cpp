#include "ferry/detail/message_decoder.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cuda_frame.hpp"
#include "ferry/detail/body_reader.hpp"
#include "ferry/detail/errno_text.hpp"
#include "ferry/detail/object_pool.hpp"
#include "ferry/detail/peer_fd.hpp"
#include "ferry/detail/process_identity.hpp"
#include "ferry/detail/size_classes.hpp"
#include "ferry/handle_cache.hpp"

namespace ferry {
namespace {

// How long a receiver that cannot open a sender's /proc fd waits for the sender's exit to
// complete before calling the frame a lie (an exit closes the fds before the process
// becomes a zombie).
constexpr std::chrono::milliseconds kSenderExitGrace{200};

// A type's name, quoted, for an error message: at most kShownTypeNameBytes of it, saying
// when the name is cut (here, or by the sender: `truncated`).
std::string shown_type_name(std::string_view name, bool truncated) {
  constexpr std::size_t kShownTypeNameBytes = 1024;
  if (name.size() <= kShownTypeNameBytes && !truncated) return "'" + std::string(name) + "'";
  const std::string_view shown = name.substr(0, std::min(name.size(), kShownTypeNameBytes));
  return "'" + std::string(shown) + "...' (a name truncated to its first " + std::to_string(shown.size()) +
         " bytes; the types' fingerprints differ)";
}

std::string hex(std::uint64_t value) {
  char text[19];
  std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(value));
  return text;
}

template <class Entry>
Entry entry_at(std::span<const std::byte> table, std::size_t index) {
  Entry entry;
  std::memcpy(&entry, table.data() + index * sizeof entry, sizeof entry);
  return entry;
}

}  // namespace

detail::MessageDecoder::~MessageDecoder() = default;

void detail::MessageDecoder::read(void* out, const detail::ReceivedType& type) {
  detail::FrameInputArchive& archive = input_archive();
  try {
    detail::read_message(archive, out, type);
  } catch (...) {
    archive_.reset();  // cereal's state may be half made
    throw;
  }
  storages_.clear();
  if (!archive.reusable()) archive_.reset();
}

void detail::MessageDecoder::check_type(const detail::FrameHeader& header, std::span<const std::byte> name) {
  if (header.flags & detail::kFrameHasTypeName) {
    connection_.peer_type_name.assign(reinterpret_cast<const char*>(name.data()), name.size());
    connection_.peer_type_name_truncated = (header.flags & detail::kFrameTypeNameTruncated) != 0;
  }
  if (header.type_fingerprint == expected_fingerprint_) return;
  // A truncated name cannot be checked against the fingerprint; it only ever names the type.
  const bool named =
      !connection_.peer_type_name.empty() &&
      (connection_.peer_type_name_truncated || detail::fnv1a64(connection_.peer_type_name) == header.type_fingerprint);
  const std::string sent = named ? shown_type_name(connection_.peer_type_name, connection_.peer_type_name_truncated)
                                 : "an unknown type (fingerprint " + hex(header.type_fingerprint) + ")";
  throw TypeMismatch("type mismatch: the sender sends " + sent + " but this Receiver expects " +
                     shown_type_name(expected_type_name_, false) + "; connect a Sender<T> only to a Receiver<T>");
}

void detail::MessageDecoder::decode(const detail::FrameHeader& header, std::span<const std::byte> payload,
                                    std::deque<detail::UniqueFd>& fds, std::deque<std::shared_ptr<Storage>>* copied,
                                    PendingBody* pending) {
  copied_ = copied;
  pending_ = nullptr;
  wants_acknowledgement_ = false;
  frame_claimed_ = false;
  frame_sequence_ = header.sequence;
  frame_tracked_ = (header.flags & detail::kFrameTracksDelivery) != 0;
  storages_.clear();
  if ((header.fd_count | header.segment_count | header.handle_count | header.release_count |
       header.segment_release_count) == 0) {
    // The common small message: no fd, table or release, only the type and the body.
    decode_body_only(header, payload);
    pending_ = pending;
    return;
  }
  if (pending != nullptr) throw Error("a frame with tables was handed over before its body arrived");
  // Take this frame's fds first, so that they are closed whatever goes wrong below.
  if (fds.size() < header.fd_count) {
    const std::size_t arrived = fds.size();
    fds.clear();
    throw ProtocolError("frame claims " + std::to_string(header.fd_count) + " file descriptors but " +
                        std::to_string(arrived) + " arrived");
  }
  std::vector<detail::UniqueFd> frame_fds;
  frame_fds.reserve(header.fd_count);
  for (std::uint32_t i = 0; i < header.fd_count; ++i) {
    frame_fds.push_back(std::move(fds.front()));
    fds.pop_front();
  }

  std::size_t position = 0;
  auto take = [&](std::size_t size) {
    if (size > payload.size() - position) throw ProtocolError("frame is shorter than its header claims");
    auto part = payload.subspan(position, size);
    position += size;
    return part;
  };
  check_type_fast(header, take(header.type_name_bytes));
  const auto segment_table = take(std::size_t{header.segment_count} * sizeof(detail::SegmentEntry));
  const auto table = take(std::size_t{header.handle_count} * sizeof(detail::HandleEntry));
  const auto releases = take(std::size_t{header.release_count} * sizeof(std::uint32_t));
  const auto segment_releases = take(std::size_t{header.segment_release_count} * sizeof(std::uint32_t));
  body_ = take(header.body_bytes);

  {
    // Blocks whose last user was the lease give their slots back together, when the batch ends.
    const auto batch = connection_.holds.batch_returns();
    for (std::uint32_t i = 0; i < header.release_count; ++i)
      connection_.leases.release(entry_at<std::uint32_t>(releases, i));
  }
  for (std::uint32_t i = 0; i < header.segment_release_count; ++i) {
    connection_.segments.release(entry_at<std::uint32_t>(segment_releases, i));
  }

  try {
    resolve_tables(header, segment_table, table, frame_fds);
  } catch (...) {
    give_back_unresolved(table, header.handle_count);
    throw;
  }
  // A frame claimed on the board is acknowledged there (after its segments were opened);
  // the transport carries an acknowledgement only when the sender asked for it (it blocks
  // in close()), read after the claim (see ReturnBoard::acknowledgements_requested()).
  if (wants_acknowledgement_ && frame_claimed_ && !connection_.holds.acknowledgements_requested()) {
    wants_acknowledgement_ = false;
  }
}

void detail::MessageDecoder::decode_body_only(const detail::FrameHeader& header, std::span<const std::byte> payload) {
  if (header.type_name_bytes > payload.size() || header.body_bytes > payload.size() - header.type_name_bytes) {
    throw ProtocolError("frame is shorter than its header claims");
  }
  check_type_fast(header, payload.first(header.type_name_bytes));
  body_ = payload.subspan(header.type_name_bytes, static_cast<std::size_t>(header.body_bytes));
  if (copied_ != nullptr && !copied_->empty()) {
    const std::size_t extra = copied_->size();
    copied_->clear();
    throw ProtocolError("the transport delivered " + std::to_string(extra) +
                        " storages more than the frame's handle table names");
  }
}

void detail::MessageDecoder::give_back_unresolved(std::span<const std::byte> table, std::uint32_t count) noexcept {
  // The sender pinned every new block of the frame for us. Blocks we leased give their
  // slot back when they die; the others would stay pinned until this process exits.
  if (!connection_.holds.has_board()) return;
  for (std::uint32_t i = 0; i < count; ++i) {
    const auto entry = entry_at<HandleEntry>(table, i);
    if (entry.kind != static_cast<std::uint32_t>(HandleKind::NewBlock) || entry.slot >= kMaxSlots) continue;
    if (connection_.leases.find(entry.slot) != nullptr) continue;
    connection_.holds.give_back(entry.slot);
  }
}

void detail::MessageDecoder::resolve_tables(const detail::FrameHeader& header, std::span<const std::byte> segment_table,
                                            std::span<const std::byte> table,
                                            std::vector<detail::UniqueFd>& frame_fds) {
  std::size_t next_fd = 0;
  for (std::uint32_t i = 0; i < header.segment_count; ++i) {
    add_segment(entry_at<detail::SegmentEntry>(segment_table, i), i, frame_fds, next_fd);
  }
  if (next_fd != frame_fds.size()) {
    throw ProtocolError("frame carries " + std::to_string(frame_fds.size()) + " fds but only " +
                        std::to_string(next_fd) + " fd segments");
  }

  std::size_t cuda_records = 0;
  storages_.reserve(header.handle_count);
  for (std::uint32_t i = 0; i < header.handle_count; ++i) {
    const auto entry = entry_at<HandleEntry>(table, i);
    const auto kind = static_cast<HandleKind>(entry.kind);
    if (kind == HandleKind::Leased) {
      storages_.push_back(resolve_leased(entry, i));
      continue;
    }
    if (kind == detail::HandleKind::CudaIpc) {
      storages_.push_back(resolve_cuda(entry, i, cuda_records++));
      continue;
    }
    if (kind == detail::HandleKind::Copied) {
      storages_.push_back(take_copied(entry, i));
      continue;
    }
    if (kind != detail::HandleKind::NewBlock) {
      throw ProtocolError("handle " + std::to_string(i) + " has an unknown kind " + std::to_string(entry.kind));
    }
    connection_.leases.check_free(entry.slot, i);
    if (!frame_claimed_) {
      claim_frame(header.sequence, i);
      frame_claimed_ = true;
    }
    storages_.push_back(resolve_new_block(entry, i));
  }
  body_ = body_.subspan(cuda_records * sizeof(detail::CudaHandleRecord));  // resolve_cuda checked the length
  if (copied_ != nullptr && !copied_->empty()) {
    const std::size_t extra = copied_->size();
    copied_->clear();
    throw ProtocolError("the transport delivered " + std::to_string(extra) +
                        " storages more than the frame's handle table names");
  }
}

std::shared_ptr<Storage> detail::MessageDecoder::resolve_leased(const HandleEntry& entry, std::size_t index) {
  Lease* lease = connection_.leases.find(entry.slot);
  if (lease == nullptr) {
    throw ProtocolError("handle " + std::to_string(index) + " refers to slot " + std::to_string(entry.slot) +
                        " which holds no lease");
  }
  const Allocation* memory = lease->memory();
  if (memory->device().kind == DeviceKind::Cuda) {
    throw ProtocolError("handle " + std::to_string(index) + " refers to the CUDA storage at slot " +
                        std::to_string(entry.slot) + " as a plain lease");
  }
  if (memory->size() != entry.nbytes) {
    throw ProtocolError("handle " + std::to_string(index) + " field nbytes claims " + std::to_string(entry.nbytes) +
                        " bytes but the storage leased at slot " + std::to_string(entry.slot) + " has " +
                        std::to_string(memory->size()));
  }
  return resolve_lease(*lease);
}

std::shared_ptr<Storage> detail::MessageDecoder::take_copied(const HandleEntry& entry, std::size_t index) {
  if (copied_ == nullptr || copied_->empty()) {
    throw ProtocolError("handle " + std::to_string(index) +
                        " is a copied storage, but its bytes did not come with the frame (only a transport "
                        "without shared memory, ucx://, carries them)");
  }
  std::shared_ptr<Storage> storage = std::move(copied_->front());
  copied_->pop_front();
  if (storage->nbytes() != entry.nbytes) {
    throw ProtocolError("handle " + std::to_string(index) + " field nbytes claims " + std::to_string(entry.nbytes) +
                        " bytes but " + std::to_string(storage->nbytes()) + " arrived for it");
  }
  return storage;
}

detail::MessageDecoder::SegmentFd detail::MessageDecoder::open_segment(const detail::SegmentEntry& entry,
                                                                       std::size_t index,
                                                                       std::vector<detail::UniqueFd>& frame_fds,
                                                                       std::size_t& next_fd) {
  if (static_cast<detail::SegmentKind>(entry.kind) == detail::SegmentKind::NewFd) {
    if (next_fd >= frame_fds.size()) {
      throw ProtocolError("frame has more fd segments than the " + std::to_string(frame_fds.size()) +
                          " fds that came with it");
    }
    detail::UniqueFd fd = std::move(frame_fds[next_fd++]);
    const detail::SharedMemory::Received file = detail::SharedMemory::inspect_received(fd.get());
    return SegmentFd{std::move(fd), file};
  }
  if (entry.pid <= 0 || entry.fd < 0) {
    throw ProtocolError("segment " + std::to_string(index) + " names an invalid process " + std::to_string(entry.pid) +
                        " or fd " + std::to_string(entry.fd));
  }
  detail::PeerFdOpener::Taken taken = connection_.peer_fds.take(entry.pid, entry.fd);
  if (!taken.fd) {
    const int error = taken.error;
    const std::string where = detail::PeerFdOpener::describe(entry.pid, entry.fd, taken.method);
    if (error == EMFILE || error == ENFILE) {
      throw ProtocolError("cannot open the sender's segment at " + where +
                          ": this process has reached its open-file limit (RLIMIT_NOFILE" +
                          (error == ENFILE ? std::string(", system-wide") : std::string()) +
                          "); raise it with `ulimit -n` or hold fewer received segments at once");
    }
    // A sender killed after writing the frame takes its fds with it: that is a dead peer,
    // not a protocol violation.
    if (connection_.peer_fds.exited(entry.pid, kSenderExitGrace)) {
      throw PeerDied("the sending process " + std::to_string(entry.pid) +
                     " died before this receiver could map a segment it sent (" + where + ": " +
                     detail::errno_text(error) + ")");
    }
    throw ProtocolError("cannot open the sender's segment at " + where + " (" + detail::errno_text(error) +
                        "); the sender died, or this process may not read it: it must run as the same user, and no "
                        "security module (SELinux, AppArmor) may forbid it");
  }
  detail::UniqueFd fd = std::move(taken.fd);
  detail::SharedMemory::Received file;
  try {
    file = detail::SharedMemory::inspect_received(fd.get());
  } catch (const ProtocolError& error) {
    throw ProtocolError("the file at " + detail::PeerFdOpener::describe(entry.pid, entry.fd, taken.method) +
                        " is not a segment this receiver can map (fd reused?): " + error.what());
  }
  if (file.identity != detail::FileIdentity{entry.device, entry.inode}) {
    throw ProtocolError("the file at " + detail::PeerFdOpener::describe(entry.pid, entry.fd, taken.method) +
                        " is not the segment the frame names (fd reused?)");
  }
  return SegmentFd{std::move(fd), file};
}

void detail::MessageDecoder::add_segment(const detail::SegmentEntry& entry, std::size_t index,
                                         std::vector<detail::UniqueFd>& frame_fds, std::size_t& next_fd) {
  if (static_cast<detail::SegmentRole>(entry.role) == detail::SegmentRole::RetiredUpstreamBoard) {
    retire_upstream_board(entry, index);
    return;
  }
  const auto kind = static_cast<detail::SegmentKind>(entry.kind);
  if (kind != detail::SegmentKind::NewFd && kind != detail::SegmentKind::NewProcFd) {
    throw ProtocolError("segment " + std::to_string(index) + " has an unknown kind " + std::to_string(entry.kind));
  }
  if (kind == detail::SegmentKind::NewProcFd) wants_acknowledgement_ = true;
  const auto role = static_cast<detail::SegmentRole>(entry.role);
  if (role == detail::SegmentRole::ReturnBoard) {
    if (connection_.holds.has_board())
      throw ProtocolError("segment " + std::to_string(index) + " is a second return board");
    if (entry.size != detail::ReturnBoard::bytes()) {
      throw ProtocolError("segment " + std::to_string(index) + " is a return board whose field size claims " +
                          std::to_string(entry.size) + " bytes instead of " +
                          std::to_string(detail::ReturnBoard::bytes()));
    }
    SegmentFd opened = open_segment(entry, index, frame_fds, next_fd);
    connection_.holds.adopt_board(detail::SharedMemory::map_received(std::move(opened.fd), opened.file, entry.size));
    return;
  }
  if (role == detail::SegmentRole::UpstreamBoard) {
    add_upstream_board(entry, index, frame_fds, next_fd);
    return;
  }
  if (role != detail::SegmentRole::Data) {
    throw ProtocolError("segment " + std::to_string(index) + " has an unknown role " + std::to_string(entry.role));
  }
  const std::uint32_t slot = entry.slot_or_reclaims;  // a Data segment's lease
  connection_.segments.check_free(slot, index);
  // A segment already mapped in this process (received on another channel, or ours sent
  // back) is not mapped again. Its fd is checked (seals, then identity and size: one fcntl
  // and one fstat) before its identity is looked up. A sender naming its fd by number is
  // opened too, although the identity it names may be mapped here: that the kernel let us
  // take its fd is the proof that it holds the segment (the identity alone is a number any
  // peer can write, also one of another user that could never open our segments).
  SegmentFd opened = open_segment(entry, index, frame_fds, next_fd);
  std::shared_ptr<detail::SharedSegment> segment = HandleCache::global().find(opened.file.identity);
  if (segment) {
    if (segment->size() != entry.size) {
      throw ProtocolError("segment " + std::to_string(index) + " field size claims " + std::to_string(entry.size) +
                          " bytes but the segment has " + std::to_string(segment->size()));
    }
    // Already mapped: a passed fd just closes (with `opened`).
  } else {
    const detail::FileIdentity identity = opened.file.identity;
    segment = HandleCache::global().insert(identity, detail::SharedSegment::adopt(detail::SharedMemory::map_received(
                                                         std::move(opened.fd), opened.file, entry.size)));
  }
  connection_.segments.place(slot, std::move(segment));
}

void detail::MessageDecoder::add_upstream_board(const detail::SegmentEntry& entry, std::size_t index,
                                                std::vector<detail::UniqueFd>& frame_fds, std::size_t& next_fd) {
  if (!connection_.holds.has_board()) {
    throw ProtocolError("segment " + std::to_string(index) +
                        " is an upstream return board but the sender never sent its own return board");
  }
  if (entry.size != detail::ReturnBoard::bytes()) {
    throw ProtocolError("segment " + std::to_string(index) + " is an upstream return board whose field size claims " +
                        std::to_string(entry.size) + " bytes instead of " +
                        std::to_string(detail::ReturnBoard::bytes()));
  }
  SegmentFd opened = open_segment(entry, index, frame_fds, next_fd);
  if (connection_.holds.knows(opened.file.identity)) return;  // a cycle brought it back: the fd just closes
  connection_.holds.add_upstream_board(
      detail::SharedMemory::map_received(std::move(opened.fd), opened.file, entry.size), entry.slot_or_reclaims, index);
}

void detail::MessageDecoder::retire_upstream_board(const detail::SegmentEntry& entry, std::size_t index) {
  if (static_cast<detail::SegmentKind>(entry.kind) != detail::SegmentKind::NoFd || entry.slot_or_reclaims != 0 ||
      entry.pid != 0 || entry.size != 0 || entry.fd != -1 || entry.reserved != 0) {
    throw ProtocolError("segment " + std::to_string(index) +
                        " retires an upstream return board but has fields other than its identity set");
  }
  if (!connection_.holds.has_board()) {
    throw ProtocolError("segment " + std::to_string(index) +
                        " retires an upstream return board but the sender never sent its own return board");
  }
  // Safe to forget: no block this process holds came through the board. The sender retires
  // a board once nothing of its connection lives there any more, and every block this
  // receiver holds keeps the sender's block pinned (and with it that block's connection).
  // A board this process never took (its frame failed here) has nothing to forget.
  connection_.holds.retire_upstream_board(detail::FileIdentity{entry.device, entry.inode});
}

void detail::MessageDecoder::claim_frame(std::uint64_t sequence, std::size_t index) {
  if (!connection_.holds.has_board()) {
    throw ProtocolError("handle " + std::to_string(index) +
                        " names a new block but the sender never sent its return board");
  }
  if (!connection_.holds.claim_frame(sequence)) {  // registers this process as a holder first
    throw ProtocolError("the sender gave up on frame " + std::to_string(sequence) +
                        " (it saw this receiver as gone, or it closed the channel and its close linger passed) "
                        "and may have recycled the memory it names");
  }
}

std::shared_ptr<Storage> detail::MessageDecoder::resolve_new_block(const HandleEntry& entry, std::size_t index) {
  const std::shared_ptr<SharedSegment>* found = connection_.segments.find(entry.segment_slot);
  if (found == nullptr) {
    throw ProtocolError("handle " + std::to_string(index) + " field segment_slot names slot " +
                        std::to_string(entry.segment_slot) + " which holds no segment lease");
  }
  const std::shared_ptr<SharedSegment>& segment = *found;
  if (entry.nbytes == 0) throw ProtocolError("handle " + std::to_string(index) + " field nbytes is 0");
  if (entry.offset > segment->size() || entry.nbytes > segment->size() - entry.offset) {
    throw ProtocolError("handle " + std::to_string(index) + " fields offset " + std::to_string(entry.offset) +
                        " and nbytes " + std::to_string(entry.nbytes) + " name a block outside its segment of " +
                        std::to_string(segment->size()) + " bytes");
  }
  // Allocators hand out aligned blocks only; a block between two would make its elements
  // misaligned for their type (reading one through a typed pointer is undefined behaviour).
  if (entry.offset % detail::kBlockAlignment != 0) {
    throw ProtocolError("handle " + std::to_string(index) + " field offset " + std::to_string(entry.offset) +
                        " is not a multiple of the block alignment of " + std::to_string(detail::kBlockAlignment) +
                        " bytes");
  }
  // A block this process sent (and someone forwarded back) resolves to the storage it sent;
  // the lease then holds only the block and a weak handle (see Lease).
  std::shared_ptr<Storage> own = segment->find_storage(entry.offset, entry.nbytes);
  std::shared_ptr<Allocation> own_allocation;
  if (!own && connection_.holds.has_own_upstream() && segment->created_in_this_process()) {
    // Its storage died here; no pin left means every holder of the connection it left on
    // exited and the block was reclaimed.
    own_allocation = connection_.holds.find_own_pinned(segment.get(), entry.offset);
    if (!own_allocation) {
      throw PeerDied("handle " + std::to_string(index) +
                     " names a block this process sent, which came back through processes that exited "
                     "meanwhile: it was reclaimed and may hold other data now; the frame cannot be read");
    }
  }
  auto block = connection_.holds.make_block(segment, entry.offset, entry.nbytes, entry.slot, std::move(own_allocation));
  Lease lease;
  if (own) {
    lease.handle = own;
    lease.allocation = std::move(block);
  } else {
    lease.core = Storage::adopt(std::move(block), true);
  }
  connection_.leases.place(entry.slot, std::move(lease));
  return own ? own : resolve_lease(*connection_.leases.find(entry.slot));
}

std::shared_ptr<Storage> detail::MessageDecoder::resolve_lease(Lease& lease) {
  if (auto handle = lease.handle.lock()) return handle;
  std::shared_ptr<Storage> handle;
  if (lease.core) {
    // A new handle on the same Storage object: same address, same id. When the user drops
    // its last handle, the deleter announces it like a death, so that senders that track
    // this storage release it (the core itself lives on in the lease).
    handle = std::shared_ptr<Storage>(
        lease.core.get(),
        [core = lease.core](Storage*) mutable {
          core->announce_dropped();
          core.reset();
        },
        detail::PoolAllocator<Storage>());
  } else {
    // A storage of our own, dropped by every user here, but still held by the sender: wrap
    // the same block again (no fd, no mmap).
    handle = Storage::adopt(lease.allocation, true);
  }
  lease.handle = handle;
  return handle;
}

void detail::MessageDecoder::release_all() noexcept {
  connection_.peer_fds.reset();
  connection_.leases.clear();
  connection_.segments.clear();
  storages_.clear();
  connection_.holds.reset();
}

void detail::MessageDecoder::hand_over() noexcept {
  connection_.holds.hand_over();
  release_all();
}

std::size_t detail::MessageDecoder::leased() const noexcept { return connection_.leases.live().size(); }

std::size_t detail::MessageDecoder::leased_segments() const noexcept { return connection_.segments.live().size(); }

}  // namespace ferry
