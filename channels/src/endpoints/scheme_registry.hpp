// The registry of address schemes: each scheme ("unix") is the code that listens at and
// connects to its addresses. A new transport between hosts is a new entry here, not a new
// API: listen() and connect_*() look the scheme up and run the same handshake over
// whatever connection it makes.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/detail/deadline.hpp"
#include "ferry/peer_credentials.hpp"
#include "ferry/detail/unique_fd.hpp"

namespace ferry {
struct EndpointOptions;
}

namespace ferry::detail {

/// A connection a listening point accepted, with the peer's credentials as the kernel
/// recorded them.
struct AcceptedSocket {
  UniqueFd socket;
  PeerCredentials peer;
};

/// A scheme's listening socket. Its destructor (in the process that made it) removes what
/// it left behind (a socket file).
class ListeningPoint {
 public:
  virtual ~ListeningPoint() = default;
  /// The descriptor that polls readable when a connection waits to be accepted.
  virtual int fd() const noexcept = 0;
  /// A waiting connection (a blocking stream socket that passes fds, close-on-exec), or
  /// std::nullopt when none waits. Throws SystemError for a failure of this process (out
  /// of descriptors: EMFILE, ENFILE), with a message saying what to do.
  virtual std::optional<AcceptedSocket> accept() = 0;
  /// Forgets what the destructor would remove, without removing it (a forked child's copy).
  virtual void abandon() noexcept = 0;
};

/// One scheme. The connection it makes is a stream socket that passes fds (SCM_RIGHTS):
/// the handshake (handshake.hpp) and the channel's ends run over it.
class Scheme {
 public:
  virtual ~Scheme() = default;
  /// "unix"
  virtual std::string_view name() const noexcept = 0;
  /// The forms of address it accepts, for messages: "unix:PATH (a socket file) or ...".
  virtual std::string_view forms() const noexcept = 0;
  /// Listens at `rest` (the address after "name:"). Throws AddressInUse, or Error for a
  /// malformed address.
  virtual std::unique_ptr<ListeningPoint> listen(std::string_view address, std::string_view rest,
                                                 const EndpointOptions& options) const = 0;
  /// One attempt to connect to `rest`: the connected socket (blocking, close-on-exec), or
  /// an empty one when nobody listens there yet (the caller retries until its deadline).
  /// Throws Error for a malformed address.
  virtual UniqueFd try_connect(std::string_view address, std::string_view rest) const = 0;
};

/// The scheme named `name`, or nullptr.
const Scheme* find_scheme(std::string_view name);
/// Every registered scheme (unix: first).
const std::vector<std::unique_ptr<Scheme>>& schemes();

/// The built-in schemes (each in its own source file).
std::unique_ptr<Scheme> make_unix_scheme();

}  // namespace ferry::detail
