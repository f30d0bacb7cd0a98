// The UCX transport: a FrameWriter/FrameReader pair over one UcxConnection. Frames carry
// no fds and no shared segments: each tensor storage's bytes travel with its frame
// (HandlePassing::Copying), and the reader hands the decoder the storages they arrived in.
#pragma once

#include <deque>
#include <memory>

#include "ferry/detail/transport.hpp"
#include "ucx_connection.hpp"

namespace ferry::ucx::detail {

class UcxFrameWriter final : public ferry::detail::FrameWriter {
 public:
  UcxFrameWriter(std::shared_ptr<UcxConnection> connection, std::chrono::milliseconds close_linger);
  ~UcxFrameWriter() override;
  /// Starts sending the frame; false when the frames still in flight to a receiver that
  /// does not read stayed above their limit until `deadline` (nothing is sent then).
  bool write(std::span<const iovec> parts, std::span<const int> fds, const ferry::detail::Deadline& deadline) override;
  bool write_copies(std::span<const iovec> parts, std::span<const iovec> copies,
                    std::span<const std::shared_ptr<Storage>> owners, const ferry::detail::Deadline& deadline) override;
  /// Waits until every frame sent has left.
  bool flush(const ferry::detail::Deadline& deadline) override;
  std::uint64_t delivered_by_reader() override { return connection_ ? connection_->delivered() : 0; }
  void close() noexcept override;
  void shut_down() noexcept override { close(); }

 private:
  std::shared_ptr<UcxConnection> connection_;
  std::chrono::milliseconds close_linger_;
};

class UcxFrameReader final : public ferry::detail::FrameReader {
 public:
  UcxFrameReader(std::shared_ptr<UcxConnection> connection, const FrameLimits& limits);
  ~UcxFrameReader() override;
  ReadStatus read(ferry::detail::FrameHeader& header, std::vector<std::byte>& payload,
                  std::deque<ferry::detail::UniqueFd>& fds, const ferry::detail::Deadline& deadline) override;
  void frame_delivered(std::uint64_t sequence) override {
    if (connection_) connection_->send_delivered(sequence);
  }
  void close() noexcept override;
  void shut_down() noexcept override { close(); }
  bool has_buffered_frame() const override;

 private:
  std::shared_ptr<UcxConnection> connection_;
  FrameLimits limits_;
  bool peer_closed_ = false;
  std::deque<std::shared_ptr<Storage>> copies_;
};

}  // namespace ferry::ucx::detail
