// Endpoint addresses: "scheme:rest". The scheme picks the code that listens and connects
// (scheme_registry.hpp); the rest means what that scheme says.
#pragma once

#include <string>
#include <string_view>

namespace ferry::detail {

struct Address {
  std::string_view scheme;  ///< "unix"
  std::string_view rest;    ///< "@loader", "/run/app/loader.sock"
};

/// Splits `address` at its first ':'. Throws Error naming the address and the accepted
/// forms when there is no scheme or nothing after it.
Address parse_address(std::string_view address);

/// Every form the registered schemes accept, for error messages.
std::string accepted_address_forms();

}  // namespace ferry::detail
