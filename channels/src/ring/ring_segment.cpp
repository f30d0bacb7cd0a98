#include "ring/ring_segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <new>
#include <string>

#include "ferry/detail/shared_memory.hpp"
#include "ferry/error.hpp"

namespace ferry {
namespace {

constexpr int kRequiredSeals = F_SEAL_SHRINK | F_SEAL_GROW;
// Not "ferry...": tests count tensor segments by the "/memfd:ferry" prefix in /proc/self/maps.
constexpr const char* kSegmentName = "ring:ferry";

// Maps the header and the data, then the data once more right after it, so that any
// `capacity` bytes starting inside the data are contiguous in memory: a frame never has to
// be split at the wrap point, and the reader can decode one in place.
detail::Mapping map_twice(int fd, std::uint64_t capacity) {
  // The first mapping reaches past the end of the file; the part beyond is replaced below
  // (and would raise SIGBUS if touched before).
  detail::Mapping mapping = detail::Mapping::map_shared(fd, kRingHeaderBytes + 2 * capacity);
  void* second = static_cast<std::byte*>(mapping.data()) + kRingHeaderBytes + capacity;
  if (::mmap(second, capacity, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, kRingHeaderBytes) == MAP_FAILED) {
    throw_errno("mmap of a ring's data a second time");
  }
  return mapping;
}

}  // namespace

std::size_t ring_capacity_for(std::size_t requested) {
  if (requested > kRingMaxCapacity) {
    throw Error("a ring capacity of " + std::to_string(requested) + " bytes is above the limit of " +
                std::to_string(kRingMaxCapacity) + " bytes; ask for less");
  }
  return std::max(kRingMinCapacity, std::bit_ceil(requested));
}

RingSegment::RingSegment(detail::UniqueFd fd, detail::Mapping mapping, std::uint64_t capacity)
    : fd_(std::move(fd)),
      mapping_(std::move(mapping)),
      header_(static_cast<RingHeader*>(mapping_.data())),
      data_(static_cast<std::byte*>(mapping_.data()) + kRingHeaderBytes),
      capacity_(capacity) {}

RingSegment::RingSegment(RingSegment&& other) noexcept
    : fd_(std::move(other.fd_)),
      mapping_(std::move(other.mapping_)),
      header_(std::exchange(other.header_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)) {}

RingSegment& RingSegment::operator=(RingSegment&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = std::move(other.fd_);
    mapping_ = std::move(other.mapping_);
    header_ = std::exchange(other.header_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

RingSegment RingSegment::create(std::size_t requested_capacity) {
  const std::size_t capacity = ring_capacity_for(requested_capacity);
  const std::size_t size = kRingHeaderBytes + capacity;
  detail::UniqueFd fd =
      detail::create_reserved_memfd(size, kSegmentName, "a ring", "ask for a smaller ChannelOptions::ring_capacity");
  // Neither end may ever shrink the segment under the other's mapping (SIGBUS).
  if (::fcntl(fd.get(), F_ADD_SEALS, kRequiredSeals | F_SEAL_SEAL) != 0) throw_errno("fcntl(F_ADD_SEALS) on a ring");
  detail::Mapping mapping = map_twice(fd.get(), capacity);
  // The fresh memfd is zero-filled: every atomic starts at 0. Start the header's lifetime.
  auto* header = new (mapping.data()) RingHeader{};
  header->magic = kRingMagic;
  header->version = kRingVersion;
  header->header_bytes = static_cast<std::uint32_t>(kRingHeaderBytes);
  header->capacity = capacity;
  return RingSegment(std::move(fd), std::move(mapping), capacity);
}

RingSegment RingSegment::attach(detail::UniqueFd fd) {
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & kRequiredSeals) != kRequiredSeals) {
    throw ProtocolError(
        "the fd given as a ring segment is not a memfd sealed against shrinking and growing; "
        "pass the descriptors of a ferry ring channel");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_errno("fstat of a ring segment");
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size < kRingHeaderBytes + kRingMinCapacity) {
    throw ProtocolError("a ring segment of " + std::to_string(size) + " bytes is too small to hold a ring");
  }
  std::uint64_t capacity = 0;
  {
    const detail::Mapping probe = detail::Mapping::map_shared(fd.get(), kRingHeaderBytes);
    const auto* header = static_cast<const RingHeader*>(probe.data());
    if (header->magic != kRingMagic || header->version != kRingVersion || header->header_bytes != kRingHeaderBytes) {
      throw ProtocolError(
          "the ring segment has a wrong magic number, version or header size; it is corrupted or "
          "was made by another ferry build");
    }
    capacity = header->capacity;
  }
  if (!std::has_single_bit(capacity) || capacity + kRingHeaderBytes != size) {
    throw ProtocolError("the ring segment claims a capacity of " + std::to_string(capacity) +
                        " bytes, which does not match its size of " + std::to_string(size) + " bytes");
  }
  detail::Mapping mapping = map_twice(fd.get(), capacity);
  return RingSegment(std::move(fd), std::move(mapping), capacity);
}

void RingSegment::reset() noexcept {
  header_ = nullptr;
  data_ = nullptr;
  capacity_ = 0;
  mapping_.reset();
  fd_.reset();
}

}  // namespace ferry
