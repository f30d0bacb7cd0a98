// The fuzz harnesses of the ucx:// wire formats (ucx/ucx_handshake_wire.hpp,
// ucx/ucx_am_wire.hpp), shared by the libFuzzer targets ucx_handshake_fuzzer and
// ucx_am_fuzzer and by ferry_ucx_wire_tests (which replays the committed corpus).
// Only ferry::Error (and its subclasses) may leave the code under test; any other
// exception, or a broken oracle, aborts the run (a crash for libFuzzer).
#pragma once

#include <cstdint>
#include <span>

namespace ferry::fuzz {

/// Handshake input: byte 0 picks the mode (mod 4), then messages, each a 16-bit
/// little-endian length and that many bytes (the last one takes what is left).
///   0: a ListenerHandshake reads the messages as a client's.
///   1: a ClientHandshake reads them as a listener's (its Verdict check runs on each too).
///   2: an honest client whose kind and limits come from the first message runs the whole
///      handshake with a listener (the claim must arrive exactly as declared); the other
///      messages then reach the listener after its handshake ended.
///   3: an honest listener runs the handshake up to the Verdict; the messages are then
///      Verdicts for the client (one the Verdict check accepts must be accepted).
/// Returns the number of messages read.
std::size_t run_ucx_handshake(std::span<const std::uint8_t> input);

/// Active-message input: a 16-bit little-endian header length, the header, the 64-bit data
/// length, then optionally FrameLimits (u64 body, u32 handles, segments, fds, releases,
/// type name bytes); what is left is a delivery report's data. Returns true when the frame
/// header was accepted (its plan is then checked against the header, data and limits).
bool run_ucx_am(std::span<const std::uint8_t> input);

}  // namespace ferry::fuzz
