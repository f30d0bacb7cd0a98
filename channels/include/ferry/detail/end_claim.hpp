// Which process may use a channel end. Contract:
// - Every frame end (SenderCore, ReceiverCore) has one claim word in anonymous shared
//   memory, so every process that holds a copy of the end through fork() sees the same
//   word. Words share pages (claim_pages.hpp: a page holds 512, and a word stays with its
//   end in every process that holds a copy of it). It names the owning process and the end's standing: fresh (made by
//   that process, not used by anyone yet), owned, closed by its owner, or handed away (to a process that rebuilt it
//   from its descriptors).
// - A process may send or receive on an end only while the word says it owns it. A fresh
//   end is taken by its first user, whichever process that is (one atomic exchange: of two
//   forked processes racing for it exactly one wins). Any other use throws
//   EndOwnedElsewhere: misuse is an error in the second process, never two writers in one
//   stream, a lost message or a hang.
// - adopt() (ferry::spawn, or a user who hands an end over after fork) makes the calling
//   process the owner of an end that is not closed or handed away.
// - The check on every send and receive is one relaxed load compared with this process's
//   id, kept in a variable that a pthread_atfork handler updates in each new child.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>

namespace ferry::detail {

/// One claim word's place and how to give it back (channels/src/ends/claim_pages.hpp).
struct ClaimPage;
struct ClaimWord {
  std::atomic<std::uint64_t>* word;
  ClaimPage* page;
  std::uint64_t forks;  // forks this process had made (or been made by) when it was taken
};

/// This process's id as end_claim.cpp keeps it (0 before static initialization ran).
extern std::atomic<pid_t> g_current_process_id;
/// getpid(), for the time before static initialization.
pid_t read_current_process_id() noexcept;

/// This process's id, without a system call (glibc no longer caches getpid()): set at
/// start and in every child fork() makes (pthread_atfork). Inline: every send and
/// receive reads it.
inline pid_t current_process_id() noexcept {
  const pid_t pid = g_current_process_id.load(std::memory_order_relaxed);
  return pid != 0 ? pid : read_current_process_id();
}

/// The claim word of one end (see the contract above). Not copyable; one per end object.
class EndClaim {
 public:
  /// A fresh end of the calling process. Throws SystemError when a page cannot be mapped.
  EndClaim();
  ~EndClaim();
  EndClaim(const EndClaim&) = delete;
  EndClaim& operator=(const EndClaim&) = delete;

  /// True when the calling process owns the end: the check on every send and receive
  /// (claim_for_use() when false).
  bool owned_by_caller() const noexcept {
    return slot_.word->load(std::memory_order_relaxed) == static_cast<std::uint64_t>(current_process_id());
  }
  /// Returns when the calling process may use the end: it owns it, or takes it because it
  /// is fresh. Throws EndOwnedElsewhere otherwise; `role` ("Sender", "Receiver") names the
  /// end in the message.
  void claim_for_use(const char* role) {
    if (!owned_by_caller()) [[unlikely]]
      claim_slow(role);
  }
  /// Throws EndOwnedElsewhere when another process owns, closed or handed away the end;
  /// unlike claim_for_use(), never takes a fresh end.
  void check_not_elsewhere(const char* role) const;
  /// True when the calling process owns the end.
  bool held() const noexcept;
  /// True when the end is fresh and was made by the calling process.
  bool fresh_here() const noexcept;
  /// True when another process owns, closed or handed away the end (a fresh end is nobody's).
  bool elsewhere() const noexcept;
  /// Takes the end for closing it: true when the calling process owns it afterwards (it
  /// did, or the end was fresh and `take_fresh_of_others` or made here).
  bool take_for_closing(bool take_fresh_of_others) noexcept;
  /// Makes the calling process the owner; no effect on an end that was closed or handed away.
  void adopt() noexcept;
  /// The owner ended the stream: no process may use the end any more.
  void mark_closed() noexcept;
  /// The end was handed to a process that rebuilds it from its descriptors (an exec'd
  /// worker, an unpickling process): no process that holds this copy may use it any more.
  void mark_handed_away() noexcept;

 private:
  [[noreturn]] void throw_elsewhere(const char* role, std::uint64_t word) const;
  void claim_slow(const char* role);

  ClaimWord slot_;  // the word, and where to give it back
};

}  // namespace ferry::detail
