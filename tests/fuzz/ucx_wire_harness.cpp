#include "ucx_wire_harness.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "ferry/error.hpp"
#include "ucx/ucx_am_wire.hpp"
#include "ucx/ucx_handshake_wire.hpp"

namespace ferry::fuzz {
namespace {

using namespace ferry::ucx::detail;

[[noreturn]] void broken(const char* oracle) {
  std::fprintf(stderr, "ucx wire fuzz harness: oracle broken: %s\n", oracle);
  std::abort();
}
void check(bool condition, const char* oracle) {
  if (!condition) broken(oracle);
}

// Reads the input front to back.
class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> input) : input_(input) {}
  bool empty() const noexcept { return input_.empty(); }
  template <class T>
  std::optional<T> value() {
    if (input_.size() < sizeof(T)) return std::nullopt;
    T out;
    std::memcpy(&out, input_.data(), sizeof out);
    input_ = input_.subspan(sizeof out);
    return out;
  }
  std::span<const std::byte> bytes(std::size_t count) {
    count = std::min(count, input_.size());
    const auto out = std::as_bytes(input_.first(count));
    input_ = input_.subspan(count);
    return out;
  }
  std::span<const std::byte> rest() { return bytes(input_.size()); }
  // The next length-prefixed message, or nullopt at the end.
  std::optional<std::span<const std::byte>> message() {
    if (input_.empty()) return std::nullopt;
    const auto length = value<std::uint16_t>();
    if (!length) return rest();
    return bytes(*length);
  }

 private:
  std::span<const std::uint8_t> input_;
};

SecretKey fixed_key(unsigned char seed) {
  SecretKey key;
  for (std::size_t i = 0; i < key.key.size(); ++i) key.key[i] = static_cast<unsigned char>(i * 7 + seed);
  return key;
}
Nonce fixed_nonce(unsigned char seed) {
  Nonce nonce;
  nonce.fill(seed);
  return nonce;
}
const Salt kSalt{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

ClientHandshake client(const EndKind& kind, const FrameLimits& limits, const SecretKey& key) {
  return ClientHandshake("ucx://fuzz:1", kind, limits, fixed_nonce(0xC1), [key](const Salt&) { return key; });
}

EndKind kind_from(std::span<const std::byte> bytes) {
  Reader reader({reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()});
  EndKind kind;
  kind.end = static_cast<ferry::detail::ClientEnd>(reader.value<std::uint8_t>().value_or(1));
  kind.sends = reader.value<std::uint64_t>().value_or(0);
  kind.receives = reader.value<std::uint64_t>().value_or(0);
  const std::uint16_t split = reader.value<std::uint16_t>().value_or(0);
  const auto names = reader.rest();
  const std::size_t at = std::min<std::size_t>(split, names.size());
  kind.sends_name.assign(reinterpret_cast<const char*>(names.data()), at);
  kind.receives_name.assign(reinterpret_cast<const char*>(names.data()) + at, names.size() - at);
  return kind;
}

FrameLimits limits_from(std::uint64_t seed) {
  FrameLimits limits;
  limits.max_body_bytes = seed;
  limits.max_handles = static_cast<std::uint32_t>(seed >> 7);
  limits.max_segments = static_cast<std::uint32_t>(seed >> 13);
  limits.max_fds = static_cast<std::uint32_t>(seed >> 17);
  limits.max_releases = static_cast<std::uint32_t>(seed >> 23);
  limits.max_type_name_bytes = static_cast<std::uint32_t>(seed >> 29);
  return limits;
}
bool same_limits(const FrameLimits& a, const FrameLimits& b) {
  return a.max_body_bytes == b.max_body_bytes && a.max_handles == b.max_handles && a.max_segments == b.max_segments &&
         a.max_fds == b.max_fds && a.max_releases == b.max_releases && a.max_type_name_bytes == b.max_type_name_bytes;
}

std::size_t listener_reads(Reader& reader) {
  ListenerHandshake listener(fixed_key(1), kSalt, fixed_nonce(0x11));
  (void)listener.hello();
  std::size_t read = 0;
  while (auto message = reader.message()) {
    ++read;
    ListenerHandshake::Step step = listener.receive(*message);
    if (!step.refused.empty()) return read;
    if (step.claim) {
      (void)listener.accept(FrameLimits{});
      (void)ListenerHandshake::refuse(Outcome::TypeMismatch, step.claim->describe());
    }
  }
  return read;
}

std::size_t client_reads(Reader& reader, unsigned char key_seed) {
  ClientHandshake machine = client(EndKind{}, FrameLimits{}, fixed_key(key_seed));
  std::size_t read = 0;
  try {
    while (auto message = reader.message()) {
      ++read;
      const bool verdict_proves = machine.awaiting_verdict() && machine.verdict_check()(*message);
      (void)machine.receive(*message);
      if (verdict_proves) check(machine.done(), "a Verdict the check accepts ends the handshake");
    }
  } catch (const Error&) {
  }
  return read;
}

std::size_t honest_pair(Reader& reader, bool fuzz_verdicts) {
  const auto first = reader.message();
  if (!first) return 0;
  const EndKind kind = kind_from(*first);
  const FrameLimits limits = limits_from(kind.sends ^ kind.receives);
  const SecretKey key = fixed_key(1);
  ListenerHandshake listener(key, kSalt, fixed_nonce(0x11));
  ClientHandshake machine = client(kind, limits, key);
  const Bytes challenge = machine.receive(listener.hello());
  const ListenerHandshake::Step proof = listener.receive(challenge);
  check(proof.refused.empty() && !proof.reply.empty(), "an honest Challenge is answered with a Proof");
  const Bytes claim = machine.receive(proof.reply);
  check(machine.awaiting_verdict(), "an honest Proof is accepted");
  ListenerHandshake::Step verdict = listener.receive(claim);
  const auto end = static_cast<std::uint8_t>(kind.end);
  if (end < 1 || end > 3) {
    check(!verdict.refused.empty() && !verdict.claim, "a claim of an unknown end is refused");
    return 1;
  }
  check(verdict.refused.empty() && verdict.claim.has_value(), "an honest claim is accepted");
  check(verdict.claim->matches(kind), "the claim arrives as declared");
  check(verdict.claim->sends_name == kind.sends_name.substr(0, kMaxTypeName) &&
            verdict.claim->receives_name == kind.receives_name.substr(0, kMaxTypeName),
        "the type names arrive as declared (cut at kMaxTypeName)");
  check(same_limits(listener.client_limits(), limits), "the client's limits arrive as declared");
  std::size_t read = 1;
  if (!fuzz_verdicts) {
    const FrameLimits mine = limits_from(~kind.sends);
    (void)machine.receive(listener.accept(mine));
    check(machine.done() && same_limits(machine.listener_limits(), mine), "an honest Verdict is accepted");
    while (auto message = reader.message()) {
      ++read;
      check(!listener.receive(*message).refused.empty(), "a message after the handshake is refused");
    }
    return read;
  }
  const auto check_verdict = machine.verdict_check();
  check(check_verdict(listener.accept(FrameLimits{})), "the Verdict check accepts an honest Verdict");
  while (auto message = reader.message()) {
    ++read;
    const bool proves = check_verdict(*message);
    try {
      (void)machine.receive(*message);
      check(machine.done(), "a Verdict read without an error ends the handshake");
      return read;
    } catch (const Error&) {
      check(!proves, "a Verdict the check accepts is accepted");
    }
  }
  return read;
}

}  // namespace

std::size_t run_ucx_handshake(std::span<const std::uint8_t> input) {
  Reader reader(input);
  const std::uint8_t mode = reader.value<std::uint8_t>().value_or(0);
  try {
    switch (mode % 4) {
      case 0: return listener_reads(reader);
      case 1: return client_reads(reader, static_cast<unsigned char>(1 + (mode >> 2 & 1)));
      case 2: return honest_pair(reader, false);
      default: return honest_pair(reader, true);
    }
  } catch (const Error&) {
    return 0;  // a ferry error is an allowed outcome of any input
  }
}

bool run_ucx_am(std::span<const std::uint8_t> input) {
  Reader reader(input);
  const std::uint16_t header_length = reader.value<std::uint16_t>().value_or(0);
  const auto header = reader.bytes(header_length);
  const std::uint64_t data_length = reader.value<std::uint64_t>().value_or(0);
  FrameLimits limits;
  if (const auto body = reader.value<std::uint64_t>()) {
    limits.max_body_bytes = *body;
    limits.max_handles = reader.value<std::uint32_t>().value_or(limits.max_handles);
    limits.max_segments = reader.value<std::uint32_t>().value_or(limits.max_segments);
    limits.max_fds = reader.value<std::uint32_t>().value_or(limits.max_fds);
    limits.max_releases = reader.value<std::uint32_t>().value_or(limits.max_releases);
    limits.max_type_name_bytes = reader.value<std::uint32_t>().value_or(limits.max_type_name_bytes);
  }
  const auto delivered = reader.rest();
  if (const auto sequence = parse_delivered(delivered, false)) {
    std::uint64_t expected = 0;
    check(delivered.size() == sizeof expected, "a delivery report is 8 bytes");
    std::memcpy(&expected, delivered.data(), sizeof expected);
    check(*sequence == expected, "a delivery report's sequence is its bytes");
  }
  check(!parse_delivered(delivered, true), "a delivery report by rendezvous is refused");
  check(!control_message_fits(data_length, true, 0), "a handshake message by rendezvous is refused");
  check(!control_message_fits(kMaxControlBytes + 1, false, 0), "a handshake message above the cap is refused");
  check(!accepted_before_handshake(kFrameAm) && !accepted_before_handshake(kCopyAm) &&
            !accepted_before_handshake(kDeliveredAm) && accepted_before_handshake(kControlAm),
        "only control messages are taken before the handshake");

  const char* why = nullptr;
  const auto plan = parse_frame_am(header, data_length, limits, &why);
  if (!plan) {
    check(why != nullptr && *why != '\0', "a refused frame header says why");
    return false;
  }
  check(plan->header.copy_count <= kMaxCopies && plan->header.copy_count <= limits.max_handles,
        "the storage count is within the limits");
  check(header.size() == sizeof(FrameAmHeader) + std::size_t{plan->header.copy_count} * sizeof(CopyDescriptor),
        "the header is exactly its descriptors");
  check(plan->header.frame_bytes >= sizeof(ferry::detail::FrameHeader) && plan->header.frame_bytes <= data_length &&
            plan->header.frame_bytes <= max_frame_bytes(limits),
        "the frame fits the data and the limits");
  std::size_t remote = 0;
  std::uint64_t inline_bytes = 0;
  for (std::size_t i = 0; i < plan->header.copy_count; ++i) {
    const CopyDescriptor descriptor = descriptor_at(*plan, i);
    check(descriptor.inline_copy <= 1, "a storage is inline or not");
    if (descriptor.inline_copy == 0) {
      ++remote;
    } else {
      check(descriptor.nbytes <= kInlineCopyLimit, "an inline storage is small");
      inline_bytes += descriptor.nbytes;
    }
  }
  check(remote == plan->remote_count && inline_bytes == plan->inline_bytes, "the plan counts its descriptors");
  check(plan->header.frame_bytes + inline_bytes == data_length, "frame and inline storages are the whole data");
  return true;
}

}  // namespace ferry::fuzz
