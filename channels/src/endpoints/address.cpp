#include "endpoints/address.hpp"

#include "endpoints/scheme_registry.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

std::string accepted_address_forms() {
  std::string forms;
  for (const Scheme* scheme : schemes()) {
    if (!forms.empty()) forms += "; ";
    forms += scheme->forms();
  }
  return forms;
}

Address parse_address(std::string_view address) {
  const std::size_t colon = address.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == address.size()) {
    throw Error("malformed endpoint address \"" + std::string(address) +
                "\": an address is scheme:rest; accepted forms: " + accepted_address_forms());
  }
  return Address{address.substr(0, colon), address.substr(colon + 1)};
}

}  // namespace ferry::detail
