// RAII owner of a memory mapping.
#pragma once

#include <cstddef>
#include <utility>

namespace ferry::detail {

/// Owns one mmap()ed region and unmaps it when destroyed. Move-only.
class Mapping {
 public:
  Mapping() = default;
  /// Maps `length` bytes of `fd` from offset 0, shared and read-write; throws SystemError.
  static Mapping map_shared(int fd, std::size_t length);

  Mapping(Mapping&& other) noexcept
      : address_(std::exchange(other.address_, nullptr)), length_(std::exchange(other.length_, 0)) {}
  Mapping& operator=(Mapping&& other) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { reset(); }

  void* data() const noexcept { return address_; }
  std::size_t size() const noexcept { return length_; }
  /// Unmaps the region (if any).
  void reset() noexcept;

 private:
  Mapping(void* address, std::size_t length) : address_(address), length_(length) {}
  void* address_ = nullptr;
  std::size_t length_ = 0;
};

}  // namespace ferry::detail
