// ferry's exception types. Every error ferry raises derives from ferry::Error, and every
// message says what happened and what the user can do about it.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

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

/// A channel end was used in a process that does not own it. An end belongs to one process
/// at a time; a copy inherited through fork() may be used only where the end was handed
/// over (ferry::spawn, detach() in the giving process and adopt() in the taking one, or a
/// description rebuilt by an exec'd process), or where no process had used it yet (the
/// first user takes it). The copy that loses gets this error instead of sharing a stream.
class EndOwnedElsewhere : public Error {
 public:
  /// Why the end is not this process's.
  enum class Reason : unsigned char {
    UsedElsewhere,  ///< another process owns it (took it first, or adopted it)
    Closed,         ///< the owner closed it (its end of stream went out)
    HandedAway,     ///< it was handed to a process that rebuilt it from its descriptors
  };
  EndOwnedElsewhere(const std::string& what, std::string role, int owner, bool owner_alive, Reason reason)
      : Error(what), role_(std::move(role)), owner_(owner), owner_alive_(owner_alive), reason_(reason) {}
  /// "Sender" or "Receiver".
  const std::string& role() const noexcept { return role_; }
  /// The process that owns (or closed, or handed away) the end.
  int owner() const noexcept { return owner_; }
  /// Whether that process was still running when the error was raised.
  bool owner_alive() const noexcept { return owner_alive_; }
  Reason reason() const noexcept { return reason_; }

 private:
  std::string role_;
  int owner_;
  bool owner_alive_;
  Reason reason_;
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
