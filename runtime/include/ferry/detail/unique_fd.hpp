// RAII owner of a file descriptor. Everything but duplicate() is inline, so that a program
// that does not link the ferry library (the `ferry` tool) can use it too.
#pragma once

#include <unistd.h>

#include <utility>

namespace ferry::detail {

/// Owns one file descriptor and closes it when destroyed. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  /// The descriptor, or -1 when empty.
  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  explicit operator bool() const noexcept { return valid(); }
  /// Gives up ownership without closing; returns the descriptor.
  int release() noexcept { return std::exchange(fd_, -1); }
  /// Closes the owned descriptor (if any) and takes ownership of `fd`.
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) {
      // close() may report EINTR/EIO, but the descriptor is released on Linux either way,
      // and a destructor has no one to report to.
      (void)::close(fd_);
    }
    fd_ = fd;
  }
  /// A new descriptor for the same open file (F_DUPFD_CLOEXEC); throws SystemError.
  UniqueFd duplicate() const;

 private:
  int fd_ = -1;
};

}  // namespace ferry::detail
