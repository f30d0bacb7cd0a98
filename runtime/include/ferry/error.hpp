// ferry's exception types. Every error ferry raises derives from ferry::Error, and every
// message says what happened and what the user can do about it.
#pragma once

#include <stdexcept>
#include <string>

namespace ferry {

/// Base class of every exception ferry throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The channel cannot carry messages any more: this end or the peer closed it.
class ChannelClosed : public Error {
 public:
  using Error::Error;
};

/// The peer process went away without closing its end (crashed or was killed).
class PeerDied : public ChannelClosed {
 public:
  using ChannelClosed::ChannelClosed;
};

/// A frame broke the wire protocol: truncated, corrupted, or lying about its contents.
/// The channel that received it is broken afterwards and reports this error again.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

/// A frame was sent by a `Sender<A>` to a `Receiver<B>` with A != B.
class TypeMismatch : public ProtocolError {
 public:
  using ProtocolError::ProtocolError;
};

/// More living processes hold what arrived on one connection than its sender can track
/// (ReturnBoard::kMaxHolders): a receiver that cannot register as a holder could not keep
/// the sender from recycling the blocks it would receive, so it refuses the frame. The
/// channel is broken afterwards.
class TooManyHolders : public Error {
 public:
  using Error::Error;
};

/// A system call failed; `code()` is the errno value.
class SystemError : public Error {
 public:
  SystemError(const std::string& what, int code);
  int code() const noexcept { return code_; }

 private:
  int code_;
};

/// Shared memory could not be reserved (the tmpfs behind it, or memory, is full).
class OutOfSharedMemory : public SystemError {
 public:
  using SystemError::SystemError;
};

/// Throws SystemError for `what` (a description of the failed call) with errno `code`.
[[noreturn]] void throw_system_error(const std::string& what, int code);

/// Throws SystemError for `what` with the current errno.
[[noreturn]] void throw_errno(const std::string& what);

}  // namespace ferry
