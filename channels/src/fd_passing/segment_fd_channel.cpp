#include "fd_passing/segment_fd_channel.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "ferry/detail/deadline.hpp"
#include "ferry/error.hpp"
#include "transport/peer_gone.hpp"
#include "transport/scm_rights.hpp"

namespace ferry::detail {
namespace {

using Control = std::array<char, CMSG_SPACE(sizeof(int) * SegmentFdChannel::kMaxFdsPerMessage)>;

// The descriptors of one received message, owned at once so that none leaks on an error.
std::vector<UniqueFd> take_descriptors(msghdr& message) {
  std::vector<UniqueFd> taken;
  take_fds(message, taken);
  return taken;
}

}  // namespace

bool SegmentFdChannel::send(std::span<const int> fds, const Deadline& deadline) const {
  bool started = false;
  while (!fds.empty()) {
    const std::size_t n = std::min(fds.size(), kMaxFdsPerMessage);
    auto count = static_cast<unsigned char>(n);
    iovec byte{&count, 1};
    alignas(cmsghdr) Control control{};
    msghdr message{};
    message.msg_iov = &byte;
    message.msg_iovlen = 1;
    attach_fds(message, control, fds.first(n));
    if (::sendmsg(socket_, &message, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE || errno == ECONNRESET) throw_receiver_gone();
      if (errno != EAGAIN) throw_errno("sendmsg of segment fds on a channel's side socket");
      // Full: the reader takes fds as it reads their frames. A frame whose first fds went
      // out must get the rest.
      if (!wait_for_fd(socket_, POLLOUT, started ? Deadline::never() : deadline, nullptr)) return false;
      continue;
    }
    started = true;
    fds = fds.subspan(n);  // one byte: a message is sent whole or not at all
  }
  return true;
}

std::size_t SegmentFdChannel::receive(std::size_t count, std::deque<UniqueFd>& into) const {
  std::size_t received = 0;
  while (received < count) {
    unsigned char declared = 0;
    iovec byte{&declared, 1};
    alignas(cmsghdr) Control control{};
    msghdr message{};
    message.msg_iov = &byte;
    message.msg_iovlen = 1;
    message.msg_control = control.data();
    message.msg_controllen = control.size();
    const ssize_t got = ::recvmsg(socket_, &message, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == ECONNRESET)) break;  // nothing (more) came
    if (got < 0) throw_errno("recvmsg of segment fds on a channel's side socket");
    std::vector<UniqueFd> taken = take_descriptors(message);  // closed on every error below
    if (got == 0) break;                                      // the writer is gone
    if (message.msg_flags & MSG_CTRUNC) {
      throw ProtocolError(
          "file descriptors sent with a frame were dropped by the kernel (MSG_CTRUNC): this process has reached "
          "its open-file limit (RLIMIT_NOFILE); raise it with `ulimit -n` or hold fewer tensors");
    }
    if (taken.empty() || taken.size() != declared || taken.size() > count - received) {
      throw ProtocolError("the peer's side socket brought " + std::to_string(taken.size()) +
                          " fds in a message that declares " + std::to_string(declared) + ", where the frame still " +
                          "expects " + std::to_string(count - received) + "; refusing fds that no frame accounts for");
    }
    received += taken.size();
    for (UniqueFd& fd : taken) into.push_back(std::move(fd));
  }
  return received;
}

}  // namespace ferry::detail
