// The sending side of one connection: turns a message into a frame, and remembers which
// storages the receiver holds so that a storage is passed (fd, mmap) once and afterwards
// referenced by its slot alone.
//
// Lease protocol. The sender gives every storage it passes a slot; the receiver keeps the
// mapped storage at that slot (a lease) until the sender announces, in a later frame, that
// the slot is released. The sender announces a release once its own last reference to the
// storage died, so the receiver never keeps mapped more than the sender keeps alive, and a
// storage sent again while alive costs no fd passing and no mmap. Frames arrive in order,
// so a slot reference always finds its lease.
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ferry/archive.hpp"
#include "ferry/frame.hpp"
#include "ferry/storage.hpp"
#include "ferry/tensor_wire.hpp"
#include "ferry/type_name.hpp"

namespace ferry {

/// A frame ready for a transport: byte parts in order and the fds to pass with it.
struct EncodedFrame {
  std::array<iovec, 6> parts{};
  std::size_t part_count = 0;
  std::span<const int> fds;
  std::uint64_t sequence = 0;
  std::size_t bytes = 0;
  std::span<const iovec> iovecs() const { return {parts.data(), part_count}; }
};

/// How storages reach the receiver on this connection.
enum class HandlePassing {
  FdPassing,  ///< memfds travel with the frame (SCM_RIGHTS over a Unix socket)
  ProcFd,     ///< the receiver opens /proc/<sender pid>/fd/<n>; needs acknowledgements
};

class MessageEncoder {
 public:
  explicit MessageEncoder(HandlePassing passing) : passing_(passing) {}

  /// Encodes `message` into a frame. The frame stays valid until the next encode call.
  /// Call commit() once the transport sent it, or rollback() if it was not sent.
  template <class T>
  const EncodedFrame& encode(const T& message) {
    begin();
    {
      FrameOutputArchive archive(body_, *this);
      archive(message);
    }
    return finish(FrameKind::Message, type_fingerprint<T>(), type_name<T>());
  }
  /// Encodes the end-of-stream frame.
  const EncodedFrame& encode_close();
  void commit();
  void rollback();

  /// Adds `storage` to the frame being encoded (once per storage); returns its index in
  /// the frame's handle table. Heap storages are moved into shared memory first.
  std::uint32_t add_storage(const std::shared_ptr<Storage>& storage);

  /// The receiver has mapped the storages of every frame up to `sequence` (ProcFd only).
  void acknowledge(std::uint64_t sequence);
  /// True while storages are kept alive for frames the receiver has not acknowledged.
  bool awaiting_acknowledgement() const noexcept { return !keepalive_.empty(); }
  /// The newest sequence whose acknowledgement is awaited (0: none).
  std::uint64_t newest_awaited_sequence() const noexcept { return keepalive_.empty() ? 0 : keepalive_.back().first; }
  /// Storages the receiver currently leases from this sender, as far as it knows.
  std::size_t tracked_storages() const noexcept { return sent_.size(); }
  /// Storages passed so far by fd or /proc path (not as leases): each cost the receiver
  /// an fd and, unless it already mapped the segment, an mmap.
  std::uint64_t storages_passed() const noexcept { return storages_passed_; }

 private:
  struct SentStorage {
    std::uint32_t slot;
    std::weak_ptr<Storage> storage;
  };
  void begin();
  const EncodedFrame& finish(FrameKind kind, std::uint64_t fingerprint, std::string_view name);

  // CUDA storages (defined in serialization/src/cuda_handles.cpp): the connection's release
  // boards and interprocess events, and the CUDA records of the frame being encoded.
  struct CudaSendState;
  std::uint32_t add_cuda_storage(const std::shared_ptr<Storage>& storage);
  HandleEntry cuda_entry(const std::shared_ptr<Storage>& storage);
  std::span<const std::byte> cuda_section() const noexcept;
  void cuda_begin_frame() noexcept;
  void cuda_end_frame(bool sent) noexcept;
  std::shared_ptr<CudaSendState> cuda_;

  void collect_dead_storages();
  std::uint32_t take_slot();

  HandlePassing passing_;
  std::uint64_t next_sequence_ = 1;
  bool type_name_sent_ = false;
  std::uint64_t seen_deaths_ = 0;
  std::uint64_t storages_passed_ = 0;

  std::unordered_map<std::uint64_t, SentStorage> sent_;  // by Storage::id()
  std::vector<std::uint32_t> unannounced_releases_;       // slots whose storage died
  std::vector<std::uint32_t> free_slots_;                 // released and announced
  std::uint32_t next_slot_ = 0;
  std::deque<std::pair<std::uint64_t, std::shared_ptr<Storage>>> keepalive_;  // ProcFd in flight

  // The frame being encoded.
  FrameHeader header_;
  std::string_view type_name_;
  std::vector<std::byte> body_;
  std::vector<std::shared_ptr<Storage>> storages_;
  std::vector<HandleEntry> entries_;
  std::vector<int> fds_;
  std::vector<std::uint64_t> new_storage_ids_;
  std::size_t announced_release_count_ = 0;
  EncodedFrame frame_;
};

}  // namespace ferry
