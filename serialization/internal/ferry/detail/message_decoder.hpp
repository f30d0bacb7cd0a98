// The receiving side of one connection: checks a frame's type, maps the segments it
// introduces (through the process-wide handle cache), resolves its handle table to storages
// (blocks of leased segments), and deserializes the body. See message_encoder.hpp for the
// lease protocol and holds.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/allocation.hpp"
#include "ferry/detail/archive.hpp"
#include "ferry/detail/connection_state.hpp"
#include "ferry/detail/erased_body.hpp"
#include "ferry/detail/frame.hpp"
#include "ferry/detail/peer_fd.hpp"
#include "ferry/detail/return_board.hpp"
#include "ferry/detail/shared_segment.hpp"
#include "ferry/detail/slot_table.hpp"
#include "ferry/detail/type_name.hpp"
#include "ferry/detail/unique_fd.hpp"
#include "ferry/storage.hpp"
#include "ferry/tensor_wire.hpp"

namespace ferry::detail {

class MessageDecoder {
 public:
  /// The most storage slots a sender may lease to one receiver.
  static constexpr std::uint32_t kMaxSlots = ReturnBoard::kSlots;
  /// The most segment slots a sender may lease to one receiver.
  static constexpr std::uint32_t kMaxSegmentSlots = detail::kMaxSegmentSlots;

  MessageDecoder(std::uint64_t expected_fingerprint, std::string_view expected_type_name)
      : expected_fingerprint_(expected_fingerprint), expected_type_name_(expected_type_name) {}
  ~MessageDecoder();  // out of line: its members' destructors are compiled once, there

  /// Resolves a message frame: `payload` is everything after the header; the frame's fds
  /// are taken from the front of `fds`. Throws TypeMismatch or ProtocolError, and PeerDied
  /// when a storage named by /proc path cannot be opened because its sender has exited.
  /// `copied`: the storages a transport without shared memory (UCX) received for the
  /// frame's Copied entries, in table order; the frame takes exactly those (none: null).
  /// `pending`: the end of the body still in the transport (a frame without fds, tables or
  /// releases only), read by read() as it gets there (null: the payload is whole).
  void decode(const FrameHeader& header, std::span<const std::byte> payload, std::deque<UniqueFd>& fds,
              std::deque<std::shared_ptr<Storage>>* copied = nullptr, PendingBody* pending = nullptr);

  /// Deserializes the body of the frame last decoded.
  template <class T>
  T read() {
    T value{};
    read(&value, received_type<T>);
    return value;
  }
  /// read(), into `out` (a default-constructed value of `type`; compiled once, here). A body
  /// that lies is a ProtocolError (read_message()).
  void read(void* out, const ReceivedType& type);

  /// Records on the return board that the frame last decoded was delivered (its value
  /// handed to the receiver's caller), when its sender tracks delivery (the frame has
  /// kFrameTracksDelivery, see MessageEncoder::track_delivery()): the board's last
  /// resolved frame then covers every frame up to it. Nothing for other frames, or before
  /// a board arrived; a sender that abandoned later frames refuses the claim, which
  /// changes nothing for a frame already read.
  void mark_delivered() noexcept {
    if (frame_tracked_) connection_.holds.mark_delivered(frame_sequence_);
  }
  /// The last frame's sequence when its sender tracks its delivery (kFrameTracksDelivery),
  /// else 0: a transport without a return board reports it (FrameReader::frame_delivered()).
  std::uint64_t tracked_sequence() const noexcept { return frame_tracked_ ? frame_sequence_ : 0; }

  /// True when the last frame named segments by /proc path and its sender needs an
  /// acknowledgement on the transport to let them go: the frame was not recorded on the
  /// return board (which acknowledges without a system call), or the sender asked for
  /// acknowledgements because it waits for them (ReturnBoard::request_acknowledgements()).
  bool wants_acknowledgement() const noexcept { return wants_acknowledgement_; }
  /// Drops every lease (the channel is closing), the return board, and the pidfd of the sender. Blocks still used by
  /// tensors of this process stay mapped, and are given back to the sender when those tensors die.
  void release_all() noexcept;
  /// This process lets go of a connection whose receiving state a forked process inherited
  /// (spawn handed it a used Receiver): drops every lease like release_all(), but no block
  /// received so far gives its slot back from this process, even when its last tensor here
  /// dies, since the other process may still hold it. The sender keeps those blocks until
  /// every process that holds what arrived on the connection has exited.
  void hand_over() noexcept;
  /// Registers the calling process as a holder of what arrived on the connection (its
  /// board and upstream boards), once per fork generation: a forked process that takes the
  /// receiver over (ReceiverCore::adopt()) holds what arrived so far before it reads again.
  /// Throws TooManyHolders when a board has no place for it, Error when /proc cannot be read.
  /// Inline: every read calls it, and once registered it is one load and two comparisons.
  void register_as_holder() { connection_.holds.register_as_holder(); }
  /// Storages leased on this connection.
  std::size_t leased() const noexcept;
  /// Segments leased on this connection.
  std::size_t leased_segments() const noexcept;

 private:
  // A lease keeps a storage the sender still holds (see ReceivingConnection::Lease).
  using Lease = ReceivingConnection::Lease;
  void check_type(const FrameHeader& header, std::span<const std::byte> name);
  // The archive over the body of the frame last decoded: the last frame's while it is
  // reusable() (FrameOutputArchive::reusable() says why), a new one otherwise.
  FrameInputArchive& input_archive() {
    if (!archive_) archive_ = std::make_unique<FrameInputArchive>(body_, storages_);
    archive_->restart_on_frame(body_, storages_);  // read() drops the storages after the body
    if (pending_ != nullptr) [[unlikely]]
      archive_->defer(pending_);
    return *archive_;
  }
  // The check of the common frame (no name, the expected fingerprint) inline.
  void check_type_fast(const FrameHeader& header, std::span<const std::byte> name) {
    if ((header.flags & kFrameHasTypeName) != 0 || header.type_fingerprint != expected_fingerprint_) {
      check_type(header, name);
    }
  }
  // decode() of a frame without fds, tables or releases.
  void decode_body_only(const FrameHeader& header, std::span<const std::byte> payload);
  // A segment's fd, checked by SharedMemory::inspect_received, not mapped yet.
  struct SegmentFd {
    UniqueFd fd;
    SharedMemory::Received file;
  };
  SegmentFd open_segment(const SegmentEntry& entry, std::size_t index, std::vector<UniqueFd>& frame_fds,
                         std::size_t& next_fd);
  void add_segment(const SegmentEntry& entry, std::size_t index, std::vector<UniqueFd>& frame_fds,
                   std::size_t& next_fd);
  std::shared_ptr<Storage> resolve_new_block(const HandleEntry& entry, std::size_t index);
  // The next storage of decode()'s `copied` for the Copied entry `index`, size checked.
  std::shared_ptr<Storage> take_copied(const HandleEntry& entry, std::size_t index);
  void retire_upstream_board(const SegmentEntry& entry, std::size_t index);
  void claim_frame(std::uint64_t sequence, std::size_t index);
  void add_upstream_board(const SegmentEntry& entry, std::size_t index, std::vector<UniqueFd>& frame_fds,
                          std::size_t& next_fd);
  void resolve_tables(const FrameHeader& header, std::span<const std::byte> segment_table,
                      std::span<const std::byte> table, std::vector<UniqueFd>& frame_fds);
  void give_back_unresolved(std::span<const std::byte> table, std::uint32_t count) noexcept;

  std::shared_ptr<Storage> resolve_lease(Lease& lease);
  // A Leased entry `index`: the storage leased at its slot, checked against the entry.
  std::shared_ptr<Storage> resolve_leased(const HandleEntry& entry, std::size_t index);

  // Resolves the CudaIpc entry `index` with the `record`-th CUDA record of the frame, through
  // the CUDA strategy (connection_.cuda, made with the first CUDA entry; none in a build without CUDA).
  std::shared_ptr<Storage> resolve_cuda(const HandleEntry& entry, std::uint32_t index, std::size_t record);

  std::uint64_t expected_fingerprint_;
  std::string_view expected_type_name_;
  // What this end keeps from frame to frame: the leases, the return path, the CUDA
  // strategy, the sender's type name (connection_state.hpp). The rest is the frame.
  ReceivingConnection connection_;
  std::vector<std::shared_ptr<Storage>> storages_;
  std::span<const std::byte> body_;
  PendingBody* pending_ = nullptr;  // decode()'s `pending`: the end of body_ still in the transport
  std::unique_ptr<FrameInputArchive> archive_;
  std::deque<std::shared_ptr<Storage>>* copied_ = nullptr;  // decode()'s `copied`, while it runs
  bool wants_acknowledgement_ = false;
  bool frame_claimed_ = false;        // the last frame was claimed on the board
  std::uint64_t frame_sequence_ = 0;  // the sequence of the last frame decoded
  bool frame_tracked_ = false;        // it had kFrameTracksDelivery
};

}  // namespace ferry::detail
