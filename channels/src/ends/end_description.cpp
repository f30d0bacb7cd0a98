#include "ferry/end_description.hpp"

#include <fcntl.h>

#include <algorithm>
#include <optional>
#include <string>

#include "ferry/detail/frame_channel.hpp"

namespace ferry {

EndDescription::EndDescription() = default;
EndDescription::EndDescription(const EndDescription&) = default;
EndDescription::EndDescription(EndDescription&&) noexcept = default;
EndDescription& EndDescription::operator=(const EndDescription&) = default;
EndDescription& EndDescription::operator=(EndDescription&&) noexcept = default;
EndDescription::~EndDescription() = default;

// Compiled here once, instead of in every program that spawns workers by exec.
template <>
void EndDescription::serialize(detail::FrameOutputArchive& ar) {
  serialize_fields(ar);
}
template <>
void EndDescription::serialize(detail::FrameInputArchive& ar) {
  serialize_fields(ar);
}

}  // namespace ferry

namespace ferry::detail {
namespace {

const char* role_name(EndRole role) { return role == EndRole::Sender ? "Sender" : "Receiver"; }

// `core` is a SenderCore or ReceiverCore, `end` its FrameWriter or FrameReader.
template <class Core, class End>
EndDescription describe(EndRole role, Core& core, const End& end, std::uint64_t fingerprint,
                        std::string_view type_name) {
  const std::string name = std::string(role_name(role)) + "<" + std::string(type_name) + ">";
  if (!core.is_open()) {
    throw ChannelClosed("cannot describe a closed " + name + ": only an open end can be handed to another process");
  }
  if (core.used()) {
    throw Error("cannot hand a " + name + " that has already " + (role == EndRole::Sender ? "sent" : "received") +
                " to a process started by exec: its protocol state (leases, buffered bytes) lives in this process; "
                "hand over a fresh end, or use the fork start method");
  }
  EndDescription description;
  description.role = role;
  description.transport = core.transport();
  description.type_fingerprint = fingerprint;
  description.type_name = std::string(type_name);
  const std::vector<int> fds = end.descriptors();
  description.fds.assign(fds.begin(), fds.end());
  description.shares_connection = end.capabilities().shares_connection;
  description.options = core.options();
  return description;
}

// Takes every descriptor of `description` that is open in this process, in order (the
// call owns them whatever happens next); throws Error for one that is not open and
// ProtocolError for one named twice, after taking the others, so that they are closed.
std::vector<detail::UniqueFd> take_descriptors(const EndDescription& description, const std::string& name) {
  std::vector<detail::UniqueFd> fds;
  fds.reserve(description.fds.size());
  std::optional<int> missing;
  std::optional<int> repeated;
  for (const int fd : description.fds) {
    if (std::find_if(fds.begin(), fds.end(), [fd](const detail::UniqueFd& taken) { return taken.get() == fd; }) !=
        fds.end()) {
      repeated = repeated.value_or(fd);
    } else if (fd >= 0 && ::fcntl(fd, F_GETFD) >= 0) {
      fds.emplace_back(fd);
    } else {
      missing = missing.value_or(fd);
    }
  }
  if (missing) {
    throw Error("cannot rebuild a " + name + ": its fd " + std::to_string(*missing) +
                " is not open in this process (was it inherited?); its other descriptors were closed");
  }
  if (repeated) {
    throw ProtocolError("cannot rebuild a " + name + ": its description names fd " + std::to_string(*repeated) +
                        " twice; its descriptors were closed");
  }
  return fds;
}

// Takes the description's descriptors (closed again if anything below throws), checks the
// description against the end being rebuilt, and marks the descriptors close-on-exec.
std::vector<detail::UniqueFd> claim(const EndDescription& description, EndRole role, std::uint64_t fingerprint,
                                    std::string_view type_name) {
  const std::string name = std::string(role_name(role)) + "<" + std::string(type_name) + ">";
  std::vector<detail::UniqueFd> fds = take_descriptors(description, name);
  if (description.role != EndRole::Sender && description.role != EndRole::Receiver) {
    throw ProtocolError("a channel end description names no valid role; its descriptors were closed");
  }
  if (description.role != role || description.type_fingerprint != fingerprint) {
    throw TypeMismatch("cannot rebuild a " + name + " from the description of a " + role_name(description.role) + "<" +
                       description.type_name + ">; its descriptors were closed");
  }
  for (const detail::UniqueFd& fd : fds) {
    // The end is ours now; programs we start later must not inherit it.
    const int flags = ::fcntl(fd.get(), F_GETFD);
    if (flags < 0 || ::fcntl(fd.get(), F_SETFD, flags | FD_CLOEXEC) != 0) {
      throw_errno("fcntl(FD_CLOEXEC) on fd " + std::to_string(fd.get()));
    }
  }
  return fds;
}

}  // namespace

void throw_in_process_not_describable(std::string_view role, std::string_view type) {
  throw Error("cannot describe an InProcess " + std::string(role) + "<" + std::string(type) + ">" +
              " for another process: an in-process channel's values never leave this process; create the channel "
              "with Transport::Pipe, UnixSocket or ShmRing to hand an end to another process");
}

EndDescription describe_sender(SenderCore& core, std::uint64_t fingerprint, std::string_view type_name) {
  return describe(EndRole::Sender, core, core.writer(), fingerprint, type_name);
}

EndDescription describe_receiver(ReceiverCore& core, std::uint64_t fingerprint, std::string_view type_name) {
  return describe(EndRole::Receiver, core, core.reader(), fingerprint, type_name);
}

SenderEnd rebuild_sender(const EndDescription& description, std::uint64_t fingerprint, std::string_view type_name) {
  std::vector<detail::UniqueFd> fds = claim(description, EndRole::Sender, fingerprint, type_name);
  const ChannelOptions& options = description.options;
  return SenderEnd(std::make_unique<SenderCore>(
      detail::writer_from_descriptors(description.transport, std::move(fds), options.limits, options.ring_capacity,
                                      options.ring_timing(), description.shares_connection),
      description.transport, options));
}

ReceiverEnd rebuild_receiver(const EndDescription& description, std::uint64_t fingerprint, std::string_view type_name) {
  std::vector<detail::UniqueFd> fds = claim(description, EndRole::Receiver, fingerprint, type_name);
  const ChannelOptions& options = description.options;
  return ReceiverEnd(std::make_unique<ReceiverCore>(
      detail::reader_from_descriptors(description.transport, std::move(fds), options.limits, options.ring_capacity,
                                      options.ring_timing(), description.shares_connection),
      description.transport, fingerprint, type_name, options));
}

}  // namespace ferry::detail
