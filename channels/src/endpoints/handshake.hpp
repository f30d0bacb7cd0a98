// The endpoint handshake: the bytes a client and a listener exchange over a new
// connection before any frame (docs/design/endpoints.md has the layout). The client sends
// a Hello (wire version, its end, the types it sends and receives, its transport, the
// limits it enforces on what it receives); the listener answers with one Reply (accepted,
// or refused and why), which carries, for a transport other than the connection itself,
// the client's ends of the new transport as SCM_RIGHTS descriptors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ferry/detail/deadline.hpp"
#include "ferry/detail/endpoint_core.hpp"
#include "ferry/detail/frame.hpp"
#include "ferry/detail/transport.hpp"
#include "ferry/detail/unique_fd.hpp"

namespace ferry::detail {

/// The version of the handshake and of what follows it; a listener and a client of
/// different versions refuse each other, naming both.
inline constexpr std::uint32_t kEndpointWireVersion = 1;
/// The first eight bytes of every Hello and Reply.
inline constexpr char kEndpointMagic[8] = {'f', 'e', 'r', 'r', 'y', '-', 'e', 'p'};
/// Magic, version and total length: what a reader needs before the rest.
inline constexpr std::size_t kHandshakePrefixBytes = 16;
/// A type name travels truncated to this many bytes (the fingerprint is what is checked).
inline constexpr std::size_t kMaxWireTypeName = 1024;
/// Hello: the prefix, then end, transport, 2 reserved bytes, the two fingerprints, the
/// six limits and the two name lengths; then the names.
inline constexpr std::size_t kHelloFixedBytes = kHandshakePrefixBytes + 4 + 16 + 28 + 8;
inline constexpr std::size_t kMaxHelloBytes = kHelloFixedBytes + 2 * kMaxWireTypeName;
/// Reply: the prefix, then status, transport, writer and reader descriptor counts, the
/// six limits and the message length; then the message.
inline constexpr std::size_t kReplyFixedBytes = kHandshakePrefixBytes + 4 + 28 + 4;
inline constexpr std::size_t kMaxReplyMessage = 4096;
inline constexpr std::size_t kMaxReplyBytes = kReplyFixedBytes + kMaxReplyMessage;
/// Descriptors a Reply may carry (two per ring or pipe end, and room for more).
inline constexpr std::size_t kMaxReplyFds = 16;

enum class ReplyStatus : std::uint8_t {
  Accepted = 0,
  VersionMismatch = 1,
  TypeMismatch = 2,
  NotAllowed = 3,
  TransportMismatch = 4,
  Malformed = 5,
  Unavailable = 6,  ///< the listener could not make the connection (out of descriptors ...)
};

struct Hello {
  std::uint32_t version = kEndpointWireVersion;
  EndKind kind;
  Transport transport = Transport::UnixSocket;
  FrameLimits limits;  ///< what the client enforces on what it receives
};

struct Reply {
  std::uint32_t version = kEndpointWireVersion;
  ReplyStatus status = ReplyStatus::Accepted;
  Transport transport = Transport::UnixSocket;
  std::uint8_t writer_fds = 0;  ///< descriptors of the client's writer, first
  std::uint8_t reader_fds = 0;  ///< then those of its reader
  FrameLimits limits;           ///< what the listener enforces on what it receives
  std::string message;          ///< why, when refused
};

std::vector<std::byte> encode_hello(const Hello& hello);
std::vector<std::byte> encode_reply(const Reply& reply);

/// What the prefix of a Hello or Reply says.
struct Prefix {
  bool magic_ok = false;
  std::uint32_t version = 0;
  std::uint32_t total_bytes = 0;
};
Prefix decode_prefix(const std::byte* bytes);

/// Decodes a whole Hello of the current version; throws ProtocolError naming what is wrong.
Hello decode_hello(const std::vector<std::byte>& bytes);
/// Decodes a whole Reply of the current version; throws ProtocolError naming what is wrong.
Reply decode_reply(const std::vector<std::byte>& bytes);

/// Receives at most `count` bytes without waiting, appending to `into` and any descriptors
/// that came with them to `fds` (close-on-exec). Returns the bytes read, 0 at end of
/// stream, or -1 when nothing is available (EAGAIN). Throws SystemError.
long receive_some(int fd, std::size_t count, std::vector<std::byte>& into, std::vector<UniqueFd>& fds);
/// Sends `bytes` (with `fds` on the first byte) without waiting; false when the peer is
/// gone or the socket cannot take it all at once.
bool send_now(int fd, const std::vector<std::byte>& bytes, const std::vector<int>& fds = {});
/// Sends all of `bytes`, waiting for room until `deadline`; false when it passed. Throws
/// PeerDied when the peer is gone.
bool send_all(int fd, const std::vector<std::byte>& bytes, const Deadline& deadline);
/// Reads one whole Hello or Reply (prefix first, then `total_bytes`, at most `max_bytes`)
/// until `deadline`: std::nullopt when it passed. Throws PeerDied at end of stream,
/// ProtocolError when the prefix is not a handshake.
std::optional<std::vector<std::byte>> receive_message(int fd, std::size_t max_bytes, std::vector<UniqueFd>& fds,
                                                      const Deadline& deadline);

}  // namespace ferry::detail
