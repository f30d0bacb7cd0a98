// The fuzz harnesses, shared by the libFuzzer targets and by fuzz_corpus_test (which
// replays the committed corpus through them in every normal build).
//
// Neither harness ever acts on a descriptor number taken from its input: every fd a frame
// receives is a duplicate of a segment the harness created, and every /proc path a frame
// names is rewritten to one of those segments. Only ProtocolError may escape the library;
// any other exception, a view that reaches outside its storage, or an fd left open stops
// the run (libFuzzer reports it as a crash, the corpus test as a failure).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ferry/detail/return_board.hpp"
#include "ferry/detail/shared_memory.hpp"
#include "ferry/detail/unique_fd.hpp"
#include "ferry/storage.hpp"

namespace ferry::fuzz {

/// Frame decoder target. The input is a stream of frames exactly as a transport delivers
/// them (header, then payload_bytes(header) bytes, repeated); one MessageDecoder reads
/// them in order, so leases granted by one frame are used and released by later ones.
/// Per frame: validate_header, MessageDecoder::decode, read<FuzzMessage>.
class FrameHarness {
 public:
  FrameHarness();
  /// Decodes `input`; stops at the first ProtocolError (the receiver is broken then).
  /// Returns the number of messages decoded.
  std::size_t run(std::span<const std::uint8_t> input);

 private:
  struct Segment {
    detail::UniqueFd fd;  // what the harness duplicates into a frame
    detail::FileIdentity identity;
    std::shared_ptr<Storage> storage;  // keeps cached segments in the handle cache
    std::unique_ptr<detail::SharedMemory> uncached;
    std::shared_ptr<detail::ReturnBoard> board;
    detail::UniqueFd extra;  // the write end of the pipe segment
  };
  void rewrite_proc_entries(std::vector<std::byte>& payload) const;
  std::vector<Segment> segments_;
};

/// Body target: the input is the body of one message; FrameInputArchive reads a
/// FuzzMessage from it with a prepared table of heap storages (kBodyStorageBytes), so that
/// AddressSanitizer sees any read outside a storage.
class BodyHarness {
 public:
  BodyHarness();
  /// Reads a FuzzMessage from `input`; true when it decoded (false on ProtocolError).
  bool run(std::span<const std::uint8_t> input);

 private:
  std::vector<std::shared_ptr<Storage>> storages_;
};

/// ferry::Value target: the input is the body of one Value message (what a hostile Python
/// or C++ peer sends: deep nesting, lying counts, bad UTF-8, truncation). Read with the same
/// table of heap storages as BodyHarness; a decoded tree is checked against the decoder's
/// promises (depth, element count, valid UTF-8, distinct map keys, views inside storages).
class ValueHarness {
 public:
  ValueHarness();
  /// Reads a Value from `input`; true when it decoded (false on ProtocolError).
  bool run(std::span<const std::uint8_t> input);

 private:
  std::vector<std::shared_ptr<Storage>> storages_;
};

}  // namespace ferry::fuzz
