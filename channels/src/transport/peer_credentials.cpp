#include "ferry/peer_credentials.hpp"

#include <sys/socket.h>

#include <string>

namespace ferry {

PeerCredentials peer_credentials(int fd) {
  ucred credentials{};
  socklen_t length = sizeof credentials;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) {
    throw_errno("getsockopt(SO_PEERCRED) on fd " + std::to_string(fd) + " (peer credentials need a Unix socket)");
  }
  return PeerCredentials{credentials.pid, credentials.uid, credentials.gid};
}

void require_peer_uid(int fd, uid_t expected_uid) {
  const PeerCredentials peer = peer_credentials(fd);
  if (peer.uid != expected_uid) {
    throw UntrustedPeer("the peer of this channel (process " + std::to_string(peer.pid) + ") runs as user " +
                        std::to_string(peer.uid) + ", not the expected user " + std::to_string(expected_uid) +
                        "; refusing to read from it");
  }
}

}  // namespace ferry
