#include "endpoints/scheme_registry.hpp"

#include "endpoints/address.hpp"
#include "ferry/error.hpp"

// Defined by ferry_ucx (ucx/ucx_scheme.cpp). A weak reference: null in a program that
// does not link ferry_ucx. A static library's object that nothing references is not linked
// at all, so the ferry::ucx target adds -Wl,--undefined=ferry_ucx_scheme to every program
// that links it, which makes the linker take that object from the archive.
extern "C" const ferry::detail::Scheme* ferry_ucx_scheme() __attribute__((weak));

namespace ferry::detail {

const std::vector<const Scheme*>& schemes() {
  static const std::unique_ptr<Scheme> unix_scheme = make_unix_scheme();
  static const std::vector<const Scheme*> registered = [] {
    std::vector<const Scheme*> all{unix_scheme.get()};
    if (ferry_ucx_scheme != nullptr) {
      if (const Scheme* ucx = ferry_ucx_scheme()) all.push_back(ucx);
    }
    return all;
  }();
  return registered;
}

const Scheme& scheme_of(std::string_view address, std::string_view scheme_name) {
  for (const Scheme* scheme : schemes()) {
    if (scheme->name() == scheme_name) return *scheme;
  }
  if (scheme_name == "ucx") {
    throw Error("endpoint address \"" + std::string(address) +
                "\" is a ucx:// address, and this program was built without ucx:// support: build ferry with "
                "UCX (scripts/install-deps installs libucx-dev and libsodium-dev; configure with "
                "-DFERRY_WITH_UCX=ON) and link the CMake target ferry::ucx into this program");
  }
  throw Error("unknown scheme \"" + std::string(scheme_name) + "\" in endpoint address \"" + std::string(address) +
              "\"; accepted forms: " + accepted_address_forms());
}

}  // namespace ferry::detail
