// Who is at the other end of a Unix socket (SO_PEERCRED), and refusing peers of another user.
#pragma once

#include <sys/types.h>

#include "ferry/error.hpp"

namespace ferry {

/// The process at the other end of a Unix socket, as the kernel recorded it when the
/// connection was made: by connect()/accept(), the connecting and the listening process;
/// for a socketpair(), the process that created the pair (for both ends, also after one end
/// was inherited or passed to another process).
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

/// A peer whose credentials this process does not accept.
class UntrustedPeer : public Error {
 public:
  using Error::Error;
};

/// The credentials of the peer of Unix socket `fd` (SO_PEERCRED). Throws SystemError, e.g.
/// ENOTSOCK when `fd` is not a socket (a pipe has no peer credentials).
PeerCredentials peer_credentials(int fd);

/// Throws UntrustedPeer, naming both users, unless the peer of Unix socket `fd` runs as
/// `expected_uid`. Use it on a socket accepted from a listening endpoint before reading any
/// frame from it; a peer of another user could otherwise hand this process segments to map.
void require_peer_uid(int fd, uid_t expected_uid);

}  // namespace ferry
