// A message type reduced to what encoding and decoding a frame needs of it: its fingerprint,
// its name, and plain functions that write one value with ferry's output archive and read
// one with its input archive. Senders, receivers and spawn pass these to code compiled once
// in the library, so a message type instantiates only its own serialization.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ferry/detail/archive.hpp"
#include "ferry/detail/type_name.hpp"

namespace ferry::detail {

/// Writes the message at `message` (a const T*) with `archive`.
using BodyWriter = void (*)(FrameOutputArchive& archive, const void* message);
/// Reads a message into `out` (a T*, default-constructed) with `archive`.
using BodyReader = void (*)(FrameInputArchive& archive, void* out);

/// The sending side's view of a message type (sent_type<T>).
struct SentType {
  std::uint64_t fingerprint;
  std::string_view name;
  BodyWriter write;
};

/// A message type whose body is a size and its elements' bytes, written from where the
/// message holds them (a vector of numbers, a string): a large one may be borrowed.
template <class T>
struct borrowable_elements : std::false_type {};
template <class T, class A>
struct borrowable_elements<std::vector<T, A>>
    : std::bool_constant<std::is_arithmetic_v<T> && !std::is_same_v<T, bool>> {};
template <class C, class Traits, class A>
struct borrowable_elements<std::basic_string<C, Traits, A>> : std::true_type {};

template <class T>
void write_body(FrameOutputArchive& archive, const void* message) {
  const T& value = *static_cast<const T*>(message);
  if constexpr (borrowable_elements<T>::value) {
    // Only the message's own elements are offered: those of a container that a user's
    // save() builds for a moment would be gone before the frame is written.
    struct Offer {
      FrameOutputArchive& archive;
      ~Offer() { archive.offer_borrow(nullptr, 0); }
    } offer{archive};
    archive.offer_borrow(value.data(), value.size() * sizeof(typename T::value_type));
    archive(value);
  } else {
    archive(value);
  }
}
template <class T>
void read_body_into(FrameInputArchive& archive, void* out) {
  archive(*static_cast<T*>(out));
}

/// The receiving side's view of a message type (received_type<T>).
struct ReceivedType {
  std::uint64_t fingerprint;
  std::string_view name;
  BodyReader read;
};

/// T as a SentType.
template <class T>
inline constexpr SentType sent_type{type_fingerprint<T>(), type_name<T>(), &detail::write_body<T>};

/// T as a ReceivedType.
template <class T>
inline constexpr ReceivedType received_type{type_fingerprint<T>(), type_name<T>(), &detail::read_body_into<T>};

}  // namespace ferry::detail
