#include "ferry/detail/archive.hpp"
#include "ferry/detail/storage_collector.hpp"

#include <functional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#if __has_include(<cereal/version.hpp>)
#include <cereal/version.hpp>
#endif

namespace ferry {
namespace {

// Read access to cereal's private per-archive state, for reusable(). The one standard way to
// name a private member outside its class is an explicit instantiation (access is not
// checked there): it stores a pointer to the member where a friend function finds it. Only
// for the cereal version whose members are listed here; with another, archives are never
// reused (one per frame, as before).
#if defined(CEREAL_VERSION) && CEREAL_VERSION == 10302
#define FERRY_KNOWN_CEREAL 1

template <class Tag, typename Tag::type Member>
struct CerealMember {
  friend typename Tag::type member_of(Tag) noexcept { return Member; }
};

using Out = cereal::OutputArchive<detail::FrameOutputArchive, cereal::AllowEmptyClassElision>;
using In = cereal::InputArchive<detail::FrameInputArchive, cereal::AllowEmptyClassElision>;
using BaseClassSet =
    std::unordered_set<cereal::traits::detail::base_class_id, cereal::traits::detail::base_class_id_hash>;
using Deferments = std::vector<std::function<void(void)>>;

struct OutBases {
  using type = BaseClassSet Out::*;
  friend type member_of(OutBases) noexcept;
};
struct OutPointers {
  using type = std::unordered_map<void const*, std::uint32_t> Out::*;
  friend type member_of(OutPointers) noexcept;
};
struct OutPointerStorage {
  using type = std::vector<std::shared_ptr<const void>> Out::*;
  friend type member_of(OutPointerStorage) noexcept;
};
struct OutPolymorphic {
  using type = std::unordered_map<char const*, std::uint32_t> Out::*;
  friend type member_of(OutPolymorphic) noexcept;
};
struct OutVersions {
  using type = std::unordered_set<cereal::size_type> Out::*;
  friend type member_of(OutVersions) noexcept;
};
struct OutDeferments {
  using type = Deferments Out::*;
  friend type member_of(OutDeferments) noexcept;
};
template struct CerealMember<OutBases, &Out::itsBaseClassSet>;
template struct CerealMember<OutPointers, &Out::itsSharedPointerMap>;
template struct CerealMember<OutPointerStorage, &Out::itsSharedPointerStorage>;
template struct CerealMember<OutPolymorphic, &Out::itsPolymorphicTypeMap>;
template struct CerealMember<OutVersions, &Out::itsVersionedTypes>;
template struct CerealMember<OutDeferments, &Out::itsDeferments>;

struct InBases {
  using type = BaseClassSet In::*;
  friend type member_of(InBases) noexcept;
};
struct InPointers {
  using type = std::unordered_map<std::uint32_t, std::shared_ptr<void>> In::*;
  friend type member_of(InPointers) noexcept;
};
struct InPolymorphic {
  using type = std::unordered_map<std::uint32_t, std::string> In::*;
  friend type member_of(InPolymorphic) noexcept;
};
struct InVersions {
  using type = std::unordered_map<std::size_t, std::uint32_t> In::*;
  friend type member_of(InVersions) noexcept;
};
struct InDeferments {
  using type = Deferments In::*;
  friend type member_of(InDeferments) noexcept;
};
template struct CerealMember<InBases, &In::itsBaseClassSet>;
template struct CerealMember<InPointers, &In::itsSharedPointerMap>;
template struct CerealMember<InPolymorphic, &In::itsPolymorphicTypeMap>;
template struct CerealMember<InVersions, &In::itsVersionedTypes>;
template struct CerealMember<InDeferments, &In::itsDeferments>;
#endif

}  // namespace

detail::FrameOutputArchive::FrameOutputArchive(detail::FrameBody& body, detail::MessageEncoder& encoder)
    : OutputArchive(this), body_(body), encoder_(encoder) {}
detail::FrameOutputArchive::~FrameOutputArchive() = default;

detail::FrameInputArchive::FrameInputArchive(std::span<const std::byte> body,
                                             std::span<const std::shared_ptr<Storage>> storages)
    : InputArchive(this), body_(body), storages_(storages), ready_(body.size()) {}
detail::FrameInputArchive::~FrameInputArchive() = default;

detail::StorageCollector::StorageCollector() : OutputArchive(this) {}
detail::StorageCollector::~StorageCollector() = default;

std::vector<std::shared_ptr<const void>> detail::StorageCollector::owners() const {
  return {storages_.begin(), storages_.end()};
}

bool detail::FrameOutputArchive::reusable() const noexcept {
#ifdef FERRY_KNOWN_CEREAL
  const Out& base = *this;
  return (base.*member_of(OutBases{})).empty() && (base.*member_of(OutPointers{})).empty() &&
         (base.*member_of(OutPointerStorage{})).empty() && (base.*member_of(OutPolymorphic{})).empty() &&
         (base.*member_of(OutVersions{})).empty() && (base.*member_of(OutDeferments{})).empty();
#else
  return false;
#endif
}

bool detail::FrameInputArchive::reusable() const noexcept {
#ifdef FERRY_KNOWN_CEREAL
  const In& base = *this;
  return (base.*member_of(InBases{})).empty() && (base.*member_of(InPointers{})).empty() &&
         (base.*member_of(InPolymorphic{})).empty() && (base.*member_of(InVersions{})).empty() &&
         (base.*member_of(InDeferments{})).empty();
#else
  return false;
#endif
}

void detail::FrameInputArchive::throw_truncated(std::uint64_t count, std::size_t element_size) const {
  throw ProtocolError("message body is truncated: needed " + std::to_string(count) +
                      (element_size == 1 ? " bytes" : " elements of " + std::to_string(element_size) + " bytes") +
                      " at offset " + std::to_string(position_) + " of " + std::to_string(body_.size()));
}

namespace detail {

void throw_container_size_above_body(std::uint64_t size, std::size_t remaining) {
  throw ProtocolError("message body holds a container size of " + std::to_string(size) + " elements but only " +
                      std::to_string(remaining) + " bytes remain");
}

}  // namespace detail

}  // namespace ferry
