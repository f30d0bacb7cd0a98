#include "endpoints/handshake.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "ferry/error.hpp"
#include "transport/scm_rights.hpp"

namespace ferry::detail {
namespace {

class ByteWriter {
 public:
  template <class V>
  void put(V value) {
    const auto* raw = reinterpret_cast<const std::byte*>(&value);
    bytes_.insert(bytes_.end(), raw, raw + sizeof value);
  }
  void put_text(const std::string& text) {
    const auto* raw = reinterpret_cast<const std::byte*>(text.data());
    bytes_.insert(bytes_.end(), raw, raw + text.size());
  }
  void put_limits(const FrameLimits& limits) {
    put(limits.max_body_bytes);
    put(limits.max_handles);
    put(limits.max_segments);
    put(limits.max_fds);
    put(limits.max_releases);
    put(limits.max_type_name_bytes);
  }
  // Writes the magic and version, and reserves the total length (set by finish()).
  void begin() {
    const auto* magic = reinterpret_cast<const std::byte*>(kEndpointMagic);
    bytes_.insert(bytes_.end(), magic, magic + sizeof kEndpointMagic);
    put(kEndpointWireVersion);
    put(std::uint32_t{0});
  }
  std::vector<std::byte> finish() && {
    const auto total = static_cast<std::uint32_t>(bytes_.size());
    std::memcpy(bytes_.data() + 12, &total, sizeof total);
    return std::move(bytes_);
  }

 private:
  std::vector<std::byte> bytes_;
};

class ByteReader {
 public:
  ByteReader(const std::vector<std::byte>& bytes, const char* what) : bytes_(bytes), what_(what) {}
  template <class V>
  V get() {
    V value{};
    need(sizeof value);
    std::memcpy(&value, bytes_.data() + at_, sizeof value);
    at_ += sizeof value;
    return value;
  }
  std::string get_text(std::size_t size) {
    need(size);
    std::string text(reinterpret_cast<const char*>(bytes_.data() + at_), size);
    at_ += size;
    return text;
  }
  FrameLimits get_limits() {
    FrameLimits limits;
    limits.max_body_bytes = get<std::uint64_t>();
    limits.max_handles = get<std::uint32_t>();
    limits.max_segments = get<std::uint32_t>();
    limits.max_fds = get<std::uint32_t>();
    limits.max_releases = get<std::uint32_t>();
    limits.max_type_name_bytes = get<std::uint32_t>();
    return limits;
  }
  void skip(std::size_t count) {
    need(count);
    at_ += count;
  }
  void expect_end() const {
    if (at_ != bytes_.size()) {
      throw ProtocolError(std::string("an endpoint ") + what_ + " has " + std::to_string(bytes_.size() - at_) +
                          " bytes more than its fields");
    }
  }

 private:
  void need(std::size_t count) const {
    if (bytes_.size() - at_ < count) throw ProtocolError(std::string("an endpoint ") + what_ + " is truncated");
  }
  const std::vector<std::byte>& bytes_;
  const char* what_;
  std::size_t at_ = 0;
};

std::string clipped(const std::string& text, std::size_t most) {
  return text.size() <= most ? text : text.substr(0, most);
}

Transport checked_transport(std::uint8_t raw, const char* what) {
  if (raw > static_cast<std::uint8_t>(Transport::InProcess)) {
    throw ProtocolError(std::string("an endpoint ") + what + " names no valid transport (" + std::to_string(raw) + ")");
  }
  return static_cast<Transport>(raw);
}

}  // namespace

std::vector<std::byte> encode_hello(const Hello& hello) {
  const std::string sends_name = clipped(hello.kind.sends_name, kMaxWireTypeName);
  const std::string receives_name = clipped(hello.kind.receives_name, kMaxWireTypeName);
  ByteWriter out;
  out.begin();
  out.put(static_cast<std::uint8_t>(hello.kind.end));
  out.put(static_cast<std::uint8_t>(hello.transport));
  out.put(std::uint16_t{0});
  out.put(hello.kind.sends);
  out.put(hello.kind.receives);
  out.put_limits(hello.limits);
  out.put(static_cast<std::uint32_t>(sends_name.size()));
  out.put(static_cast<std::uint32_t>(receives_name.size()));
  out.put_text(sends_name);
  out.put_text(receives_name);
  return std::move(out).finish();
}

std::vector<std::byte> encode_reply(const Reply& reply) {
  const std::string message = clipped(reply.message, kMaxReplyMessage);
  ByteWriter out;
  out.begin();
  out.put(static_cast<std::uint8_t>(reply.status));
  out.put(static_cast<std::uint8_t>(reply.transport));
  out.put(reply.writer_fds);
  out.put(reply.reader_fds);
  out.put_limits(reply.limits);
  out.put(static_cast<std::uint32_t>(message.size()));
  out.put_text(message);
  return std::move(out).finish();
}

Prefix decode_prefix(const std::byte* bytes) {
  Prefix prefix;
  prefix.magic_ok = std::memcmp(bytes, kEndpointMagic, sizeof kEndpointMagic) == 0;
  std::memcpy(&prefix.version, bytes + 8, sizeof prefix.version);
  std::memcpy(&prefix.total_bytes, bytes + 12, sizeof prefix.total_bytes);
  return prefix;
}

Hello decode_hello(const std::vector<std::byte>& bytes) {
  ByteReader in(bytes, "hello");
  in.skip(kHandshakePrefixBytes);
  Hello hello;
  const auto end = in.get<std::uint8_t>();
  if (end < 1 || end > 3) throw ProtocolError("an endpoint hello names no valid end (" + std::to_string(end) + ")");
  hello.kind.end = static_cast<ClientEnd>(end);
  hello.transport = checked_transport(in.get<std::uint8_t>(), "hello");
  in.skip(2);
  hello.kind.sends = in.get<std::uint64_t>();
  hello.kind.receives = in.get<std::uint64_t>();
  hello.limits = in.get_limits();
  const auto sends_size = in.get<std::uint32_t>();
  const auto receives_size = in.get<std::uint32_t>();
  if (sends_size > kMaxWireTypeName || receives_size > kMaxWireTypeName) {
    throw ProtocolError("an endpoint hello has a type name longer than " + std::to_string(kMaxWireTypeName) + " bytes");
  }
  hello.kind.sends_name = in.get_text(sends_size);
  hello.kind.receives_name = in.get_text(receives_size);
  in.expect_end();
  const bool sends = hello.kind.end != ClientEnd::Receiver;
  const bool receives = hello.kind.end != ClientEnd::Sender;
  if ((hello.kind.sends != 0) != sends || (hello.kind.receives != 0) != receives) {
    throw ProtocolError("an endpoint hello's type fingerprints do not fit its end");
  }
  return hello;
}

Reply decode_reply(const std::vector<std::byte>& bytes) {
  ByteReader in(bytes, "reply");
  in.skip(kHandshakePrefixBytes);
  Reply reply;
  const auto status = in.get<std::uint8_t>();
  if (status > static_cast<std::uint8_t>(ReplyStatus::Unavailable)) {
    throw ProtocolError("an endpoint reply names no valid status (" + std::to_string(status) + ")");
  }
  reply.status = static_cast<ReplyStatus>(status);
  reply.transport = checked_transport(in.get<std::uint8_t>(), "reply");
  reply.writer_fds = in.get<std::uint8_t>();
  reply.reader_fds = in.get<std::uint8_t>();
  reply.limits = in.get_limits();
  const auto message_size = in.get<std::uint32_t>();
  if (message_size > kMaxReplyMessage) throw ProtocolError("an endpoint reply's message is too long");
  reply.message = in.get_text(message_size);
  in.expect_end();
  return reply;
}

long receive_some(int fd, std::size_t count, std::vector<std::byte>& into, std::vector<UniqueFd>& fds) {
  const std::size_t old_size = into.size();
  into.resize(old_size + count);
  iovec part{into.data() + old_size, count};
  alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * kMaxReplyFds)> control{};
  msghdr message{};
  message.msg_iov = &part;
  message.msg_iovlen = 1;
  message.msg_control = control.data();
  message.msg_controllen = control.size();
  ssize_t got = 0;
  while ((got = ::recvmsg(fd, &message, MSG_DONTWAIT | MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
  }
  const int error = errno;
  into.resize(old_size + (got > 0 ? static_cast<std::size_t>(got) : 0));
  if (got >= 0) take_fds(message, fds);
  if (got < 0) {
    if (error == EAGAIN) return -1;
    if (error == ECONNRESET) return 0;
    throw_system_error("recvmsg on an endpoint connection", error);
  }
  if ((message.msg_flags & MSG_CTRUNC) != 0) {
    throw ProtocolError("an endpoint handshake came with more descriptors than it may carry (" +
                        std::to_string(kMaxReplyFds) + ")");
  }
  return static_cast<long>(got);
}

bool send_now(int fd, const std::vector<std::byte>& bytes, const std::vector<int>& fds) {
  iovec part{const_cast<std::byte*>(bytes.data()), bytes.size()};
  alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * kMaxReplyFds)> control{};
  msghdr message{};
  message.msg_iov = &part;
  message.msg_iovlen = 1;
  if (!fds.empty()) {
    if (fds.size() > kMaxReplyFds)
      throw Error("an endpoint reply cannot carry " + std::to_string(fds.size()) + " descriptors");
    attach_fds(message, control, fds);
  }
  ssize_t sent = 0;
  while ((sent = ::sendmsg(fd, &message, MSG_DONTWAIT | MSG_NOSIGNAL)) < 0 && errno == EINTR) {
  }
  return sent == static_cast<ssize_t>(bytes.size());
}

bool send_all(int fd, const std::vector<std::byte>& bytes, const Deadline& deadline) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t sent = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent >= 0) {
      done += static_cast<std::size_t>(sent);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EPIPE || errno == ECONNRESET)
      throw PeerDied("the listener closed the connection during the handshake");
    if (errno != EAGAIN) throw_errno("send on an endpoint connection");
    if (!wait_for_fd(fd, POLLOUT, deadline, nullptr)) return false;
  }
  return true;
}

std::optional<std::vector<std::byte>> receive_message(int fd, std::size_t max_bytes, std::vector<UniqueFd>& fds,
                                                      const Deadline& deadline) {
  std::vector<std::byte> bytes;
  std::size_t wanted = kHandshakePrefixBytes;
  while (bytes.size() < wanted) {
    const long got = receive_some(fd, wanted - bytes.size(), bytes, fds);
    if (got == 0) throw PeerDied("the connection ended during the handshake");
    if (got < 0 && !wait_for_fd(fd, POLLIN, deadline, nullptr)) return std::nullopt;
    if (wanted == kHandshakePrefixBytes && bytes.size() == kHandshakePrefixBytes) {
      const Prefix prefix = decode_prefix(bytes.data());
      if (!prefix.magic_ok) throw ProtocolError("the peer does not speak ferry's endpoint handshake (bad magic)");
      if (prefix.version != kEndpointWireVersion) return bytes;  // the caller names both versions
      if (prefix.total_bytes < kHandshakePrefixBytes || prefix.total_bytes > max_bytes) {
        throw ProtocolError("an endpoint handshake message claims " + std::to_string(prefix.total_bytes) +
                            " bytes (at most " + std::to_string(max_bytes) + ")");
      }
      wanted = prefix.total_bytes;
    }
  }
  return bytes;
}

}  // namespace ferry::detail
