#include "endpoints/scheme_registry.hpp"

namespace ferry::detail {

const std::vector<std::unique_ptr<Scheme>>& schemes() {
  static const std::vector<std::unique_ptr<Scheme>> registered = [] {
    std::vector<std::unique_ptr<Scheme>> all;
    all.push_back(make_unix_scheme());
    return all;
  }();
  return registered;
}

const Scheme* find_scheme(std::string_view name) {
  for (const auto& scheme : schemes()) {
    if (scheme->name() == name) return scheme.get();
  }
  return nullptr;
}

}  // namespace ferry::detail
