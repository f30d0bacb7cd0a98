#include "ferry/spawn.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <vector>

#include "ferry/detail/message_decoder.hpp"
#include "ferry/detail/message_encoder.hpp"
#include "ferry/detail/process_identity.hpp"
#include "ferry/detail/sigpipe_blocked.hpp"

namespace ferry::detail {

void throw_spawn_argument_error(std::size_t position, std::string_view type, const std::string& problem) {
  throw SpawnError("argument " + std::to_string(position + 1) + " of spawn (" + std::string(type) + ") " + problem);
}

void throw_per_rank_count_mismatch(std::size_t position, std::string_view type, std::size_t count, int world_size) {
  throw_spawn_argument_error(position, type,
                             "holds " + std::to_string(count) + " values for " + std::to_string(world_size) +
                                 " workers; per_rank needs exactly one value per worker");
}

void throw_end_shared_by_workers(std::size_t position, std::string_view type, int world_size) {
  throw_spawn_argument_error(position, type,
                             "would be shared by " + std::to_string(world_size) +
                                 " workers, but a channel end belongs to one process; give each worker its own end "
                                 "with ferry::per_rank(std::vector<...>{...})");
}

void check_handed_end(std::size_t position, std::string_view type, bool open, Transport transport, bool used,
                      StartMethod method) {
  if (!open) throw_spawn_argument_error(position, type, "holds a closed or empty channel end; hand workers open ends");
  if (transport == Transport::InProcess) {
    throw_spawn_argument_error(position, type,
                               "holds an end of an in_process channel, which cannot reach another process; create "
                               "the channel with Transport::Pipe, UnixSocket or ShmRing");
  }
  if (transport == Transport::Ucx) {
    throw_spawn_argument_error(position, type,
                               "holds a ucx end, which cannot cross fork or exec (UCX state must not be touched by a "
                               "child); let the worker connect to the ucx:// address itself");
  }
  if (method == StartMethod::Spawn && used) {
    throw_spawn_argument_error(position, type,
                               "holds an end that has already carried messages; the spawn start method rebuilds ends "
                               "from their descriptors, so it needs fresh ones (or use StartMethod::Fork)");
  }
}

namespace {

void write_all(int fd, const void* data, std::size_t size) {
  const auto* bytes = static_cast<const std::byte*>(data);
  while (size > 0) {
    SigpipeBlocked blocked;  // a reader gone is EPIPE, never a signal
    const ssize_t written = ::write(fd, bytes, size);
    if (written < 0 && errno == EPIPE) blocked.consume();
    if (written < 0) {
      if (errno == EINTR) continue;
      throw_errno("write of a worker's argument payload");
    }
    bytes += written;
    size -= static_cast<std::size_t>(written);
  }
}

// Writes `frame` into a new memfd that the worker inherits: u32 fd count, the frame's fd
// numbers (i32 each), then the frame's bytes.
UniqueFd write_payload(const EncodedFrame& frame) {
  UniqueFd fd(::memfd_create("ferry-worker-arguments", MFD_CLOEXEC));
  if (!fd) throw_errno("memfd_create for a worker's argument payload");
  const auto count = static_cast<std::uint32_t>(frame.fds.size());
  write_all(fd.get(), &count, sizeof count);
  for (const int number : frame.fds) {
    const auto value = static_cast<std::int32_t>(number);
    write_all(fd.get(), &value, sizeof value);
  }
  for (const iovec& part : frame.iovecs()) write_all(fd.get(), part.iov_base, part.iov_len);
  return fd;
}

// A worker's arguments as read back from its payload.
struct DecodedPayload {
  FrameHeader header;
  std::vector<std::byte> rest;  // everything after the header
  std::deque<UniqueFd> fds;     // the frame's tensor fds, inherited at their numbers
};

// Reads a payload written by write_payload and takes ownership of its tensor fds.
DecodedPayload read_payload(UniqueFd payload) {
  struct stat st {};
  if (::fstat(payload.get(), &st) != 0) throw_errno("fstat of the worker's argument payload");
  std::vector<std::byte> bytes(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t got = ::pread(payload.get(), bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw_errno("read of the worker's argument payload");
    }
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  std::span<const std::byte> rest(bytes.data(), done);
  auto take = [&](void* into, std::size_t size) {
    if (rest.size() < size) throw ProtocolError("the worker's argument payload is truncated");
    std::memcpy(into, rest.data(), size);
    rest = rest.subspan(size);
  };

  // The descriptors are inherited, not passed with SCM_RIGHTS: its limit of 253 per message
  // does not apply, and a frame holds at most one per segment.
  FrameLimits limits;
  limits.max_fds = limits.max_segments;
  DecodedPayload decoded;
  std::uint32_t count = 0;
  take(&count, sizeof count);
  if (count > limits.max_fds) throw ProtocolError("the worker's argument payload names too many descriptors");
  for (std::uint32_t i = 0; i < count; ++i) {
    std::int32_t number = -1;
    take(&number, sizeof number);
    if (number < 0 || ::fcntl(number, F_GETFD) < 0) {
      throw Error("descriptor " + std::to_string(number) + " of a tensor argument was not inherited by this worker");
    }
    decoded.fds.emplace_back(number);
    if (::fcntl(number, F_SETFD, FD_CLOEXEC) != 0) throw_errno("fcntl(FD_CLOEXEC) on an inherited tensor");
  }
  take(&decoded.header, sizeof decoded.header);
  validate_header(decoded.header, limits);
  if (payload_bytes(decoded.header) != rest.size()) {
    throw ProtocolError("the worker's argument payload does not hold exactly one frame");
  }
  decoded.rest.assign(rest.begin(), rest.end());
  return decoded;
}

}  // namespace

void decode_payload_into(UniqueFd payload, const ReceivedType& type, void* out) {
  // The decoder reads the frame's body and fds where `decoded` keeps them.
  DecodedPayload decoded = read_payload(std::move(payload));
  MessageDecoder decoder(type.fingerprint, type.name);
  decoder.decode(decoded.header, decoded.rest, decoded.fds);
  decoder.read(out, type);
}

EncodedPayload::EncodedPayload(std::unique_ptr<MessageEncoder> encoder, UniqueFd fd)
    : encoder_(std::move(encoder)), fd_(std::move(fd)) {}

EncodedPayload::EncodedPayload(EncodedPayload&&) noexcept = default;

EncodedPayload::~EncodedPayload() {
  if (encoder_ && !started_) encoder_->rollback();
}

void EncodedPayload::started(pid_t pid) {
  encoder_->commit();
  started_ = true;
  try {
    if (const auto worker = identify_process(static_cast<std::int32_t>(pid))) encoder_->add_holder(*worker);
  } catch (const Error&) {
    // /proc cannot tell: the worker registers itself when it reads its arguments.
  }
}

EncodedPayload encode_payload(const void* wire, const SentType& type, std::vector<int>& inherited) {
  auto encoder = std::make_unique<MessageEncoder>(HandlePassing::FdPassing);
  const EncodedFrame& frame = encoder->encode(wire, type);
  inherited.insert(inherited.end(), frame.fds.begin(), frame.fds.end());
  UniqueFd payload = write_payload(frame);
  return EncodedPayload(std::move(encoder), std::move(payload));
}

}  // namespace ferry::detail
