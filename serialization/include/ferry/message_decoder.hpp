// The receiving side of one connection: checks a frame's type, resolves its handle table
// to mapped storages (through the leases of this connection and the process-wide handle
// cache), and deserializes the body.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/archive.hpp"
#include "ferry/body_reader.hpp"
#include "ferry/frame.hpp"
#include "ferry/storage.hpp"
#include "ferry/tensor_wire.hpp"
#include "ferry/type_name.hpp"
#include "ferry/unique_fd.hpp"

namespace ferry {

class MessageDecoder {
 public:
  /// The most slots a sender may lease to one receiver.
  static constexpr std::uint32_t kMaxSlots = 1u << 20;

  MessageDecoder(std::uint64_t expected_fingerprint, std::string_view expected_type_name)
      : expected_fingerprint_(expected_fingerprint), expected_type_name_(expected_type_name) {}

  /// Resolves a message frame: `payload` is everything after the header; the frame's fds
  /// are taken from the front of `fds`. Throws TypeMismatch or ProtocolError, and PeerDied
  /// when a storage named by /proc path cannot be opened because its sender has exited.
  void decode(const FrameHeader& header, std::span<const std::byte> payload, std::deque<UniqueFd>& fds);

  /// Deserializes the body of the frame last decoded.
  template <class T>
  T read() {
    T value = read_body<T>(body_, storages_);
    storages_.clear();
    return value;
  }

  /// True when the last frame named storages by /proc path, whose sender waits for an
  /// acknowledgement to let them go.
  bool wants_acknowledgement() const noexcept { return wants_acknowledgement_; }
  /// Drops every lease (the channel is closing).
  void release_all() noexcept;
  /// Storages leased on this connection.
  std::size_t leased() const noexcept;

 private:
  void check_type(const FrameHeader& header, std::span<const std::byte> name);
  std::shared_ptr<Storage> map_received(UniqueFd fd, const HandleEntry& entry);
  std::shared_ptr<Storage> open_proc_fd(const HandleEntry& entry);

  std::uint64_t expected_fingerprint_;
  std::string_view expected_type_name_;
  std::string peer_type_name_;
  // A lease keeps a storage the sender still holds. For a storage received from another
  // process it owns the Storage object itself (the "core"), so that the storage keeps its
  // identity across messages, and hands the user *handles*: shared_ptrs with their own
  // control block that point at the core. The sender's encoder watches the handle, so the
  // storage counts as dropped once the user dropped every handle, even though the lease
  // still owns the core. For a storage that this process created itself (a tensor sent back
  // to its creator), the lease owns only the allocation: owning the creator's Storage
  // object would keep it alive through the lease and its release would never be
  // announced, keeping both processes' leases alive forever.
  struct Lease {
    std::shared_ptr<Allocation> allocation;
    std::shared_ptr<Storage> core;   // received storages only
    std::weak_ptr<Storage> handle;   // what the user holds, while it lives
    explicit operator bool() const noexcept { return allocation != nullptr; }
  };
  static Lease make_lease(const std::shared_ptr<Storage>& storage);
  std::shared_ptr<Storage> resolve_lease(Lease& lease);

  // CUDA storages (defined in serialization/src/cuda_handles.cpp): resolves the CudaIpc
  // entry `index` with the `record`-th CUDA record of the frame; the events opened so far.
  struct CudaReceiveState;
  std::shared_ptr<Storage> resolve_cuda(const HandleEntry& entry, std::uint32_t index, std::size_t record);
  std::shared_ptr<CudaReceiveState> cuda_;

  std::vector<Lease> leases_;  // by slot
  std::vector<std::shared_ptr<Storage>> storages_;
  std::span<const std::byte> body_;
  bool wants_acknowledgement_ = false;
};

}  // namespace ferry
