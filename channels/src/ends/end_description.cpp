#include "ferry/end_description.hpp"

#include <fcntl.h>

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
    throw Error("cannot hand a " + name +
                " that has already " + (role == EndRole::Sender ? "sent" : "received") +
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
  description.shares_connection = end.shares_connection();
  description.options = core.options();
  return description;
}

// Checks the description against the end being rebuilt and takes its descriptors.
std::vector<UniqueFd> claim(const EndDescription& description, EndRole role, std::uint64_t fingerprint,
                            std::string_view type_name) {
  if (description.role != EndRole::Sender && description.role != EndRole::Receiver) {
    throw ProtocolError("a channel end description names no valid role");
  }
  if (description.role != role || description.type_fingerprint != fingerprint) {
    throw TypeMismatch(std::string("cannot rebuild a ") + role_name(role) + "<" + std::string(type_name) +
                       "> from the description of a " + role_name(description.role) + "<" + description.type_name +
                       ">");
  }
  std::vector<UniqueFd> fds;
  for (const int fd : description.fds) {
    const int flags = fd >= 0 ? ::fcntl(fd, F_GETFD) : -1;
    if (flags < 0) {
      throw Error("cannot rebuild a " + std::string(role_name(role)) + "<" + std::string(type_name) + ">: its fd " +
                  std::to_string(fd) + " is not open in this process (was it inherited?)");
    }
    fds.emplace_back(fd);
    // The end is ours now; programs we start later must not inherit it.
    if (::fcntl(fd, F_SETFD, flags | FD_CLOEXEC) != 0) throw_errno("fcntl(FD_CLOEXEC) on fd " + std::to_string(fd));
  }
  return fds;
}

}  // namespace

EndDescription describe_sender(SenderCore& core, std::uint64_t fingerprint, std::string_view type_name) {
  return describe(EndRole::Sender, core, core.writer(), fingerprint, type_name);
}

EndDescription describe_receiver(ReceiverCore& core, std::uint64_t fingerprint, std::string_view type_name) {
  return describe(EndRole::Receiver, core, core.reader(), fingerprint, type_name);
}

std::unique_ptr<SenderCore> rebuild_sender(const EndDescription& description, std::uint64_t fingerprint,
                                           std::string_view type_name) {
  std::vector<UniqueFd> fds = claim(description, EndRole::Sender, fingerprint, type_name);
  const ChannelOptions& options = description.options;
  return std::make_unique<SenderCore>(
      writer_from_descriptors(description.transport, std::move(fds), options.limits, options.ring_capacity,
                              options.ring_timing(), description.shares_connection),
      description.transport, options);
}

std::unique_ptr<ReceiverCore> rebuild_receiver(const EndDescription& description, std::uint64_t fingerprint,
                                               std::string_view type_name) {
  std::vector<UniqueFd> fds = claim(description, EndRole::Receiver, fingerprint, type_name);
  const ChannelOptions& options = description.options;
  return std::make_unique<ReceiverCore>(
      reader_from_descriptors(description.transport, std::move(fds), options.limits, options.ring_capacity,
                              options.ring_timing(), description.shares_connection),
      description.transport, fingerprint, type_name, options);
}

}  // namespace ferry::detail
