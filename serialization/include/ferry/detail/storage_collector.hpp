// An output archive that writes nothing: it collects the storages of the tensors a value
// holds (spawn() keeps those of a forked worker's arguments alive until the worker exits).
#pragma once

#include <cereal/cereal.hpp>

#include <memory>
#include <type_traits>
#include <vector>

#include "ferry/tensor.hpp"

namespace ferry::detail {

class StorageCollector;

/// True when StorageCollector can walk a value of type T (for cereal::base_class<B>: B).
template <class T>
struct Walkable : cereal::traits::is_output_serializable<T, StorageCollector> {};
template <class B>
struct Walkable<cereal::base_class<B>> : cereal::traits::is_output_serializable<B, StorageCollector> {};
template <class B>
struct Walkable<cereal::virtual_base_class<B>> : cereal::traits::is_output_serializable<B, StorageCollector> {};

/// A cereal output archive that serializes nothing and remembers the storage of every tensor
/// it meets, through whatever serialize()/save() the value's types have. Values cereal cannot
/// save (an element of a std::vector<std::function<...>>, say) are passed over: they hold no
/// tensor it could find.
class StorageCollector : public cereal::OutputArchive<StorageCollector, cereal::AllowEmptyClassElision> {
 public:
  StorageCollector();  // out of line (archive.cpp), as FrameOutputArchive's
  ~StorageCollector() override;
  /// Walks `values` (what serialize()/save() functions call on their archive).
  template <class... T>
  StorageCollector& operator()(T&&... values) {
    (visit(values), ...);
    return *this;
  }
  /// Remembers `tensor`'s storage (none for an empty tensor).
  void add(const Tensor& tensor) {
    if (tensor.storage()) storages_.push_back(tensor.storage());
  }
  /// The storages met so far, in order (a storage met twice is there twice).
  std::vector<std::shared_ptr<Storage>>& storages() noexcept { return storages_; }
  /// The same storages as owners to keep alive (spawn() keeps a forked worker's until it
  /// exits); out of line, so that a program does not compile the conversion.
  std::vector<std::shared_ptr<const void>> owners() const;

 private:
  template <class T>
  void visit(const T& value) {
    // cereal's containers are templates that save any element type: without this check, a
    // container of a type with no save function would not compile here.
    if constexpr (detail::Walkable<T>::value) {
      OutputArchive::operator()(value);
    }
  }

  std::vector<std::shared_ptr<Storage>> storages_;
};

inline void save(StorageCollector& collector, const Tensor& tensor) { collector.add(tensor); }

}  // namespace ferry::detail

CEREAL_REGISTER_ARCHIVE(ferry::detail::StorageCollector)

// What cereal's containers reduce to: nothing to collect there.
namespace cereal {

template <class T>
inline std::enable_if_t<std::is_arithmetic_v<T>> CEREAL_SAVE_FUNCTION_NAME(ferry::detail::StorageCollector&, const T&) {
}

template <class T>
inline void CEREAL_SAVE_FUNCTION_NAME(ferry::detail::StorageCollector& collector, const NameValuePair<T>& pair) {
  collector(pair.value);
}

template <class T>
inline void CEREAL_SAVE_FUNCTION_NAME(ferry::detail::StorageCollector&, const SizeTag<T>&) {}

template <class T>
inline void CEREAL_SAVE_FUNCTION_NAME(ferry::detail::StorageCollector&, const BinaryData<T>&) {}

}  // namespace cereal
