// Transport::InProcess: a channel between threads of one process. Values of T travel in
// parcels through an in-process queue (channels/src/ends/in_process_queue.hpp), never
// serialized; tensors inside them are the very same objects on both sides.
#pragma once

#include <memory>
#include <utility>

namespace ferry::detail {

/// A value of some type on its way through an in-process channel.
class Parcel {
 public:
  virtual ~Parcel() = default;
};

/// A value of T on its way through an in-process channel.
template <class T>
class ParcelOf final : public Parcel {
 public:
  explicit ParcelOf(T&& moved) : value(std::move(moved)) {}
  T value;
};

/// The parcel for a T moved from `value` (see MakeParcel in channel_ends.hpp).
template <class T>
std::unique_ptr<Parcel> make_parcel(void* value) {
  return std::unique_ptr<Parcel>(new ParcelOf<T>(std::move(*static_cast<T*>(value))));
}

}  // namespace ferry::detail
