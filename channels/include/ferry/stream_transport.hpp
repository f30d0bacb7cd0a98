// Pipe and Unix socket transports: frames over a byte stream.
#pragma once

#include <cstddef>
#include <vector>

#include "ferry/transport.hpp"

namespace ferry {

/// Writes frames to a pipe or a stream socket. With a socket, the frame's fds travel as
/// SCM_RIGHTS with its first byte; with a pipe, `acknowledgements` is the read end of the
/// reader's acknowledgement pipe (non-blocking).
class StreamFrameWriter final : public FrameWriter {
 public:
  StreamFrameWriter(UniqueFd stream, UniqueFd acknowledgements, bool is_socket);
  bool passes_fds() const override { return is_socket_; }
  bool write(std::span<const iovec> parts, std::span<const int> fds, const Deadline& deadline) override;
  std::uint64_t acknowledged() override;
  bool wait_acknowledged(std::uint64_t sequence, const Deadline& deadline) override;
  void close() noexcept override;
  std::vector<int> descriptors() const override;

 private:
  UniqueFd stream_;
  UniqueFd acknowledgements_;
  bool is_socket_;
  std::uint64_t acknowledged_ = 0;
  bool reader_gone_ = false;
};

/// Reads frames from a pipe or a stream socket, buffering so that a small frame costs one
/// read system call. Enforces FrameLimits on every header before reading the rest.
class StreamFrameReader final : public FrameReader {
 public:
  StreamFrameReader(UniqueFd stream, UniqueFd acknowledgements, bool is_socket, const FrameLimits& limits);
  ReadStatus read(FrameHeader& header, std::vector<std::byte>& payload, std::deque<UniqueFd>& fds,
                  const Deadline& deadline) override;
  void acknowledge(std::uint64_t sequence) override;
  void close() noexcept override;
  std::vector<int> descriptors() const override;

 private:
  // Reads what is available (at least one byte, blocking) into `into`; returns 0 at EOF.
  std::size_t receive(std::byte* into, std::size_t capacity, std::deque<UniqueFd>& fds);
  std::size_t buffered() const noexcept { return end_ - begin_; }

  UniqueFd stream_;
  UniqueFd acknowledgements_;
  bool is_socket_;
  FrameLimits limits_;
  bool peer_closed_ = false;
  std::vector<std::byte> buffer_;
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
};

/// Makes SIGPIPE harmless for the process (if it still has the default action), so that a
/// write to a pipe whose reader died reports EPIPE instead of killing the process.
void ignore_sigpipe();

}  // namespace ferry
