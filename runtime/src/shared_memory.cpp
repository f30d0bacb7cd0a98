#include "ferry/shared_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "ferry/error.hpp"

namespace ferry {
namespace {

constexpr int kRequiredSeals = F_SEAL_SHRINK | F_SEAL_GROW;

}  // namespace

FileIdentity identify_fd(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_errno("fstat of fd " + std::to_string(fd));
  return FileIdentity{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)};
}

SharedMemory SharedMemory::create(std::size_t size, const char* name) {
  if (size == 0) throw Error("SharedMemory::create: a segment needs at least one byte");
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) throw_errno("memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    throw_errno("ftruncate of a new memfd to " + std::to_string(size) + " bytes");
  }
  // Reserve every page now: on a full tmpfs ftruncate succeeds and the first write would
  // fault with SIGBUS; posix_fallocate turns that into ENOSPC here.
  if (const int rc = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(size)); rc != 0) {
    if (rc == ENOSPC || rc == ENOMEM) {
      throw OutOfSharedMemory("cannot reserve " + std::to_string(size) +
                                  " bytes of shared memory (free memory or lower the tensor sizes)",
                              rc);
    }
    throw_system_error("posix_fallocate of " + std::to_string(size) + " bytes of shared memory", rc);
  }
  // A peer must never be able to shrink the segment under a mapping (SIGBUS).
  if (::fcntl(fd.get(), F_ADD_SEALS, kRequiredSeals | F_SEAL_SEAL) != 0) {
    throw_errno("fcntl(F_ADD_SEALS) on a new memfd");
  }
  Mapping mapping = Mapping::map_shared(fd.get(), size);
  const FileIdentity identity = identify_fd(fd.get());
  return SharedMemory(std::move(fd), std::move(mapping), size, identity);
}

SharedMemory SharedMemory::open_received(UniqueFd fd, std::size_t expected_size) {
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0) {
    throw ProtocolError("received storage fd is not a memfd (F_GET_SEALS failed); the sender must "
                        "share tensors allocated by ferry");
  }
  if ((seals & kRequiredSeals) != kRequiredSeals) {
    throw ProtocolError("received memfd is not sealed against shrinking and growing; refusing to map "
                        "it (a peer could shrink it and crash this process)");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_errno("fstat of a received memfd");
  if (static_cast<std::uint64_t>(st.st_size) != expected_size) {
    throw ProtocolError("received memfd has " + std::to_string(st.st_size) + " bytes but the frame claims " +
                        std::to_string(expected_size));
  }
  if (expected_size == 0) throw ProtocolError("received memfd is empty");
  Mapping mapping = Mapping::map_shared(fd.get(), expected_size);
  const FileIdentity identity{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)};
  return SharedMemory(std::move(fd), std::move(mapping), expected_size, identity);
}

}  // namespace ferry
