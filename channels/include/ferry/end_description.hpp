// Describing a channel end so that a process started by exec can rebuild it from the
// descriptors it inherited (ferry::spawn with StartMethod::Spawn does this for every end
// it hands to a worker).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include "ferry/channel.hpp"

namespace ferry {

/// Which end of a channel a description is of.
enum class EndRole : std::uint8_t { Sender = 1, Receiver = 2 };

/// One channel end as plain data: its transport, the numbers of its descriptors (which
/// the new process inherits at the same numbers), its options and its message type. A
/// cereal-serializable value; the descriptors themselves must reach the other process by
/// inheritance (fork + exec with FD_CLOEXEC cleared on exactly these). A pool
/// (ChannelOptions::pool) cannot cross processes: an isolated end is rebuilt with a new,
/// private pool of the same settings, so it stays isolated.
struct EndDescription {
  EndRole role = EndRole::Sender;
  Transport transport = Transport::Pipe;
  std::uint64_t type_fingerprint = 0;
  std::string type_name;
  std::vector<std::int32_t> fds;   ///< FrameWriter/FrameReader::descriptors(), in order
  bool shares_connection = false;  ///< a duplex socket's end (FrameWriter::shares_connection())
  ChannelOptions options;

  // Out of line (end_description.cpp): a program that spawns does not compile them.
  EndDescription();
  EndDescription(const EndDescription&);
  EndDescription(EndDescription&&) noexcept;
  EndDescription& operator=(const EndDescription&);
  EndDescription& operator=(EndDescription&&) noexcept;
  ~EndDescription();

  /// ferry's own archives (FrameOutputArchive, FrameInputArchive) are compiled once, in
  /// the library (declared below); other cereal archives use the template.
  template <class Archive>
  void serialize(Archive& ar) {
    serialize_fields(ar);
  }

 private:
  template <class Archive>
  void serialize_fields(Archive& ar) {
    auto linger = static_cast<std::int64_t>(options.close_linger.count());
    auto ring = static_cast<std::uint64_t>(options.ring_capacity);
    auto spin = static_cast<std::int64_t>(options.ring_spin.count());
    auto peer_check = static_cast<std::int64_t>(options.peer_check_interval.count());
    bool isolated = options.pool.has_value();
    const SharedAllocatorSettings pool_settings = isolated ? options.pool->settings() : SharedAllocatorSettings{};
    auto pool_segment_bytes = static_cast<std::uint64_t>(pool_settings.segment_bytes);
    auto pool_cached_bytes = static_cast<std::uint64_t>(pool_settings.max_cached_bytes);
    ar(role, transport, type_fingerprint, type_name, fds, shares_connection, options.limits.max_body_bytes,
       options.limits.max_handles, options.limits.max_segments, options.limits.max_fds, options.limits.max_releases,
       options.limits.max_type_name_bytes, ring, spin, peer_check, linger, isolated, pool_segment_bytes,
       pool_cached_bytes);
    options.close_linger = std::chrono::milliseconds(linger);
    options.ring_capacity = static_cast<std::size_t>(ring);
    options.ring_spin = std::chrono::nanoseconds(spin);
    options.peer_check_interval = std::chrono::milliseconds(peer_check);
    if (isolated && !options.pool) {  // loading: a new pool of the same settings
      SharedAllocatorSettings settings;
      settings.segment_bytes = static_cast<std::size_t>(pool_segment_bytes);
      settings.max_cached_bytes = static_cast<std::size_t>(pool_cached_bytes);
      options.pool.emplace(settings);
    }
  }
};

template <>
void EndDescription::serialize(detail::FrameOutputArchive& ar);
template <>
void EndDescription::serialize(detail::FrameInputArchive& ar);

namespace detail {
// The untyped halves of describe_end / sender_from_description / receiver_from_description:
// `fingerprint` and `type_name` are those of the end's message type.
EndDescription describe_sender(SenderCore& core, std::uint64_t fingerprint, std::string_view type_name);
EndDescription describe_receiver(ReceiverCore& core, std::uint64_t fingerprint, std::string_view type_name);
SenderEnd rebuild_sender(const EndDescription& description, std::uint64_t fingerprint, std::string_view type_name);
ReceiverEnd rebuild_receiver(const EndDescription& description, std::uint64_t fingerprint, std::string_view type_name);
}  // namespace detail

namespace detail {
/// Throws Error for describing an InProcess end: `role` "Sender" or "Receiver", `type` its T.
[[noreturn]] void throw_in_process_not_describable(std::string_view role, std::string_view type);
}  // namespace detail

/// Describes `sender` (which must be open). The description does not own anything: the
/// Sender keeps its descriptors until it is detached or closed. Throws Error for an
/// InProcess Sender, which cannot reach another process.
template <class T>
EndDescription describe_end(Sender<T>& sender) {
  if (sender.transport() == Transport::InProcess && sender.is_open()) {
    detail::throw_in_process_not_describable("Sender", detail::type_name<T>());
  }
  return detail::describe_sender(detail::EndAccess::core(sender), detail::type_fingerprint<T>(),
                                 detail::type_name<T>());
}

/// Describes `receiver` (which must be open; see describe_end(Sender<T>&)).
template <class T>
EndDescription describe_end(Receiver<T>& receiver) {
  if (receiver.transport() == Transport::InProcess && receiver.is_open()) {
    detail::throw_in_process_not_describable("Receiver", detail::type_name<T>());
  }
  return detail::describe_receiver(detail::EndAccess::core(receiver), detail::type_fingerprint<T>(),
                                   detail::type_name<T>());
}

/// Rebuilds a Sender<T> from `description` in a process that inherited its descriptors;
/// takes ownership of them (and marks them close-on-exec again), also when it throws: a
/// refused description's descriptors are closed. The calling process becomes the end's
/// owner. Throws TypeMismatch when the description is of another type or of a receiver,
/// Error when a descriptor is not open or the transport cannot cross processes,
/// ProtocolError when the descriptors do not fit the transport.
template <class T>
Sender<T> sender_from_description(const EndDescription& description) {
  return Sender<T>(detail::rebuild_sender(description, detail::type_fingerprint<T>(), detail::type_name<T>()));
}

/// Rebuilds a Receiver<T> from `description` (see sender_from_description).
template <class T>
Receiver<T> receiver_from_description(const EndDescription& description) {
  return Receiver<T>(detail::rebuild_receiver(description, detail::type_fingerprint<T>(), detail::type_name<T>()));
}

}  // namespace ferry
