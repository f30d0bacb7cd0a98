// The fuzz harnesses of the unix: endpoint handshake, shared by the libFuzzer targets
// (handshake_fuzzer, listener_fuzzer) and by fuzz_corpus_test, which replays their corpus.
//
// Only ProtocolError may escape a decoder; a decoded Hello or Reply must survive encoding
// and decoding again unchanged; the listener must answer every client with a well-formed
// Reply (or none), never throw, never accept a client whose Hello it did not check, and
// hold no descriptor once it is gone. A violation aborts the run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ferry::fuzz {

/// decode_prefix, decode_hello and decode_reply on the same bytes (a Hello or a Reply as a
/// peer sends it); returns how many of the two decoded.
int run_handshake(std::span<const std::uint8_t> input);

/// The operations of a listener script (listener_fuzzer's input is a sequence of them):
/// each is one byte (taken modulo 6), then for Send a client index byte, a length byte and
/// that many bytes; for Close a client index byte; for Accept a kind byte (odd: Sender).
enum class ListenerOp : std::uint8_t {
  Connect = 0,  ///< a new client connection (a socket pair) joins the listener's backlog
  Send = 1,     ///< client [index] writes bytes
  Close = 2,    ///< client [index] closes its connection
  Pump = 3,     ///< the listener advances (ListenerCore::pump with an expired deadline)
  Accept = 4,   ///< the listener takes a client of a served kind (accept with no wait)
  Read = 5,     ///< every client reads what the listener answered
};
inline constexpr std::size_t kMaxListenerClients = 8;

/// Runs a listener (StreamListenerCore over a listening point that hands out socket
/// pairs, serving Receiver<int> and Sender<double> clients over UnixSocket, at most 4
/// pending and 2 waiting of a kind) through the script in `input`; returns how many
/// clients it accepted.
int run_listener(std::span<const std::uint8_t> input);

}  // namespace ferry::fuzz
