// ucx:// addresses: "ucx://HOST:PORT", HOST an IPv4 literal, a bracketed IPv6 literal or
// a name (resolved with getaddrinfo; its IPv4 address when it has both), PORT 0..65535.
// IPv6 loopback, link-local and IPv4-mapped addresses are refused (UCX 1.13 cannot carry them).
#pragma once

#include <sys/socket.h>

#include <string>
#include <string_view>

namespace ferry::ucx::detail {

struct UcxAddress {
  std::string host;  ///< without brackets
  std::uint16_t port = 0;
  sockaddr_storage socket{};
  socklen_t length = 0;
  bool loopback = false;  ///< 127.0.0.0/8
  /// "HOST:PORT" (IPv6 in brackets) with `port`.
  std::string text(std::uint16_t port) const;
};

/// Parses and resolves `address`; throws Error naming the address and the accepted forms.
UcxAddress parse_ucx_address(std::string_view address);

}  // namespace ferry::ucx::detail
