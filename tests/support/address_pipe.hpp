// A pipe that carries a listener's address (or any short text) from one test process to
// another.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "ferry/detail/unique_fd.hpp"

namespace ferry::test {

class AddressPipe {
 public:
  AddressPipe() {
    int ends[2];
    if (::pipe(ends) != 0) throw std::runtime_error("pipe");
    read_ = detail::UniqueFd(ends[0]);
    write_ = detail::UniqueFd(ends[1]);
  }
  void put(const std::string& address) {
    const std::uint32_t size = static_cast<std::uint32_t>(address.size());
    if (::write(write_.get(), &size, sizeof size) != sizeof size ||
        ::write(write_.get(), address.data(), size) != static_cast<ssize_t>(size)) {
      throw std::runtime_error("write to the address pipe");
    }
  }
  /// True when something waits to be read (no wait).
  bool ready() const {
    pollfd readable{read_.get(), POLLIN, 0};
    return ::poll(&readable, 1, 0) == 1;
  }
  std::string get(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    pollfd ready{read_.get(), POLLIN, 0};
    if (::poll(&ready, 1, static_cast<int>(timeout.count())) != 1) throw std::runtime_error("nothing came on the pipe");
    std::uint32_t size = 0;
    if (::read(read_.get(), &size, sizeof size) != sizeof size) throw std::runtime_error("read the address pipe");
    std::string address(size, '\0');
    if (::read(read_.get(), address.data(), size) != static_cast<ssize_t>(size)) {
      throw std::runtime_error("read the address pipe");
    }
    return address;
  }

 private:
  detail::UniqueFd read_;
  detail::UniqueFd write_;
};

}  // namespace ferry::test
