// Reading a message of type T out of a received body: the one place where a body becomes a
// value, shared by MessageDecoder and the fuzz targets.
#pragma once

#include <cereal/details/helpers.hpp>
#include <cstddef>
#include <memory>
#include <span>
#include <string_view>

#include "ferry/detail/archive.hpp"
#include "ferry/error.hpp"
#include "ferry/detail/type_name.hpp"

namespace ferry {

class Storage;

namespace detail {
// read_body_with()'s errors, compiled once in the library rather than in every message
// type's instantiation.
[[noreturn]] void throw_body_left_over(std::size_t remaining, std::string_view type);
[[noreturn]] void throw_body_invalid(std::string_view type, const char* what);
}  // namespace detail

/// Deserializes a T from what `archive` reads (a FrameInputArchive over a body and its
/// storages). Every way a body can lie is a ProtocolError: short reads, bytes left over, invalid
/// tensors, and cereal's own errors (a std::variant index out of range, ...), which cereal
/// raises as cereal::Exception and which are converted here.
template <class T>
T read_body_with(FrameInputArchive& archive) {
  T value{};
  try {
    archive(value);
    if (archive.remaining() != 0) detail::throw_body_left_over(archive.remaining(), type_name<T>());
  } catch (const cereal::Exception& error) {
    detail::throw_body_invalid(type_name<T>(), error.what());
  }
  return value;
}

/// Deserializes a T from `body`, resolving tensors' handle indices through `storages`.
template <class T>
T read_body(std::span<const std::byte> body, std::span<const std::shared_ptr<Storage>> storages) {
  FrameInputArchive archive(body, storages);
  return read_body_with<T>(archive);
}

}  // namespace ferry
