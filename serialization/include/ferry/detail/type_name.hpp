// Compile-time names and fingerprints of C++ types, for the frame header's type check.
#pragma once

#include <cstdint>
#include <string_view>

namespace ferry::detail {

/// The compiler's spelling of T's name, e.g. "Batch" or "std::vector<int>".
template <class T>
constexpr std::string_view type_name() {
#if defined(__clang__)
  constexpr std::string_view signature = __PRETTY_FUNCTION__;  // "... type_name() [T = X]"
  constexpr std::string_view prefix = "[T = ";
  constexpr std::string_view suffix = "]";
#elif defined(__GNUC__)
  constexpr std::string_view signature = __PRETTY_FUNCTION__;  // "... [with T = X; ...]"
  constexpr std::string_view prefix = "[with T = ";
  constexpr std::string_view suffix = "; std::string_view";
#else
#error "ferry::type_name needs GCC or Clang"
#endif
  constexpr auto begin = signature.find(prefix) + prefix.size();
  constexpr auto end = signature.rfind(suffix);
  return signature.substr(begin, end - begin);
}

/// 64-bit FNV-1a hash of `text`.
constexpr std::uint64_t fnv1a64(std::string_view text) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (const char c : text) {
    hash ^= static_cast<std::uint8_t>(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

/// The fingerprint of T written into every frame a `Sender<T>` sends.
template <class T>
constexpr std::uint64_t type_fingerprint() {
  return fnv1a64(type_name<T>());
}

}  // namespace ferry::detail
