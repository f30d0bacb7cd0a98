// Pipe and Unix socket transports: frames over a byte stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ferry/detail/transport.hpp"

namespace ferry {

/// Writes frames to a pipe or a stream socket. With a socket, the frame's fds travel as
/// SCM_RIGHTS with its first byte, or, above 253 (SCM_MAX_FD), in batches of 253 with
/// its first bytes, one byte each, and the last batch with the rest of the frame. With a pipe, `side` is this end of a
/// Unix socket pair next to the pipe: a frame's fds (there are some only when this process does not let peers take its
/// fds, see HandlePassing::ProcFdWhileTakeable) go out on it just before the frame (SegmentFdChannel), and
/// acknowledgements come back on it, read only while wait_acknowledged() waits: a sender learns acknowledgements from
/// the return board, and the reader sends them only when asked to (ReturnBoard::request_acknowledgements()) or when it
/// could not record a frame on the board.
///
/// With `shares_connection`, the socket also carries the opposite direction (a duplex
/// connection: this process's reader holds the same socket), so closing the end does not
/// close the connection. On any socket, a close that could not send the end-of-stream
/// frame, or an end dropped by an exception, ends this direction with shutdown(SHUT_WR)
/// (shut_down()).
///
/// Process-wide signal dispositions are left alone: a socket is written with MSG_NOSIGNAL,
/// a pipe with SIGPIPE blocked in the writing thread, and the SIGPIPE that a write to a pipe
/// without readers raises is consumed at once (the write reports EPIPE: ChannelClosed).
///
/// The stream grows to hold a whole frame: before writing a frame larger than what the
/// stream holds, the writer asks for room for the frame, at most kMaxStreamBufferBytes. A
/// pipe's capacity becomes the frame's size rounded up to a power of two (F_SETPIPE_SZ; the
/// kernel caps it at /proc/sys/fs/pipe-max-size for unprivileged users and refuses it when
/// the user's pipe pages are spent); a socket's send buffer, which holds what the reader has
/// not read yet, becomes the frame's size (SO_SNDBUF; the kernel doubles it and caps it at
/// net.core.wmem_max). A stream that carries only small frames keeps the kernel's default
/// size; a refusal is kept (never asked again) and frames go out in pieces as before.
///
/// Timed writes never leave half a frame: a frame that was started when the deadline
/// passed is accepted, and its unwritten tail is kept here and written before the next
/// frame (or by close()). A timed write returns false only when no byte of it went out.
class StreamFrameWriter final : public detail::FrameWriter {
 public:
  StreamFrameWriter(detail::UniqueFd stream, detail::UniqueFd side, bool is_socket, bool shares_connection = false);
  bool write(std::span<const iovec> parts, std::span<const int> fds, const detail::Deadline& deadline) override;
  /// What wait_acknowledged() read from the pipe so far (no system call).
  std::uint64_t acknowledged() override { return acknowledged_; }
  bool wait_acknowledged(std::uint64_t sequence, const detail::Deadline& deadline) override;
  /// Writes any pending frame tail, waiting until `deadline`; false if some is left.
  bool flush(const detail::Deadline& deadline) override { return flush_pending(deadline); }
  void close() noexcept override;
  void shut_down() noexcept override;
  std::vector<int> descriptors() const override;
  /// A socket: a duplicate of the stream, which reports POLLHUP once the reader is gone
  /// (after shut_down(), once the reader closed its socket too). A pipe: a duplicate of the
  /// side socket, which reports POLLHUP once every process holding the reader has dropped
  /// it (a duplicate of the data pipe's write end would keep the stream open, and a reader
  /// waiting for more would never see the sender gone).
  detail::UniqueFd liveness_probe() const override;

 private:
  // Writes one whole frame on the stream (a socket: `fds` with its first byte); with
  // `must_start`, waits for its first byte to go out whatever the deadline.
  bool write_frame(std::span<const iovec> parts, std::span<const int> fds, const detail::Deadline& deadline,
                   bool must_start);
  // One write or sendmsg; returns bytes written, or -1 with errno (EAGAIN when full).
  ssize_t write_some(const iovec* parts, std::size_t count, std::span<const int> fds, bool wait);
  // Writes the tail of an earlier frame; false when the deadline passed first.
  bool flush_pending(const detail::Deadline& deadline);
  // Reads the acknowledgement records on the side socket (non-blocking) into acknowledged_.
  void read_acknowledgements();
  // Raises the stream's capacity towards `frame_bytes` (see the class comment); never throws.
  void grow_for(std::size_t frame_bytes) noexcept;
  // A pipe's capacity, or what a socket's send buffer holds; 0 when it cannot be read.
  std::size_t read_capacity() const noexcept;
  // Asks for a capacity of `bytes`; what the stream holds then, or 0 when refused.
  std::size_t request_capacity(std::size_t bytes) const noexcept;

  detail::UniqueFd stream_;
  detail::UniqueFd side_;  // a pipe's side socket (segment fds out, acknowledgements in)
  bool is_socket_;
  bool shut_down_ = false;          // this process ended the direction (shutdown(SHUT_WR))
  std::vector<std::byte> pending_;  // unwritten tail of the last frame
  std::uint64_t acknowledged_ = 0;
  bool reader_gone_ = false;
  std::size_t capacity_ = 0;  // what the stream holds, as last read (0: not read yet)
  bool growth_refused_ = false;
};

/// The most a writer asks its stream to hold (StreamFrameWriter grows it for large frames).
inline constexpr std::size_t kMaxStreamBufferBytes = std::size_t{1} << 20;

/// The largest frame (header included) that StreamFrameReader reads whole into its buffer
/// and hands out in place (read_view()); larger ones are read into a payload of their own.
inline constexpr std::size_t kMaxStagedFrameBytes = 2 * kMaxStreamBufferBytes;

/// An untimed read of a new frame reads at most this much at first (see StreamFrameReader).
inline constexpr std::size_t kFirstReadBytes = std::size_t{16} << 10;

/// The fewest bytes of a message frame without fds, tables or releases still in the stream
/// when its header and type name are in, for an untimed read to hand it out before its
/// body arrived (see StreamFrameReader).
inline constexpr std::size_t kPendingBodyFrom = std::size_t{16} << 10;

/// Reads frames from a pipe or a stream socket, buffering so that a small frame costs one
/// read system call. A frame of up to kMaxStagedFrameBytes is read whole into the buffer,
/// which grows to hold it (and stays grown), and read_view() hands its payload out in place
/// until release(): the body is copied once, by the kernel, before the decoder reads it. A
/// larger frame is read into a payload of its own (what the buffer held of it copied
/// there first).
///
/// An untimed read (no deadline, no wait-interruption check) of a frame that starts with
/// an empty buffer reads at most kFirstReadBytes, and a message frame without fds, tables
/// or releases (a byte message) of which at least kPendingBodyFrom bytes are still in the
/// stream then is handed out as soon as its type name is in: the rest of its body stays in
/// the stream, and the decoder reads it through pending_body() as it gets there, the
/// elements of a large vector or string straight into their storage (one copy, by the
/// kernel, as a raw read). Those reads stop at the frame's end; release() leaves whatever
/// the decoder did not read to be skipped by the next read. A timed read never does this:
/// the rest of a frame may come late (a timed write that stopped mid-frame sends its tail
/// with the sender's next frame), and the decoder would wait for it past the deadline.
///
/// With a pipe, `side` is this end of the socket pair next to it: the
/// fds a frame declares are received there once the frame is read (SegmentFdChannel), and
/// acknowledgements go back on it. Enforces FrameLimits on every header before reading the rest. A
/// timed read that ends in the middle of a frame keeps what it read and resumes there.
/// With `shares_connection` (a duplex socket), shut_down() refuses the writer's later
/// frames with shutdown(SHUT_RD).
class StreamFrameReader final : public detail::FrameReader, private detail::PendingBody {
 public:
  StreamFrameReader(detail::UniqueFd stream, detail::UniqueFd side, bool is_socket, const FrameLimits& limits,
                    bool shares_connection = false);
  /// read_view(), with the payload copied into `payload` (or swapped in) and released.
  ReadStatus read(detail::FrameHeader& header, std::vector<std::byte>& payload, std::deque<detail::UniqueFd>& fds,
                  const detail::Deadline& deadline) override;
  ReadStatus read_view(detail::FrameHeader& header, std::span<const std::byte>& payload, std::vector<std::byte>& buffer,
                       std::deque<detail::UniqueFd>& fds, const detail::Deadline& deadline) override;
  /// The rest of the body of the frame last viewed, while it is still in the stream.
  detail::PendingBody* pending_body() noexcept override { return pending_ ? this : nullptr; }
  /// Lets the buffer reuse the bytes of the frame last viewed (also done by the next read).
  void release() noexcept override;
  void acknowledge(std::uint64_t sequence) override;
  void close() noexcept override;
  void shut_down() noexcept override;
  std::vector<int> descriptors() const override;
  bool has_buffered_frame() const override;

 private:
  // Reads what is available (at least one byte, blocking) into `into`; returns 0 at EOF.
  std::size_t receive(std::byte* into, std::size_t capacity, std::deque<detail::UniqueFd>& fds);
  // PendingBody, over the body of the frame handed out before it arrived (pending_): body
  // offsets count from body_begin_, and every read stops at frame_end_.
  std::size_t ready() const noexcept override { return end_ - body_begin_; }
  std::size_t fill(std::size_t end) override;
  void read_out(std::byte* into, std::size_t size) override;
  // One untimed receive() of at most `capacity` bytes of the pending frame into `into`;
  // PeerDied at the end of the stream, ProtocolError for fds (the frame declares none).
  std::size_t receive_pending(std::byte* into, std::size_t capacity);
  // Hands out the frame whose header was just read (begin_), `frame_bytes` long, before its
  // body arrived: once its type name is in.
  ReadStatus hand_out_pending(detail::FrameHeader& header, std::span<const std::byte>& payload,
                              std::deque<detail::UniqueFd>& fds, std::size_t frame_bytes);
  // Reads and drops the rest of a frame released before its body was read (skip_); false
  // when `deadline` passed first.
  bool skip_rest(bool timed, const detail::Deadline& deadline, std::deque<detail::UniqueFd>& fds);
  std::size_t buffered() const noexcept { return end_ - begin_; }
  // Waits for bytes to read: a timed read until `deadline` (false when it passed first); an
  // untimed one on a pipe only when the last read emptied it (a socket's blocking read
  // waits in recvmsg).
  bool await_bytes(bool timed, const detail::Deadline& deadline);
  // One receive() of at most `most` bytes into the buffer's free tail (there is room);
  // PeerDied at the end of the stream. `declared_fds` bounds the fds queued meanwhile
  // (bound_queued_fds).
  void fill(std::uint64_t declared_fds, std::deque<detail::UniqueFd>& fds, std::size_t most = SIZE_MAX);
  // Moves the buffered bytes to the front of the buffer.
  void compact() noexcept;
  // Makes room for a frame of `frame_bytes` starting at begin_: compacts, grows the buffer.
  void make_room(std::size_t frame_bytes);
  // The steps after a whole frame was read: its fds, the checks, the end-of-stream frame.
  ReadStatus finish_frame(detail::FrameHeader& header, std::deque<detail::UniqueFd>& fds);
  // Throws ProtocolError when more fds are queued than `declared` (the frame being read, or
  // the most any frame may declare before its header came) and one batch of fds.
  void bound_queued_fds(std::uint64_t declared, const std::deque<detail::UniqueFd>& fds) const;
  // Throws ProtocolError when more fds are queued than the frame just read and the frames
  // already buffered can account for.
  void check_queued_fds(const detail::FrameHeader& header, const std::deque<detail::UniqueFd>& fds) const;

  detail::UniqueFd stream_;
  detail::UniqueFd side_;  // a pipe's side socket (segment fds in, acknowledgements out)
  bool is_socket_;
  bool shares_connection_;
  FrameLimits limits_;
  bool peer_closed_ = false;
  bool in_frame_ = false;  // header read, payload incomplete
  detail::FrameHeader frame_header_{};
  std::vector<std::byte> frame_payload_;
  std::size_t frame_filled_ = 0;
  std::vector<std::byte> buffer_;
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
  bool viewed_ = false;         // a frame's payload lies in buffer_ before begin_ until release()
  bool pipe_emptied_ = true;    // a pipe: the last read took all it held
  bool pending_ = false;        // the frame viewed was handed out before its body arrived
  std::size_t body_begin_ = 0;  // pending_: where its body starts in buffer_
  std::size_t frame_end_ = 0;   // pending_: where it ends in buffer_ (end_ <= frame_end_)
  std::size_t skip_ = 0;        // bytes of a frame released unread, still in the stream
};

}  // namespace ferry
