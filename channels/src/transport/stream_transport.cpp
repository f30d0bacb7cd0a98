#include "transport/stream_transport.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <optional>

#include "fd_passing/segment_fd_channel.hpp"
#include "ferry/detail/end_stats.hpp"
#include "ferry/detail/live_ends.hpp"
#include "ferry/detail/sigpipe_blocked.hpp"
#include "ferry/error.hpp"
#include "ferry/wait_interruption.hpp"
#include "transport/peer_gone.hpp"
#include "transport/scm_rights.hpp"

namespace ferry {
namespace {

constexpr std::size_t kReadBufferBytes = std::size_t{64} * 1024;
constexpr std::size_t kMaxFdsPerRead = 253;  // SCM_MAX_FD

// Whether a write or read may block in the system call itself: only when it waits for
// ever and no wait-interruption check is installed (a blocked sendmsg or read would not
// call it); otherwise it waits in ppoll, which does.
bool may_block(const detail::Deadline& deadline) { return deadline.is_never() && !detail::wait_interruptible(); }

}  // namespace

// ---- writer ------------------------------------------------------------------

namespace {

// A socket passes fds with its frames; a pipe only on its side socket, when it has one. A
// shared socket's probe tells by a zero-length send that its reader shut down (every send
// fails after this end's own shut_down(), so the probe is then polled only).
detail::TransportCapabilities stream_writer_capabilities(bool is_socket, bool has_side, bool shares_connection) {
  detail::TransportCapabilities capabilities;
  capabilities.passes_fds = is_socket;
  capabilities.can_pass_fds = is_socket || has_side;
  capabilities.shares_connection = shares_connection && is_socket;
  capabilities.probe_by_send = capabilities.shares_connection;
  return capabilities;
}

// The stream itself tells that data (or the hang-up) arrived.
detail::TransportCapabilities stream_reader_capabilities(int stream, bool is_socket, bool shares_connection) {
  detail::TransportCapabilities capabilities;
  capabilities.shares_connection = shares_connection && is_socket;
  capabilities.readiness_fd = stream;
  return capabilities;
}

}  // namespace

StreamFrameWriter::StreamFrameWriter(detail::UniqueFd stream, detail::UniqueFd side, bool is_socket,
                                     bool shares_connection)
    : FrameWriter(stream_writer_capabilities(is_socket, side.valid(), shares_connection)),
      stream_(std::move(stream)),
      side_(std::move(side)),
      is_socket_(is_socket) {}

ssize_t StreamFrameWriter::write_some(const iovec* parts, std::size_t count, std::span<const int> fds, bool wait) {
  while (true) {
    ssize_t written = 0;
    if (is_socket_) {
      alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * kMaxFdsPerRead)> control{};
      msghdr message{};
      message.msg_iov = const_cast<iovec*>(parts);
      message.msg_iovlen = count;
      detail::attach_fds(message, control, fds);
      // Never blocking in the kernel: a blocking write waits for room in wait_for_fd(),
      // which lets go of copies of ends owned elsewhere while it waits (live_ends.hpp).
      written = ::sendmsg(stream_.get(), &message, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (written < 0 && errno == EAGAIN && wait) {
        detail::wait_for_fd(stream_.get(), POLLOUT, detail::Deadline::never(), waits_charged_to());
        continue;
      }
    } else {
      // The pipe's write end is non-blocking; a blocking write waits for room below.
      detail::SigpipeBlocked blocked;
      written = ::writev(stream_.get(), parts, static_cast<int>(count));
      if (written < 0 && errno == EPIPE) blocked.consume();
      if (written < 0 && errno == EAGAIN && wait) {
        detail::wait_for_fd(stream_.get(), POLLOUT, detail::Deadline::never(), waits_charged_to());
        continue;
      }
    }
    if (written >= 0) return written;
    if (errno == EINTR) continue;
    if (errno == EPIPE || errno == ECONNRESET) detail::throw_receiver_gone();
    if (errno == EAGAIN) return -1;
    throw_errno(is_socket_ ? "sendmsg on a ferry socket" : "writev on a ferry pipe");
  }
}

bool StreamFrameWriter::flush_pending(const detail::Deadline& deadline) {
  // What went out leaves pending_ at once: an interrupted wait (its exception) keeps the
  // rest, and only the rest, for the next flush.
  while (!pending_.empty()) {
    const iovec part{pending_.data(), pending_.size()};
    const ssize_t written = write_some(&part, 1, {}, may_block(deadline));
    if (written < 0) {
      if (!detail::wait_for_fd(stream_.get(), POLLOUT, deadline, waits_charged_to())) break;
      continue;
    }
    pending_.erase(pending_.begin(), pending_.begin() + written);
  }
  return pending_.empty();
}

bool StreamFrameWriter::write(std::span<const iovec> parts, std::span<const int> fds,
                              const detail::Deadline& deadline) {
  if (!stream_) throw ChannelClosed("cannot send: this end of the channel is closed");
  if (!pending_.empty() && !flush_pending(deadline)) return false;
  if (is_socket_ || fds.empty()) return write_frame(parts, fds, deadline, false);
  if (!side_) throw Error("this pipe end has no side socket to pass fds on");
  // A pipe: the fds go out on the side socket before the frame (so the reader finds them
  // there once it has the frame), and only when the frame's first byte is sure to follow:
  // the pipe has room, and nothing else writes to it. Once the fds begin to go out, the
  // frame must follow: no interruption check runs any more.
  if (!detail::wait_for_fd(stream_.get(), POLLOUT, deadline, waits_charged_to())) return false;
  const detail::WaitInterruptionSuspended committed;
  if (!detail::SegmentFdChannel(side_.get()).send(fds, deadline)) return false;
  return write_frame(parts, {}, deadline, true);
}

std::size_t StreamFrameWriter::read_capacity() const noexcept {
  if (!is_socket_) {
    const int capacity = ::fcntl(stream_.get(), F_GETPIPE_SZ);
    return capacity > 0 ? static_cast<std::size_t>(capacity) : 0;
  }
  int doubled = 0;  // the kernel keeps twice what was asked for, half of it for bookkeeping
  socklen_t size = sizeof doubled;
  if (::getsockopt(stream_.get(), SOL_SOCKET, SO_SNDBUF, &doubled, &size) != 0 || doubled <= 0) return 0;
  return static_cast<std::size_t>(doubled) / 2;
}

std::size_t StreamFrameWriter::request_capacity(std::size_t bytes) const noexcept {
  const int wanted = static_cast<int>(bytes);
  if (!is_socket_) {
    const int capacity = ::fcntl(stream_.get(), F_SETPIPE_SZ, wanted);
    return capacity > 0 ? static_cast<std::size_t>(capacity) : 0;
  }
  if (::setsockopt(stream_.get(), SOL_SOCKET, SO_SNDBUF, &wanted, sizeof wanted) != 0) return 0;
  return read_capacity();
}

void StreamFrameWriter::grow_for(std::size_t frame_bytes) noexcept {
  if (growth_refused_) return;
  if (capacity_ == 0 && (capacity_ = read_capacity()) == 0) {
    growth_refused_ = true;
    return;
  }
  if (frame_bytes <= capacity_ || capacity_ >= kMaxStreamBufferBytes) return;
  const std::size_t wanted = std::min(std::bit_ceil(frame_bytes), kMaxStreamBufferBytes);
  // A pipe may refuse a size (EPERM: above pipe-max-size, or the user's pipe pages are
  // spent): smaller ones are tried once. A socket takes any size, capped by the kernel.
  for (std::size_t size = wanted; size > capacity_; size /= 2) {
    const std::size_t granted = request_capacity(size);
    if (granted > capacity_) {
      growth_refused_ = granted < size;  // capped below what was asked: no more to gain
      capacity_ = granted;
      return;
    }
    if (is_socket_) break;
  }
  growth_refused_ = true;
}

bool StreamFrameWriter::write_frame(std::span<const iovec> parts, std::span<const int> fds,
                                    const detail::Deadline& deadline, bool must_start) {
  std::array<iovec, 16> remaining{};
  if (parts.size() > remaining.size()) throw Error("a frame has too many parts");
  std::size_t frame_bytes = 0;
  for (const iovec& part : parts) frame_bytes += part.iov_len;
  grow_for(frame_bytes);
  std::copy(parts.begin(), parts.end(), remaining.begin());
  iovec* next = remaining.data();
  std::size_t count = parts.size();
  auto advance = [&](std::size_t written) {
    while (count > 0 && written >= next->iov_len) {
      written -= next->iov_len;
      ++next;
      --count;
    }
    if (count > 0) {
      next->iov_base = static_cast<char*>(next->iov_base) + written;
      next->iov_len -= written;
    }
  };
  bool started = false;
  // Once a byte of the frame went out, the rest follows: no interruption check runs then.
  std::optional<detail::WaitInterruptionSuspended> committed;
  const bool wait = may_block(deadline);
  // One sendmsg carries at most kMaxFdsPerRead fds: a frame with more sends each earlier
  // batch with one byte of the frame (it has bytes enough: a header, and a segment entry
  // per fd), and the last batch with the rest.
  while (fds.size() > kMaxFdsPerRead) {
    if (count == 0) throw Error("a frame has fewer bytes than batches of fds to carry");
    const iovec one{next->iov_base, 1};
    const ssize_t written = write_some(&one, 1, fds.first(kMaxFdsPerRead), wait);
    if (written < 0) {
      // Once a batch went out, the frame must go out whole: fds cannot wait in pending_.
      if (detail::wait_for_fd(stream_.get(), POLLOUT, started ? detail::Deadline::never() : deadline,
                              waits_charged_to()))
        continue;
      return false;
    }
    if (!started) committed.emplace();
    started = true;
    fds = fds.subspan(kMaxFdsPerRead);
    advance(1);
  }
  while (count > 0) {
    const ssize_t written = write_some(next, count, fds, wait);
    if (written < 0) {  // full, and a deadline applies
      // A frame whose fds went out ahead of it must start, and one whose first batch of
      // fds went out must send the last one, whatever the deadline.
      const bool must_wait = started ? !fds.empty() : must_start;
      if (detail::wait_for_fd(stream_.get(), POLLOUT, must_wait ? detail::Deadline::never() : deadline,
                              waits_charged_to()))
        continue;
      if (!started) return false;
      // Deadline passed mid-frame: keep the tail, so the stream never holds half a frame.
      for (std::size_t i = 0; i < count; ++i) {
        const auto* bytes = static_cast<const std::byte*>(next[i].iov_base);
        pending_.insert(pending_.end(), bytes, bytes + next[i].iov_len);
      }
      return true;
    }
    if (!started) committed.emplace();
    started = true;
    fds = {};
    advance(static_cast<std::size_t>(written));
  }
  return true;
}

void StreamFrameWriter::read_acknowledgements() {
  std::array<std::uint64_t, 512> records{};
  while (true) {
    const ssize_t got = ::recv(side_.get(), records.data(), sizeof records, MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      throw_errno("read of acknowledgements");
    }
    if (got == 0) {  // reader gone: the next write reports it
      reader_gone_ = true;
      break;
    }
    // Records are sent whole, 8 bytes each, and read 512 at a time, so none is split.
    for (std::size_t i = 0; i < static_cast<std::size_t>(got) / sizeof(std::uint64_t); ++i) {
      acknowledged_ = std::max(acknowledged_, records[i]);
    }
    // A short read emptied the pipe: what comes later is read after the next poll.
    if (static_cast<std::size_t>(got) < sizeof records) break;
  }
}

bool StreamFrameWriter::wait_acknowledged(std::uint64_t sequence, const detail::Deadline& deadline) {
  if (!side_) return true;
  while (true) {
    read_acknowledgements();
    if (acknowledged_ >= sequence) return true;
    if (reader_gone_ || !detail::wait_for_fd(side_.get(), POLLIN, deadline, waits_charged_to())) return false;
  }
}

void StreamFrameWriter::close() noexcept {
  stream_.reset();
  side_.reset();
}

detail::UniqueFd StreamFrameWriter::liveness_probe() const {
  if (!stream_) return detail::UniqueFd();
  if (is_socket_) return stream_.duplicate();
  return side_ ? side_.duplicate() : detail::UniqueFd();
}

void StreamFrameWriter::shut_down() noexcept {
  // Every socket: the ledger's probe (a duplicate) or a forked copy must not keep the
  // direction open. ENOTCONN: the peer's socket is gone already, and with it this direction.
  if (!is_socket_ || !stream_) return;
  (void)::shutdown(stream_.get(), SHUT_WR);
  shut_down_ = true;
}

std::vector<int> StreamFrameWriter::descriptors() const {
  std::vector<int> out{stream_.get()};
  if (side_) out.push_back(side_.get());
  return out;
}

// ---- reader ------------------------------------------------------------------

StreamFrameReader::StreamFrameReader(detail::UniqueFd stream, detail::UniqueFd side, bool is_socket,
                                     const FrameLimits& limits, bool shares_connection)
    : FrameReader(stream_reader_capabilities(stream.get(), is_socket, shares_connection)),
      stream_(std::move(stream)),
      side_(std::move(side)),
      is_socket_(is_socket),
      shares_connection_(shares_connection && is_socket),
      limits_(limits),
      buffer_(kReadBufferBytes) {
  // An untimed read must not sleep in the kernel for ever: it wakes every kReleaseCheck to
  // let go of copies of ends owned elsewhere (live_ends.hpp). A socket's blocking recvmsg
  // times out (SO_RCVTIMEO: no extra system call while data flows); the pipe's read end is
  // non-blocking, and an empty pipe is waited for in wait_for_fd().
  if (!stream_) return;
  if (is_socket_) {
    const auto slice = std::chrono::duration_cast<std::chrono::microseconds>(detail::kReleaseCheck);
    const timeval timeout{static_cast<time_t>(slice.count() / 1'000'000),
                          static_cast<suseconds_t>(slice.count() % 1'000'000)};
    if (::setsockopt(stream_.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout) != 0) {
      throw_errno("setsockopt(SO_RCVTIMEO) on a ferry socket");
    }
  } else {
    const int flags = ::fcntl(stream_.get(), F_GETFL);
    if (flags < 0 || ::fcntl(stream_.get(), F_SETFL, flags | O_NONBLOCK) != 0) {
      throw_errno("fcntl(O_NONBLOCK) on a ferry pipe");
    }
  }
}

std::size_t StreamFrameReader::receive(std::byte* into, std::size_t capacity, std::deque<detail::UniqueFd>& fds) {
  // A socket's blocking recvmsg is where an untimed receive sleeps: charged as blocked
  // while introspection is on (its copy of the bytes too; off, the flag is read only). A
  // pipe sleeps in wait_for_fd(), which charges itself.
  detail::BlockedSpan blocked(is_socket_ ? waits_charged_to() : nullptr);
  while (true) {
    ssize_t got = 0;
    if (is_socket_) {
      iovec vector{into, capacity};
      alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * kMaxFdsPerRead)> control{};
      msghdr message{};
      message.msg_iov = &vector;
      message.msg_iovlen = 1;
      message.msg_control = control.data();
      message.msg_controllen = control.size();
      blocked.begin_now();  // from the first call to the return, the timeouts' slices included
      got = ::recvmsg(stream_.get(), &message, MSG_CMSG_CLOEXEC);
      if (got >= 0) {
        detail::take_fds(message, fds);
        if (message.msg_flags & MSG_CTRUNC) {
          throw ProtocolError(
              "file descriptors sent with a frame were dropped by the kernel (MSG_CTRUNC): this process has "
              "reached its open-file limit (RLIMIT_NOFILE); raise it with `ulimit -n` or hold fewer tensors");
        }
      }
    } else {
      got = ::read(stream_.get(), into, capacity);
      // A read that took less than it asked for emptied the pipe (see await_bytes()).
      if (got >= 0) pipe_emptied_ = static_cast<std::size_t>(got) < capacity;
    }
    if (got >= 0) return static_cast<std::size_t>(got);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {  // see the constructor
      if (is_socket_) {
        detail::release_ends_owned_elsewhere();
      } else {
        detail::wait_for_fd(stream_.get(), POLLIN, detail::Deadline::never(), waits_charged_to());
      }
      continue;
    }
    if (errno == ECONNRESET) return 0;
    throw_errno(is_socket_ ? "recvmsg on a ferry socket" : "read on a ferry pipe");
  }
}

bool StreamFrameReader::await_bytes(bool timed, const detail::Deadline& deadline) {
  if (timed) return detail::wait_for_fd(stream_.get(), POLLIN, deadline, waits_charged_to());
  // An untimed read of a pipe that the last read emptied waits first: reading it now would
  // only report EAGAIN (a system call for nothing on every frame of a ping-pong).
  if (!is_socket_ && pipe_emptied_)
    detail::wait_for_fd(stream_.get(), POLLIN, detail::Deadline::never(), waits_charged_to());
  return true;
}

void StreamFrameReader::fill(std::uint64_t declared_fds, std::deque<detail::UniqueFd>& fds, std::size_t most) {
  const std::size_t got = receive(buffer_.data() + end_, std::min(most, buffer_.size() - end_), fds);
  bound_queued_fds(declared_fds, fds);
  if (got == 0) throw PeerDied(buffered() == 0 ? detail::kSenderGone : detail::kSenderGoneMidFrame);
  end_ += got;
}

void StreamFrameReader::compact() noexcept {
  if (begin_ == 0) return;
  if (buffered() > 0) std::memmove(buffer_.data(), buffer_.data() + begin_, buffered());
  end_ -= begin_;
  begin_ = 0;
}

void StreamFrameReader::make_room(std::size_t frame_bytes) {
  if (begin_ + frame_bytes <= buffer_.size()) return;
  compact();
  if (frame_bytes <= buffer_.size()) return;
  // Grown at most once per size class: a stream of large frames keeps its buffer.
  buffer_.resize(std::max(frame_bytes, std::min(2 * buffer_.size(), kMaxStagedFrameBytes)));
}

ReadStatus StreamFrameReader::read(detail::FrameHeader& header, std::vector<std::byte>& payload,
                                   std::deque<detail::UniqueFd>& fds, const detail::Deadline& deadline) {
  std::span<const std::byte> view;
  const ReadStatus status = read_view(header, view, payload, fds, deadline);
  if (pending_) fill(frame_end_ - body_begin_);  // the whole body, to copy it out
  // A frame, or the end-of-stream frame (whose payload lists the leases it releases).
  const bool read_one = status == ReadStatus::Frame || (status == ReadStatus::Closed && view.data() != nullptr);
  if (read_one && view.data() != payload.data()) payload.assign(view.begin(), view.end());
  release();
  return status;
}

ReadStatus StreamFrameReader::read_view(detail::FrameHeader& header, std::span<const std::byte>& payload,
                                        std::vector<std::byte>& buffer, std::deque<detail::UniqueFd>& fds,
                                        const detail::Deadline& deadline) {
  release();  // the caller is done with the last frame's payload
  if (!stream_ || peer_closed_) return ReadStatus::Closed;
  // Timed (or interruptible): wait in ppoll, then read what is there. A timed read stopped
  // in the middle of a frame resumes there: a frame read in place keeps its bytes in the
  // buffer (its header is read again), a large one keeps them in frame_payload_.
  const bool timed = !may_block(deadline);
  if (skip_ > 0 && !skip_rest(timed, deadline, fds)) return ReadStatus::Timeout;
  if (!in_frame_) {
    while (buffered() < sizeof(detail::FrameHeader)) {
      if (!await_bytes(timed, deadline)) return ReadStatus::Timeout;
      compact();  // keep the partial header at the front: the next read takes as much as fits
      // Before a header, what any frame may declare; untimed, at most kFirstReadBytes, so
      // that a large body can stay in the stream (hand_out_pending()).
      fill(limits_.max_fds, fds, timed ? SIZE_MAX : kFirstReadBytes);
    }
    std::memcpy(&frame_header_, buffer_.data() + begin_, sizeof frame_header_);
    validate_header(frame_header_, limits_);
    const std::uint64_t total = payload_bytes(frame_header_);
    if (total <= kMaxStagedFrameBytes - sizeof(detail::FrameHeader)) {
      // Read whole into the buffer and viewed there until release(): no copy.
      const std::size_t frame_bytes = sizeof(detail::FrameHeader) + static_cast<std::size_t>(total);
      make_room(frame_bytes);
      const bool body_only = (frame_header_.fd_count | frame_header_.segment_count | frame_header_.handle_count |
                              frame_header_.release_count | frame_header_.segment_release_count) == 0;
      if (!timed && body_only && frame_header_.kind == static_cast<std::uint8_t>(detail::FrameKind::Message) &&
          buffered() < frame_bytes && frame_bytes - buffered() >= kPendingBodyFrom) {
        return hand_out_pending(header, payload, fds, frame_bytes);
      }
      while (buffered() < frame_bytes) {
        if (!await_bytes(timed, deadline)) return ReadStatus::Timeout;
        fill(frame_header_.fd_count, fds);
      }
      payload = std::span<const std::byte>(buffer_.data() + begin_ + sizeof(detail::FrameHeader), total);
      begin_ += frame_bytes;
      viewed_ = true;
      return finish_frame(header, fds);
    }
    // Larger than the buffer may grow: read into a payload of its own, starting with what
    // the buffer already holds.
    begin_ += sizeof frame_header_;
    frame_payload_.resize(total);
    frame_filled_ = std::min<std::uint64_t>(total, buffered());
    if (frame_filled_ > 0) std::memcpy(frame_payload_.data(), buffer_.data() + begin_, frame_filled_);
    begin_ += frame_filled_;
    if (begin_ == end_) begin_ = end_ = 0;
    in_frame_ = true;
  }
  while (frame_filled_ < frame_payload_.size()) {
    if (!await_bytes(timed, deadline)) return ReadStatus::Timeout;
    const std::size_t got = receive(frame_payload_.data() + frame_filled_, frame_payload_.size() - frame_filled_, fds);
    bound_queued_fds(frame_header_.fd_count, fds);
    if (got == 0) throw PeerDied(detail::kSenderGoneMidFrame);
    frame_filled_ += got;
  }
  in_frame_ = false;
  buffer.swap(frame_payload_);
  payload = buffer;
  return finish_frame(header, fds);
}

ReadStatus StreamFrameReader::finish_frame(detail::FrameHeader& header, std::deque<detail::UniqueFd>& fds) {
  header = frame_header_;
  // A pipe: the frame's fds wait on the side socket (the writer sent them first); take as
  // many as it declares, no more: the decoder refuses a frame whose fds did not all come.
  if (!is_socket_ && header.fd_count > 0 && side_) detail::SegmentFdChannel(side_.get()).receive(header.fd_count, fds);
  check_queued_fds(header, fds);
  if (header.kind == static_cast<std::uint8_t>(detail::FrameKind::Close)) {
    peer_closed_ = true;
    return ReadStatus::Closed;
  }
  return ReadStatus::Frame;
}

ReadStatus StreamFrameReader::hand_out_pending(detail::FrameHeader& header, std::span<const std::byte>& payload,
                                               std::deque<detail::UniqueFd>& fds, std::size_t frame_bytes) {
  const std::size_t body_at = sizeof(detail::FrameHeader) + frame_header_.type_name_bytes;
  body_begin_ = begin_ + body_at;
  frame_end_ = begin_ + frame_bytes;
  pending_ = true;
  viewed_ = true;
  while (end_ < body_begin_) end_ += receive_pending(buffer_.data() + end_, frame_end_ - end_);
  payload = std::span<const std::byte>(buffer_.data() + begin_ + sizeof(detail::FrameHeader),
                                       frame_bytes - sizeof(detail::FrameHeader));
  return finish_frame(header, fds);
}

std::size_t StreamFrameReader::receive_pending(std::byte* into, std::size_t capacity) {
  (void)await_bytes(false, detail::Deadline::never());
  std::deque<detail::UniqueFd> stray;
  const std::size_t got = receive(into, capacity, stray);
  if (!stray.empty()) {
    throw ProtocolError("the peer sent " + std::to_string(stray.size()) +
                        " fds in the middle of a frame that declares none; refusing fds that no frame accounts for");
  }
  if (got == 0) throw PeerDied(detail::kSenderGoneMidFrame);
  return got;
}

std::size_t StreamFrameReader::fill(std::size_t end) {
  while (end_ - body_begin_ < end && end_ < frame_end_) {
    end_ += receive_pending(buffer_.data() + end_, frame_end_ - end_);
  }
  return end_ - body_begin_;
}

void StreamFrameReader::read_out(std::byte* into, std::size_t size) {
  size = std::min(size, frame_end_ - end_);
  while (size > 0) {
    const std::size_t got = receive_pending(into, size);
    into += got;
    size -= got;
    end_ += got;  // the bytes' place in the buffer stays unwritten: the decoder is past it
  }
}

bool StreamFrameReader::skip_rest(bool timed, const detail::Deadline& deadline, std::deque<detail::UniqueFd>& fds) {
  while (skip_ > 0) {
    if (!await_bytes(timed, deadline)) return false;
    const std::size_t got = receive(buffer_.data(), std::min(skip_, buffer_.size()), fds);
    bound_queued_fds(0, fds);
    if (got == 0) throw PeerDied(detail::kSenderGoneMidFrame);
    skip_ -= got;
  }
  return true;
}

void StreamFrameReader::release() noexcept {
  if (!viewed_) return;
  viewed_ = false;
  if (pending_) {
    // Reads of the pending frame stopped at its end: the buffer holds nothing after it,
    // and whether the pipe does is unknown. Waiting first costs a ppoll when it does; not
    // waiting costs a read that meets EAGAIN when it does not (a ping-pong's next frame).
    pending_ = false;
    pipe_emptied_ = true;
    skip_ = frame_end_ - end_;  // what the decoder did not read (it gave up on the body)
    begin_ = end_ = 0;
    return;
  }
  if (begin_ == end_) begin_ = end_ = 0;
}

bool StreamFrameReader::has_buffered_frame() const {
  if (!stream_ || peer_closed_) return true;  // read() returns Closed at once
  if (in_frame_) return frame_filled_ == frame_payload_.size();
  if (buffered() < sizeof(detail::FrameHeader)) return false;
  detail::FrameHeader header;
  std::memcpy(&header, buffer_.data() + begin_, sizeof header);
  if (header.magic != detail::kFrameMagic) return true;  // read() reports the bad frame at once
  return buffered() - sizeof header >= detail::payload_bytes(header);
}

void StreamFrameReader::bound_queued_fds(std::uint64_t declared, const std::deque<detail::UniqueFd>& fds) const {
  // A frame's fds come in batches of at most kMaxFdsPerRead, each with a byte of the frame,
  // and a recvmsg takes at most one batch: while a frame is read, the queue holds its fds
  // and at most one batch more. Checked after every recvmsg, so that a peer that sends
  // batches with every byte of a long frame is refused before it fills this process's fds.
  if (is_socket_ && fds.size() > declared + kMaxFdsPerRead) {
    throw ProtocolError("the peer sent " + std::to_string(fds.size()) + " fds while the frame being read declares " +
                        std::to_string(declared) + "; refusing fds that no frame accounts for");
  }
}

void StreamFrameReader::check_queued_fds(const detail::FrameHeader& header,
                                         const std::deque<detail::UniqueFd>& fds) const {
  // The kernel delivers a frame's fds with the first byte of the sendmsg that carried them,
  // and a recvmsg stops after the first message with fds. So once a frame is complete, the
  // queue holds its own fds plus, when bytes of later frames are buffered, at most one more
  // batch (kMaxFdsPerRead). More means the peer sends fds no frame declares: refuse them instead of
  // queueing them without bound (they would exhaust this process's fds).
  if (!is_socket_) return;
  const std::size_t allowed = header.fd_count + (buffered() > 0 ? kMaxFdsPerRead : 0);
  if (fds.size() > allowed) {
    throw ProtocolError("the peer sent " + std::to_string(fds.size()) + " fds but the frame declares " +
                        std::to_string(header.fd_count) + " (fd_count); refusing fds that no frame accounts for");
  }
}

void StreamFrameReader::acknowledge(std::uint64_t sequence) {
  if (!side_) return;
  while (::send(side_.get(), &sequence, sizeof sequence, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
    // A full socket (EAGAIN) is fine: acknowledgements are cumulative and the next one
    // carries this one. EPIPE: the sender is gone and needs none.
    if (errno != EINTR) return;
  }
}

void StreamFrameReader::close() noexcept {
  stream_.reset();
  side_.reset();
}

void StreamFrameReader::shut_down() noexcept {
  // The writer's next send fails with EPIPE (ChannelClosed); ENOTCONN: it is gone already.
  if (shares_connection_ && stream_) (void)::shutdown(stream_.get(), SHUT_RD);
}

std::vector<int> StreamFrameReader::descriptors() const {
  std::vector<int> out{stream_.get()};
  if (side_) out.push_back(side_.get());
  return out;
}

}  // namespace ferry
