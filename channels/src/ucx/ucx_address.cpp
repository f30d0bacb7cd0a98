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
    "accepted forms: ucx://HOST:PORT with HOST an IPv4 address, an IPv6 address in brackets "
    "(ucx://[fd00::5]:7000) or a name; PORT 0 picks a free port when listening";

[[noreturn]] void malformed(std::string_view address, const std::string& why) {
  throw Error("malformed ucx address \"" + std::string(address) + "\": " + why + "; " + std::string(kForms));
}

// Resolves `parsed.host` into `parsed.socket` (a name: its IPv4 address if it has one),
// and refuses the IPv6 addresses UCX cannot carry.
void resolve(UcxAddress& parsed, std::string_view address) {
  const bool literal_v6 = parsed.host.find(':') != std::string::npos;
  addrinfo hints{};
  hints.ai_family = literal_v6 ? AF_INET6 : AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = literal_v6 ? AI_NUMERICHOST : 0;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(parsed.port);
  if (const int status = ::getaddrinfo(parsed.host.c_str(), service.c_str(), &hints, &found); status != 0) {
    if (literal_v6) malformed(address, "\"" + parsed.host + "\" is not an IPv6 address");
    throw Error("cannot resolve the host of ucx address \"" + std::string(address) + "\": " + gai_strerror(status));
  }
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owner(found, &::freeaddrinfo);
  // A name with addresses of both families: its IPv4 one (a listener at 0.0.0.0 takes it).
  const addrinfo* chosen = found;
  for (const addrinfo* entry = found; entry != nullptr; entry = entry->ai_next) {
    if (entry->ai_family == AF_INET) {
      chosen = entry;
      break;
    }
  }
  if (chosen->ai_family != AF_INET && chosen->ai_family != AF_INET6) {
    throw Error("the host of ucx address \"" + std::string(address) + "\" resolved to neither IPv4 nor IPv6");
  }
  std::memcpy(&parsed.socket, chosen->ai_addr, chosen->ai_addrlen);
  parsed.length = chosen->ai_addrlen;
  if (chosen->ai_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(chosen->ai_addr);
    parsed.loopback = (ntohl(v4->sin_addr.s_addr) >> 24) == 127;
    return;
  }
  const auto* v6 = reinterpret_cast<const sockaddr_in6*>(chosen->ai_addr);
  if (IN6_IS_ADDR_LOOPBACK(&v6->sin6_addr) || IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr) ||
      IN6_IS_ADDR_LINKLOCAL(&v6->sin6_addr)) {
    // UCX 1.13's TCP transport (Debian) takes no IPv6 address on the loopback device, and a
    // link-local or v4-mapped one names no device its wire-up can reach.
    throw Error("ucx address \"" + std::string(address) +
                "\": UCX's TCP transport cannot carry IPv6 loopback, link-local or IPv4-mapped addresses; use "
                "127.0.0.1 on one host, or the host's global (or unique local) IPv6 address");
  }
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
    if (parsed.host.find(':') == std::string::npos) {
      malformed(address, "\"" + parsed.host + "\" is not an IPv6 address (only those go in brackets)");
    }
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
  resolve(parsed, address);
  return parsed;
}

}  // namespace ferry::ucx::detail
