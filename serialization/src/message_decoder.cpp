#include "ferry/message_decoder.hpp"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "ferry/cuda_frame.hpp"
#include "ferry/handle_cache.hpp"
#include "ferry/process_exit.hpp"

namespace ferry {
namespace {

// How long a receiver that cannot open a sender's /proc fd waits for the sender's exit to
// complete before calling the frame a lie (an exit closes the fds before the process
// becomes a zombie).
constexpr std::chrono::milliseconds kSenderExitGrace{200};

std::string hex(std::uint64_t value) {
  char text[19];
  std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace

void MessageDecoder::check_type(const FrameHeader& header, std::span<const std::byte> name) {
  if (header.flags & kFrameHasTypeName) {
    peer_type_name_.assign(reinterpret_cast<const char*>(name.data()), name.size());
  }
  if (header.type_fingerprint == expected_fingerprint_) return;
  const std::string sent = !peer_type_name_.empty() && fnv1a64(peer_type_name_) == header.type_fingerprint
                               ? "'" + peer_type_name_ + "'"
                               : "an unknown type (fingerprint " + hex(header.type_fingerprint) + ")";
  throw TypeMismatch("type mismatch: the sender sends " + sent + " but this Receiver expects '" +
                     std::string(expected_type_name_) + "'; connect a Sender<T> only to a Receiver<T>");
}

void MessageDecoder::decode(const FrameHeader& header, std::span<const std::byte> payload, std::deque<UniqueFd>& fds) {
  wants_acknowledgement_ = false;
  storages_.clear();
  // Take this frame's fds first, so that they are closed whatever goes wrong below.
  if (fds.size() < header.fd_count) {
    const std::size_t arrived = fds.size();
    fds.clear();
    throw ProtocolError("frame claims " + std::to_string(header.fd_count) + " file descriptors but " +
                        std::to_string(arrived) + " arrived");
  }
  std::vector<UniqueFd> frame_fds;
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
  check_type(header, take(header.type_name_bytes));
  const auto table = take(std::size_t{header.handle_count} * sizeof(HandleEntry));
  const auto releases = take(std::size_t{header.release_count} * sizeof(std::uint32_t));
  body_ = take(header.body_bytes);

  for (std::uint32_t i = 0; i < header.release_count; ++i) {
    std::uint32_t slot = 0;
    std::memcpy(&slot, releases.data() + i * sizeof slot, sizeof slot);
    if (slot >= leases_.size() || !leases_[slot]) {
      throw ProtocolError("frame releases slot " + std::to_string(slot) + " which holds no lease");
    }
    leases_[slot] = Lease{};
  }

  std::size_t next_fd = 0;
  std::size_t cuda_records = 0;
  storages_.reserve(header.handle_count);
  for (std::uint32_t i = 0; i < header.handle_count; ++i) {
    HandleEntry entry;
    std::memcpy(&entry, table.data() + i * sizeof entry, sizeof entry);
    const auto kind = static_cast<HandleKind>(entry.kind);
    if (kind == HandleKind::Leased) {
      if (entry.slot >= leases_.size() || !leases_[entry.slot]) {
        throw ProtocolError("handle " + std::to_string(i) + " refers to slot " + std::to_string(entry.slot) +
                            " which holds no lease");
      }
      if (leases_[entry.slot].allocation->device().kind == DeviceKind::Cuda) {
        throw ProtocolError("handle " + std::to_string(i) + " refers to the CUDA storage at slot " +
                            std::to_string(entry.slot) + " as a plain lease");
      }
      storages_.push_back(resolve_lease(leases_[entry.slot]));
      continue;
    }
    if (kind == HandleKind::CudaIpc) {  // CUDA IPC: cuda_handles.cpp
      storages_.push_back(resolve_cuda(entry, i, cuda_records++));
      continue;
    }
    if (kind != HandleKind::NewFd && kind != HandleKind::NewProcFd) {
      throw ProtocolError("handle " + std::to_string(i) + " has an unknown kind " + std::to_string(entry.kind));
    }
    if (entry.slot >= kMaxSlots) {
      throw ProtocolError("handle " + std::to_string(i) + " asks for slot " + std::to_string(entry.slot) +
                          ", above the limit of " + std::to_string(kMaxSlots));
    }
    if (entry.slot < leases_.size() && leases_[entry.slot]) {
      throw ProtocolError("handle " + std::to_string(i) + " reuses slot " + std::to_string(entry.slot) +
                          " before releasing it");
    }
    std::shared_ptr<Storage> storage;
    if (kind == HandleKind::NewFd) {
      if (next_fd >= frame_fds.size()) {
        throw ProtocolError("frame has more fd handles than the " + std::to_string(frame_fds.size()) +
                            " fds that came with it");
      }
      storage = map_received(std::move(frame_fds[next_fd++]), entry);
    } else {
      storage = open_proc_fd(entry);
      wants_acknowledgement_ = true;
    }
    if (entry.slot >= leases_.size()) leases_.resize(entry.slot + 1);
    leases_[entry.slot] = make_lease(storage);
    storages_.push_back(resolve_lease(leases_[entry.slot]));
  }
  body_ = body_.subspan(cuda_records * sizeof(CudaHandleRecord));  // resolve_cuda checked the length
  if (next_fd != frame_fds.size()) {
    throw ProtocolError("frame carries " + std::to_string(frame_fds.size()) + " fds but only " +
                        std::to_string(next_fd) + " fd handles");
  }
}

std::shared_ptr<Storage> MessageDecoder::map_received(UniqueFd fd, const HandleEntry& entry) {
  const FileIdentity identity = identify_fd(fd.get());
  if (auto cached = HandleCache::global().find(identity)) {
    if (cached->nbytes() != entry.nbytes) {
      throw ProtocolError("received storage claims " + std::to_string(entry.nbytes) + " bytes but its segment has " +
                          std::to_string(cached->nbytes()));
    }
    return cached;  // already mapped in this process: the new fd just closes
  }
  auto storage = Storage::adopt(
      std::make_shared<SharedMemoryAllocation>(SharedMemory::open_received(std::move(fd), entry.nbytes)), true);
  return HandleCache::global().insert(identity, storage);
}

std::shared_ptr<Storage> MessageDecoder::open_proc_fd(const HandleEntry& entry) {
  const FileIdentity claimed{entry.device, entry.inode};
  if (auto cached = HandleCache::global().find(claimed)) {
    if (cached->nbytes() != entry.nbytes) {
      throw ProtocolError("received storage claims " + std::to_string(entry.nbytes) + " bytes but its segment has " +
                          std::to_string(cached->nbytes()));
    }
    return cached;
  }
  if (entry.pid <= 0 || entry.fd < 0) {
    throw ProtocolError("handle names an invalid process " + std::to_string(entry.pid) + " or fd " +
                        std::to_string(entry.fd));
  }
  const std::string path = "/proc/" + std::to_string(entry.pid) + "/fd/" + std::to_string(entry.fd);
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd) {
    const int error = errno;
    if (error == EMFILE || error == ENFILE) {
      throw ProtocolError("cannot open the sender's storage at " + path +
                          ": this process has reached its open-file limit (RLIMIT_NOFILE" +
                          (error == ENFILE ? std::string(", system-wide") : std::string()) +
                          "); raise it with `ulimit -n` or hold fewer received tensors at once");
    }
    // A sender killed after writing the frame takes its fds with it: that is a dead peer,
    // not a protocol violation.
    if (process_has_exited(entry.pid, kSenderExitGrace)) {
      throw PeerDied("the sending process " + std::to_string(entry.pid) +
                     " died before this receiver could map a storage it sent (" + path + ": " +
                     std::strerror(error) + ")");
    }
    throw ProtocolError("cannot open the sender's storage at " + path + " (" + std::strerror(error) +
                        "); the sender died or is not allowed to be read by this process (same user needed)");
  }
  if (identify_fd(fd.get()) != claimed) {
    throw ProtocolError("the file at " + path + " is not the storage the frame names (fd reused?)");
  }
  auto storage = Storage::adopt(
      std::make_shared<SharedMemoryAllocation>(SharedMemory::open_received(std::move(fd), entry.nbytes)), true);
  return HandleCache::global().insert(claimed, storage);
}

MessageDecoder::Lease MessageDecoder::make_lease(const std::shared_ptr<Storage>& storage) {
  Lease lease;
  lease.allocation = storage->shared_allocation();
  if (storage->received()) {
    lease.core = storage;
  } else {
    lease.handle = storage;  // our own storage: hand out the creator's object while it lives
  }
  return lease;
}

std::shared_ptr<Storage> MessageDecoder::resolve_lease(Lease& lease) {
  if (auto handle = lease.handle.lock()) return handle;
  std::shared_ptr<Storage> handle;
  if (lease.core) {
    // A new handle on the same Storage object: same address, same id. When the user drops
    // its last handle, the deleter announces it like a death, so that senders that track
    // this storage release it (the core itself lives on in the lease).
    handle = std::shared_ptr<Storage>(lease.core.get(), [core = lease.core](Storage*) mutable {
      core->announce_dropped();
      core.reset();
    });
  } else {
    // Our own storage, dropped by every user here, but still held by the sender: wrap the
    // same mapping again (no fd, no mmap).
    handle = Storage::adopt(lease.allocation, true);
  }
  lease.handle = handle;
  return handle;
}

void MessageDecoder::release_all() noexcept {
  leases_.clear();
  storages_.clear();
}

std::size_t MessageDecoder::leased() const noexcept {
  return static_cast<std::size_t>(
      std::count_if(leases_.begin(), leases_.end(), [](const Lease& lease) { return static_cast<bool>(lease); }));
}

}  // namespace ferry
