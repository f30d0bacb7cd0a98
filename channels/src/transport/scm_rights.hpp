// Descriptors carried as one SCM_RIGHTS control message of a sendmsg / recvmsg.
#pragma once

#include <sys/socket.h>

#include <cstring>
#include <span>

namespace ferry::detail {

/// Puts `fds` into `message` as one SCM_RIGHTS control message built in `control` (cmsghdr-
/// aligned, at least CMSG_SPACE(sizeof(int) * fds.size()) bytes); no control message for no fds.
inline void attach_fds(msghdr& message, std::span<char> control, std::span<const int> fds) noexcept {
  if (fds.empty()) return;
  message.msg_control = control.data();
  message.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(header), fds.data(), sizeof(int) * fds.size());
}

/// Appends every descriptor a received `message` brought to `out` (a container of UniqueFd,
/// so that each is owned at once and none leaks when the caller throws).
template <class Fds>
void take_fds(msghdr& message, Fds& out) {
  for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr; header = CMSG_NXTHDR(&message, header)) {
    if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t n = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < n; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(header) + i * sizeof(int), sizeof fd);
      out.emplace_back(fd);
    }
  }
}

}  // namespace ferry::detail
