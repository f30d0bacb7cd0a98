// Which process holds each end of a pair made together (channel(), duplex()), so that an
// end can tell its peer's process id (introspection's peer_pid). Contract:
// - One word of anonymous shared memory per pair (a claim word, claim_pages.hpp): every
//   process that holds a copy of either end through fork() sees the same word. Bits 0-31:
//   the sending end's process, bits 32-63: the receiving end's; 0 is "not known".
// - Both halves start as the process that made the pair. An end writes its half when a
//   process takes it (its first use there, or adopt()), and clears it when it is handed
//   away to a process that rebuilds it from its descriptors (which has no such word).
//   Writes happen only on those rare paths, never per message.
// - Thread- and process-safe (atomic updates of one word).
#pragma once

#include <sys/types.h>

#include "ferry/detail/end_claim.hpp"  // ClaimWord

namespace ferry::detail {

class PairPids {
 public:
  /// Both halves: the calling process. Throws SystemError when a page cannot be mapped.
  PairPids();
  ~PairPids();
  PairPids(const PairPids&) = delete;
  PairPids& operator=(const PairPids&) = delete;

  /// Records `pid` (0: not known) as the process of the sending (`sender`) or receiving end.
  void set(bool sender, pid_t pid) noexcept;
  /// The process of the sending or receiving end; 0 when not known.
  pid_t get(bool sender) const noexcept;

 private:
  ClaimWord slot_;
};

}  // namespace ferry::detail
