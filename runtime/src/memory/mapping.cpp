#include "ferry/detail/mapping.hpp"

#include <sys/mman.h>

#include "ferry/error.hpp"

namespace ferry {

detail::Mapping detail::Mapping::map_shared(int fd, std::size_t length) {
  void* address = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (address == MAP_FAILED) {
    throw_errno("mmap of " + std::to_string(length) + " bytes of fd " + std::to_string(fd));
  }
  return detail::Mapping(address, length);
}

detail::Mapping& detail::Mapping::operator=(detail::Mapping&& other) noexcept {
  if (this != &other) {
    reset();
    address_ = std::exchange(other.address_, nullptr);
    length_ = std::exchange(other.length_, 0);
  }
  return *this;
}

void detail::Mapping::reset() noexcept {
  if (address_ != nullptr) {
    // munmap only fails for invalid arguments, which this type never holds.
    (void)::munmap(address_, length_);
    address_ = nullptr;
    length_ = 0;
  }
}

}  // namespace ferry
