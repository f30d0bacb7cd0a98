#include "ucx_address.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <charconv>
#include <cstring>
#include <memory>

#include "ferry/error.hpp"

namespace ferry::ucx::detail {
namespace {

constexpr std::string_view kForms =
    "accepted forms: ucx://HOST:PORT with HOST an IPv4 address or a name (an IPv6 address goes in brackets, "
    "ucx://[::1]:7000, and is refused for now); PORT 0 picks a free port when listening";

[[noreturn]] void malformed(std::string_view address, const std::string& why) {
  throw Error("malformed ucx address \"" + std::string(address) + "\": " + why + "; " + std::string(kForms));
}

}  // namespace

std::string UcxAddress::text(std::uint16_t at_port) const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(at_port);
}

UcxAddress parse_ucx_address(std::string_view address) {
  constexpr std::string_view scheme = "ucx://";
  if (address.substr(0, scheme.size()) != scheme) malformed(address, "it does not start with ucx://");
  std::string_view rest = address.substr(scheme.size());
  UcxAddress parsed;
  std::string_view port_text;
  if (!rest.empty() && rest.front() == '[') {
    const auto close = rest.find(']');
    if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':') {
      malformed(address, "an IPv6 address needs brackets and a port ([ADDR]:PORT)");
    }
    parsed.host = std::string(rest.substr(1, close - 1));
    port_text = rest.substr(close + 2);
  } else {
    const auto colon = rest.rfind(':');
    if (colon == std::string_view::npos) malformed(address, "no port");
    parsed.host = std::string(rest.substr(0, colon));
    if (parsed.host.find(':') != std::string::npos) malformed(address, "an IPv6 address must be in brackets");
    port_text = rest.substr(colon + 1);
  }
  if (parsed.host.empty()) malformed(address, "no host");
  unsigned port = 0;
  const auto [end, error] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || error != std::errc{} || end != port_text.data() + port_text.size() || port > 65535) {
    malformed(address, "the port is not a number from 0 to 65535");
  }
  parsed.port = static_cast<std::uint16_t>(port);

  if (parsed.host.find(':') != std::string::npos) {
    // UCX 1.13's TCP transport (Debian) fails over IPv6: its wire-up connects to an IPv6
    // address it does not listen on, and a listener then aborts inside ucp_worker_destroy.
    throw Error("ucx address \"" + std::string(address) +
                "\" is an IPv6 address, which ucx:// does not carry yet (UCX 1.13's TCP transport fails over "
                "IPv6); use an IPv4 address or a name that resolves to one");
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;  // names resolve to IPv4 addresses (see above)
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int status = ::getaddrinfo(parsed.host.c_str(), service.c_str(), &hints, &found); status != 0) {
    throw Error("cannot resolve the host of ucx address \"" + std::string(address) + "\": " + gai_strerror(status));
  }
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owner(found, &::freeaddrinfo);
  std::memcpy(&parsed.socket, found->ai_addr, found->ai_addrlen);
  parsed.length = found->ai_addrlen;
  if (found->ai_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(found->ai_addr);
    parsed.loopback = (ntohl(v4->sin_addr.s_addr) >> 24) == 127;
  } else if (found->ai_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(found->ai_addr);
    parsed.loopback = IN6_IS_ADDR_LOOPBACK(&v6->sin6_addr);
  }
  return parsed;
}

}  // namespace ferry::ucx::detail
