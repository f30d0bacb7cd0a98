// An output archive that writes nothing: it collects the storages of the tensors a value
// holds (spawn() keeps those of a forked worker's arguments alive until the worker exits).
#pragma once

#include <cereal/cereal.hpp>

#include <memory>
#include <type_traits>
#include <vector>

#include "ferry/tensor.hpp"

namespace ferry {

/// A cereal output archive that serializes nothing and remembers the storage of every tensor
/// it meets, through whatever serialize()/save() the value's types have.
class StorageCollector : public cereal::OutputArchive<StorageCollector, cereal::AllowEmptyClassElision> {
 public:
  StorageCollector() : OutputArchive(this) {}
  /// Remembers `tensor`'s storage (none for an empty tensor).
  void add(const Tensor& tensor) {
    if (tensor.storage()) storages_.push_back(tensor.storage());
  }
  /// The storages met so far, in order (a storage met twice is there twice).
  std::vector<std::shared_ptr<Storage>>& storages() noexcept { return storages_; }

 private:
  std::vector<std::shared_ptr<Storage>> storages_;
};

inline void save(StorageCollector& collector, const Tensor& tensor) { collector.add(tensor); }

/// True when StorageCollector can walk a value of type T.
template <class T>
inline constexpr bool collectable = cereal::traits::is_output_serializable<T, StorageCollector>::value;

}  // namespace ferry

CEREAL_REGISTER_ARCHIVE(ferry::StorageCollector)

// What cereal's containers reduce to: nothing to collect there.
namespace cereal {

template <class T>
inline std::enable_if_t<std::is_arithmetic_v<T>> CEREAL_SAVE_FUNCTION_NAME(ferry::StorageCollector&, const T&) {}

template <class T>
inline void CEREAL_SAVE_FUNCTION_NAME(ferry::StorageCollector& collector, const NameValuePair<T>& pair) {
  collector(pair.value);
}

template <class T>
inline void CEREAL_SAVE_FUNCTION_NAME(ferry::StorageCollector&, const SizeTag<T>&) {}

template <class T>
inline void CEREAL_SAVE_FUNCTION_NAME(ferry::StorageCollector&, const BinaryData<T>&) {}

}  // namespace cereal
