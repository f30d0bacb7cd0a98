// The codec fuzz harness: a MessageEncoder and a MessageDecoder joined in memory
// (test::CodecLoop), driven by a script of operations read from the input: storages made
// and dropped on the sending side, messages sent intact, corrupted on the way or never
// sent, received messages dropped, either end dying. What it checks:
//   - an intact frame decodes to what was sent, and afterwards both ends count the same
//     storage and segment leases (the two slot tables stay in step);
//   - a corrupted frame is refused with ProtocolError or decodes (then the run ends, as a
//     broken receiver ends its channel); nothing else may escape;
//   - once both ends let go after intact frames only, the sender holds no pin (what a
//     corrupted frame resolved in part pinned waits for the receiving process's exit).
// Neither end acts on a descriptor number from the input: fds travel as duplicates of the
// sender's own, and a /proc entry a corruption makes is neutralized (pid 0).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ferry::fuzz {

/// The operations of a codec script: one byte (its value modulo kCodecOps) and its
/// argument bytes (missing ones read as zero).
enum class CodecOp : std::uint8_t {
  Allocate = 0,        ///< index, log2 of the size in bytes (modulo 21), fill byte
  DropSent = 1,        ///< index
  Send = 2,            ///< mask low, mask high: the storages at the mask's indexes
  SendCorrupted = 3,   ///< mask low, mask high, how (0 cut, 1 flip a byte, 2 lose an fd, 3 add a release), a, b, c
  DropReceived = 4,    ///< which received message (one past the last: all)
  SendNotSent = 5,     ///< mask low, mask high: encoded, then rolled back
  ReceiverLetsGo = 6,  ///< the receiver drops every lease (its sender closed); ends the script
  ReceiverGone = 7,    ///< the sender sees its receiver gone; ends the script
};
inline constexpr std::uint8_t kCodecOps = 8;
/// Storages the sending side holds at once (the mask's width).
inline constexpr std::size_t kCodecStorages = 16;

/// Builds a codec script (the seeds, tests).
class CodecScript {
 public:
  CodecScript& allocate(std::uint8_t index, std::uint8_t size_log2, std::uint8_t fill) {
    return op(CodecOp::Allocate, {index, size_log2, fill});
  }
  CodecScript& drop_sent(std::uint8_t index) { return op(CodecOp::DropSent, {index}); }
  CodecScript& send(std::uint16_t mask) { return op(CodecOp::Send, {low(mask), high(mask)}); }
  CodecScript& send_corrupted(std::uint16_t mask, std::uint8_t how, std::uint8_t a, std::uint8_t b, std::uint8_t c) {
    return op(CodecOp::SendCorrupted, {low(mask), high(mask), how, a, b, c});
  }
  CodecScript& drop_received(std::uint8_t which) { return op(CodecOp::DropReceived, {which}); }
  CodecScript& send_not_sent(std::uint16_t mask) { return op(CodecOp::SendNotSent, {low(mask), high(mask)}); }
  CodecScript& receiver_lets_go() { return op(CodecOp::ReceiverLetsGo, {}); }
  CodecScript& receiver_gone() { return op(CodecOp::ReceiverGone, {}); }
  const std::vector<std::uint8_t>& bytes() const { return bytes_; }

 private:
  static std::uint8_t low(std::uint16_t mask) { return static_cast<std::uint8_t>(mask & 0xff); }
  static std::uint8_t high(std::uint16_t mask) { return static_cast<std::uint8_t>(mask >> 8); }
  CodecScript& op(CodecOp code, std::initializer_list<std::uint8_t> arguments) {
    bytes_.push_back(static_cast<std::uint8_t>(code));
    bytes_.insert(bytes_.end(), arguments);
    return *this;
  }
  std::vector<std::uint8_t> bytes_;
};

/// Runs the codec script `input`; returns the number of messages delivered intact.
std::size_t run_codec(std::span<const std::uint8_t> input);

}  // namespace ferry::fuzz
