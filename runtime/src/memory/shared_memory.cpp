#include "ferry/detail/shared_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/error.hpp"

namespace ferry {
namespace {

constexpr int kRequiredSeals = F_SEAL_SHRINK | F_SEAL_GROW;

// This process's file size limit (RLIMIT_FSIZE) in bytes; UINT64_MAX when unlimited.
std::uint64_t file_size_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_FSIZE, &limit) != 0) throw_errno("getrlimit(RLIMIT_FSIZE)");
  return limit.rlim_cur == RLIM_INFINITY ? UINT64_MAX : static_cast<std::uint64_t>(limit.rlim_cur);
}

[[noreturn]] void throw_file_size_limit(std::size_t size, std::string_view what, std::string_view remedy) {
  throw OutOfSharedMemory("cannot create " + std::string(what) + " of " + std::to_string(size) +
                              " bytes: this process's file size limit (RLIMIT_FSIZE, `ulimit -f`) is " +
                              std::to_string(file_size_limit()) + " bytes; raise it or " + std::string(remedy),
                          EFBIG);
}

// posix_fallocate failed with `error` while reserving the pages of a new memfd.
[[noreturn]] void throw_reservation_failure(std::size_t size, int error, std::string_view what,
                                            std::string_view remedy) {
  if (error == EFBIG) throw_file_size_limit(size, what, remedy);
  const std::string segment = "cannot create " + std::string(what) + " of " + std::to_string(size) + " bytes: ";
  if (error == ENOSPC) {
    throw OutOfSharedMemory(segment +
                                "no space left for shared memory (ENOSPC: the kernel will not commit more "
                                "memory to shared memory); free memory or " +
                                std::string(remedy),
                            error);
  }
  if (error == ENOMEM) {
    throw OutOfSharedMemory(segment +
                                "out of memory for shared memory (ENOMEM; a memory cgroup may be at its "
                                "limit); free memory or " +
                                std::string(remedy),
                            error);
  }
  throw_system_error("posix_fallocate of " + std::to_string(size) + " bytes of shared memory for " + std::string(what),
                     error);
}

}  // namespace

detail::FileIdentity detail::identify_fd(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_errno("fstat of fd " + std::to_string(fd));
  return detail::FileIdentity{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)};
}

detail::UniqueFd detail::create_reserved_memfd(std::size_t size, const char* name, std::string_view what,
                                               std::string_view remedy) {
  if (size == 0) throw Error("cannot create " + std::string(what) + " of 0 bytes: a segment needs at least one byte");
  // A memfd counts as a file for RLIMIT_FSIZE: growing it past the limit fails with EFBIG
  // *and* sends SIGXFSZ, whose default action kills the process. Check first, so that the
  // caller gets an exception instead.
  if (size > file_size_limit()) throw_file_size_limit(size, what, remedy);
  detail::UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) throw_errno("memfd_create for " + std::string(what));
  // memfds are created with mode 0777. Only holders of the fd or of access to
  // /proc/<pid>/fd (same user, or root) can reach one, but owner-only is the right default:
  // a re-open through /proc by anyone but the owner is then refused.
  if (::fchmod(fd.get(), S_IRUSR | S_IWUSR) != 0) throw_errno("fchmod(0600) of a new memfd");
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    if (errno == EFBIG) throw_file_size_limit(size, what, remedy);
    throw_errno("ftruncate of a new memfd to " + std::to_string(size) + " bytes");
  }
  // Reserve every page now: when shared memory is short, ftruncate succeeds and the first
  // write would fault with SIGBUS; posix_fallocate turns that into ENOSPC (or ENOMEM) here.
  if (const int rc = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(size)); rc != 0) {
    throw_reservation_failure(size, rc, what, remedy);
  }
  return fd;
}

detail::SharedMemory detail::SharedMemory::create(std::size_t size, const char* name) {
  detail::UniqueFd fd = detail::create_reserved_memfd(size, name, "a shared segment", "send smaller tensors");
  // A peer must never be able to shrink the segment under a mapping (SIGBUS).
  if (::fcntl(fd.get(), F_ADD_SEALS, kRequiredSeals | F_SEAL_SEAL) != 0) {
    throw_errno("fcntl(F_ADD_SEALS) on a new memfd");
  }
  detail::Mapping mapping = detail::Mapping::map_shared(fd.get(), size);
  const detail::FileIdentity identity = detail::identify_fd(fd.get());
  return detail::SharedMemory(std::move(fd), std::move(mapping), size, identity);
}

detail::SharedMemory::Received detail::SharedMemory::inspect_received(int fd) {
  // Seals first: a size read before them could change before they were set (a peer that
  // shrinks the file under our mapping makes us SIGBUS); once sealed, it cannot.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    throw ProtocolError(
        "received storage fd is not a memfd (F_GET_SEALS failed); the sender must "
        "share tensors allocated by ferry");
  }
  if ((seals & kRequiredSeals) != kRequiredSeals) {
    throw ProtocolError(
        "received memfd is not sealed against shrinking and growing; refusing to map "
        "it (a peer could shrink it and crash this process)");
  }
  // Every segment (and the return board) is mapped read-write, which the kernel refuses for
  // a memfd sealed against writing: a lie about what ferry sends, not a failed system call.
  if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    throw ProtocolError(
        "received memfd is sealed against writing; ferry maps segments read-write and never "
        "seals them so");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_errno("fstat of a received memfd");
  return Received{detail::FileIdentity{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)},
                  static_cast<std::uint64_t>(st.st_size)};
}

detail::SharedMemory detail::SharedMemory::map_received(detail::UniqueFd fd, const Received& received,
                                                        std::size_t expected_size) {
  if (received.size != expected_size) {
    throw ProtocolError("received memfd has " + std::to_string(received.size) + " bytes but the frame claims " +
                        std::to_string(expected_size));
  }
  if (expected_size == 0) throw ProtocolError("received memfd is empty");
  detail::Mapping mapping = detail::Mapping::map_shared(fd.get(), expected_size);
  return detail::SharedMemory(std::move(fd), std::move(mapping), expected_size, received.identity);
}

}  // namespace ferry
