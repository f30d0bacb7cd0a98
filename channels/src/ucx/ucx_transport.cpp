#include "ucx_transport.hpp"

#include <cstring>
#include <utility>

#include "ferry/error.hpp"

namespace ferry::ucx::detail {

namespace {
// No shared memory between the ends: tensors travel as their bytes.
ferry::detail::TransportCapabilities copying_capabilities() noexcept {
  ferry::detail::TransportCapabilities capabilities;
  capabilities.carries_copies = true;
  return capabilities;
}
// The worker's wake-up fd fires for any UCX event; has_buffered_frame() re-arms it. The
// storages of a frame's Copied entries arrive in `copies`.
ferry::detail::TransportCapabilities hinting_capabilities(const UcxConnection* connection,
                                                          std::deque<std::shared_ptr<Storage>>* copies) noexcept {
  ferry::detail::TransportCapabilities capabilities;
  capabilities.readiness_fd = connection != nullptr ? connection->wake_fd() : -1;
  capabilities.readiness_fd_is_a_hint = true;
  capabilities.copied_storages = copies;
  return capabilities;
}
}  // namespace

UcxFrameWriter::UcxFrameWriter(std::shared_ptr<UcxConnection> connection, std::chrono::milliseconds close_linger)
    : FrameWriter(copying_capabilities()), connection_(std::move(connection)), close_linger_(close_linger) {}

UcxFrameWriter::~UcxFrameWriter() { close(); }

bool UcxFrameWriter::write(std::span<const iovec> parts, std::span<const int> fds,
                           const ferry::detail::Deadline& deadline) {
  if (!fds.empty()) throw Error("a ucx:// connection cannot pass file descriptors");
  return write_copies(parts, {}, {}, deadline);
}

bool UcxFrameWriter::write_copies(std::span<const iovec> parts, std::span<const iovec> copies,
                                  std::span<const std::shared_ptr<Storage>> owners,
                                  const ferry::detail::Deadline& deadline) {
  if (!connection_) throw ChannelClosed("cannot send: this end of the ucx:// connection is closed");
  return connection_->send_frame(parts, copies, owners, deadline, waits_charged_to());
}

bool UcxFrameWriter::flush(const ferry::detail::Deadline& deadline) {
  if (!connection_) return true;
  return connection_->flush(deadline, waits_charged_to());
}

void UcxFrameWriter::close() noexcept {
  if (!connection_) return;
  // The end-of-stream frame (sent before close() by SenderCore) must reach the peer: flush.
  if (connection_.use_count() == 1) connection_->close(close_linger_);
  connection_.reset();
}

UcxFrameReader::UcxFrameReader(std::shared_ptr<UcxConnection> connection, const FrameLimits& limits)
    : FrameReader(hinting_capabilities(connection.get(), &copies_)),
      connection_(std::move(connection)),
      limits_(limits) {}

UcxFrameReader::~UcxFrameReader() { close(); }

ReadStatus UcxFrameReader::read(ferry::detail::FrameHeader& header, std::vector<std::byte>& payload,
                                std::deque<ferry::detail::UniqueFd>& /*fds*/, const ferry::detail::Deadline& deadline) {
  if (!connection_ || peer_closed_) return ReadStatus::Closed;
  copies_.clear();
  std::optional<IncomingFrame> frame = connection_->receive_frame(deadline, waits_charged_to());
  if (!frame) return ReadStatus::Timeout;
  // The frame's bytes, then its inline storages (UcxConnection::send_frame).
  std::memcpy(&header, frame->bytes.data(), sizeof header);
  ferry::detail::validate_header(header, limits_);
  const std::uint64_t payload_size = ferry::detail::payload_bytes(header);
  std::size_t position = sizeof header + payload_size;
  std::size_t inline_bytes = 0;
  for (const CopyDescriptor& descriptor : frame->descriptors) {
    if (descriptor.inline_copy != 0) inline_bytes += descriptor.nbytes;
  }
  if (position + inline_bytes != frame->bytes.size()) {
    throw ProtocolError("a ucx frame message holds " + std::to_string(frame->bytes.size()) + " bytes but its header " +
                        "and storages claim " + std::to_string(position + inline_bytes));
  }
  payload.assign(frame->bytes.begin() + sizeof header, frame->bytes.begin() + static_cast<std::ptrdiff_t>(position));
  frame->copies.resize(frame->descriptors.size());
  for (std::size_t i = 0; i < frame->descriptors.size(); ++i) {
    const CopyDescriptor& descriptor = frame->descriptors[i];
    if (descriptor.inline_copy == 0) {
      copies_.push_back(std::move(frame->copies[i]));
      continue;
    }
    auto storage = Storage::allocate(descriptor.nbytes, Device::SharedCpu);
    if (descriptor.nbytes > 0) std::memcpy(storage->data(), frame->bytes.data() + position, descriptor.nbytes);
    position += descriptor.nbytes;
    copies_.push_back(std::move(storage));
  }
  if (header.kind == static_cast<std::uint8_t>(ferry::detail::FrameKind::Close)) {
    peer_closed_ = true;
    // Nothing more will be read: let the sender's closing flush end now, not when this
    // end is dropped (unless this side's writer of a duplex connection still sends on it).
    if (connection_.use_count() == 1) connection_->close(std::chrono::milliseconds(0), true);
    return ReadStatus::Closed;
  }
  return ReadStatus::Frame;
}

bool UcxFrameReader::has_buffered_frame() const {
  if (!connection_ || peer_closed_) return true;
  return connection_->frame_ready();
}

void UcxFrameReader::close() noexcept {
  if (!connection_) return;
  // The receiver is gone: nothing needs flushing, and the sender learns it at its next send.
  if (connection_.use_count() == 1) connection_->close(std::chrono::milliseconds(200), true);
  connection_.reset();
  copies_.clear();
}

}  // namespace ferry::ucx::detail
