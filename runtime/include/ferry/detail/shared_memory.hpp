// A sealed memfd segment mapped into this process: the memory behind Device::SharedCpu.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

#include "ferry/detail/mapping.hpp"
#include "ferry/detail/unique_fd.hpp"

namespace ferry::detail {

/// Identity of an open file: equal for every fd of the same memfd, in every process.
struct FileIdentity {
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  friend bool operator==(const FileIdentity&, const FileIdentity&) = default;
};

/// Hash for FileIdentity, for unordered containers.
struct FileIdentityHash {
  std::size_t operator()(const FileIdentity& id) const noexcept {
    return std::hash<std::uint64_t>{}(id.inode * 0x9e3779b97f4a7c15ull ^ id.device);
  }
};

/// Returns the identity of the file behind `fd`; throws SystemError.
FileIdentity identify_fd(int fd);

/// Creates an owner-only memfd of `size` bytes (> 0), shown as "/memfd:<name>", with every
/// page reserved (posix_fallocate), so that writing to it never raises SIGBUS; the caller
/// seals it. Errors name the segment as `what` ("a shared segment") and end with `remedy`
/// ("send smaller tensors"). Throws OutOfSharedMemory when the pages cannot be reserved:
/// the file size limit (EFBIG; checked first, since the kernel would also send SIGXFSZ),
/// no space for shared memory (ENOSPC) or no memory (ENOMEM); SystemError otherwise.
UniqueFd create_reserved_memfd(std::size_t size, const char* name, std::string_view what, std::string_view remedy);

/// A memfd of a fixed size, sealed against shrinking and growing, mapped read-write.
/// Its pages are reserved when it is created, so writing to it never raises SIGBUS.
class SharedMemory {
 public:
  /// Creates a segment of `size` bytes (> 0). `name` is the memfd's name, shown in
  /// /proc/<pid>/maps as "/memfd:<name>". Throws OutOfSharedMemory when the pages cannot
  /// be reserved and SystemError for other failures.
  static SharedMemory create(std::size_t size, const char* name = "ferry");

  /// What inspect_received() found out about a received fd.
  struct Received {
    FileIdentity identity;
    std::uint64_t size = 0;  ///< read after the seals were checked: it cannot change any more
  };

  /// Checks that `fd`, received from another process, is a memfd sealed against shrinking
  /// and growing, then reads its identity and size (one fcntl, one fstat: the size is read
  /// only once the seals guarantee that it stays). Throws ProtocolError naming the failed
  /// check.
  static Received inspect_received(int fd);

  /// Maps the received `fd` that inspect_received() returned `received` for, after checking
  /// that its size is exactly `expected_size` (> 0). Throws ProtocolError naming the failed
  /// check.
  static SharedMemory map_received(UniqueFd fd, const Received& received, std::size_t expected_size);

  std::byte* data() const noexcept { return static_cast<std::byte*>(mapping_.data()); }
  std::size_t size() const noexcept { return size_; }
  /// The memfd, or -1 after close_fd().
  int fd() const noexcept { return fd_.get(); }
  /// Closes the memfd but keeps the mapping: the memory stays valid for this process, but
  /// can no longer be passed to another one.
  void close_fd() noexcept { fd_.reset(); }
  const FileIdentity& identity() const noexcept { return identity_; }

 private:
  SharedMemory(UniqueFd fd, Mapping mapping, std::size_t size, FileIdentity identity)
      : fd_(std::move(fd)), mapping_(std::move(mapping)), size_(size), identity_(identity) {}

  UniqueFd fd_;
  Mapping mapping_;
  std::size_t size_;
  FileIdentity identity_;
};

}  // namespace ferry::detail
