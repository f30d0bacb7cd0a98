// Reading a message of type T out of a received body: the one place where a body becomes a
// value, shared by MessageDecoder and the fuzz targets.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "ferry/detail/archive.hpp"
#include "ferry/detail/erased_body.hpp"

namespace ferry {
class Storage;
}  // namespace ferry

namespace ferry::detail {

/// Reads a message of `type` into `out` (a default-constructed value of it) from what
/// `archive` reads (a FrameInputArchive over a whole body and its storages). Every way a body
/// can lie is a ProtocolError: short reads, bytes left over, invalid tensors, and cereal's own
/// errors (a std::variant index out of range, ...), which cereal raises as cereal::Exception
/// and which are converted here. Compiled once, in the library (MessageDecoder::read uses it).
void read_message(FrameInputArchive& archive, void* out, const ReceivedType& type);

/// read_message() for a T, returned.
template <class T>
T read_body_with(FrameInputArchive& archive) {
  T value{};
  read_message(archive, &value, received_type<T>);
  return value;
}

/// Deserializes a T from `body`, resolving tensors' handle indices through `storages`.
template <class T>
T read_body(std::span<const std::byte> body, std::span<const std::shared_ptr<Storage>> storages) {
  FrameInputArchive archive(body, storages);
  return read_body_with<T>(archive);
}

}  // namespace ferry::detail
