#include "ferry/detail/end_claim.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "ends/claim_pages.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

std::atomic<pid_t> g_current_process_id{0};

namespace {

// The word: bits 0-31 the process id, bits 32-39 the standing. An owned end's word is
// the owner's id alone, so that the check on every use is one comparison.
enum class Standing : std::uint64_t { Owned = 0, Fresh = 1, Closed = 2, HandedAway = 3 };
constexpr unsigned kStandingShift = 32;
constexpr std::uint64_t kPidMask = 0xffff'ffffULL;

std::uint64_t make_word(pid_t pid, Standing standing) noexcept {
  return (static_cast<std::uint64_t>(standing) << kStandingShift) | (static_cast<std::uint64_t>(pid) & kPidMask);
}
pid_t pid_of(std::uint64_t word) noexcept { return static_cast<pid_t>(word & kPidMask); }
Standing standing_of(std::uint64_t word) noexcept { return static_cast<Standing>(word >> kStandingShift); }

// Registered before main(): every child of fork() learns its own id before it runs
// anything else.
[[maybe_unused]] const bool g_process_id_tracked = [] {
  g_current_process_id.store(read_current_process_id(), std::memory_order_relaxed);
  const int rc = ::pthread_atfork(
      nullptr, nullptr, [] { g_current_process_id.store(read_current_process_id(), std::memory_order_relaxed); });
  if (rc != 0) throw_system_error("pthread_atfork", rc);
  return true;
}();

// Another process owns or closed the end, or it was handed away (by any process).
bool is_elsewhere(std::uint64_t word) noexcept {
  const Standing standing = standing_of(word);
  return standing == Standing::HandedAway || (standing != Standing::Fresh && pid_of(word) != current_process_id());
}

bool process_alive(pid_t pid) noexcept { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

}  // namespace

pid_t read_current_process_id() noexcept { return ::getpid(); }

EndClaim::EndClaim() : slot_(take_claim_word(make_word(current_process_id(), Standing::Fresh))) {}

EndClaim::~EndClaim() { give_back_claim_word(slot_); }

bool EndClaim::held() const noexcept {
  return slot_.word->load(std::memory_order_acquire) == make_word(current_process_id(), Standing::Owned);
}

bool EndClaim::fresh_here() const noexcept {
  return slot_.word->load(std::memory_order_acquire) == make_word(current_process_id(), Standing::Fresh);
}

bool EndClaim::elsewhere() const noexcept { return is_elsewhere(slot_.word->load(std::memory_order_acquire)); }

void EndClaim::claim_slow(const char* role) {
  const std::uint64_t mine = make_word(current_process_id(), Standing::Owned);
  std::uint64_t word = slot_.word->load(std::memory_order_acquire);
  while (word != mine) {
    if (standing_of(word) != Standing::Fresh) throw_elsewhere(role, word);
    // Fresh: the first process to use it takes it.
    if (slot_.word->compare_exchange_weak(word, mine, std::memory_order_acq_rel, std::memory_order_acquire)) return;
  }
}

void EndClaim::check_not_elsewhere(const char* role) const {
  const std::uint64_t word = slot_.word->load(std::memory_order_acquire);
  if (is_elsewhere(word)) throw_elsewhere(role, word);
}

bool EndClaim::take_for_closing(bool take_fresh_of_others) noexcept {
  const pid_t me = current_process_id();
  const std::uint64_t mine = make_word(me, Standing::Owned);
  std::uint64_t word = slot_.word->load(std::memory_order_acquire);
  while (word != mine) {
    if (standing_of(word) != Standing::Fresh) return false;
    if (!take_fresh_of_others && pid_of(word) != me) return false;
    if (slot_.word->compare_exchange_weak(word, mine, std::memory_order_acq_rel, std::memory_order_acquire))
      return true;
  }
  return true;
}

void EndClaim::adopt() noexcept {
  const std::uint64_t mine = make_word(current_process_id(), Standing::Owned);
  std::uint64_t word = slot_.word->load(std::memory_order_acquire);
  while (standing_of(word) == Standing::Owned || standing_of(word) == Standing::Fresh) {
    if (slot_.word->compare_exchange_weak(word, mine, std::memory_order_acq_rel, std::memory_order_acquire)) return;
  }
}

void EndClaim::mark_closed() noexcept {
  slot_.word->store(make_word(current_process_id(), Standing::Closed), std::memory_order_release);
}

void EndClaim::mark_handed_away() noexcept {
  slot_.word->store(make_word(current_process_id(), Standing::HandedAway), std::memory_order_release);
}

void EndClaim::throw_elsewhere(const char* role, std::uint64_t word) const {
  const pid_t owner = pid_of(word);
  const bool alive = process_alive(owner);
  const std::string end = std::string("this ") + role;
  const std::string process = "process " + std::to_string(owner) + (alive ? "" : " (which has exited)");
  std::string what;
  EndOwnedElsewhere::Reason reason = EndOwnedElsewhere::Reason::UsedElsewhere;
  switch (standing_of(word)) {
    case Standing::Closed:
      reason = EndOwnedElsewhere::Reason::Closed;
      what = end + " was closed by " + process +
             ", which owned it; this process only holds a copy inherited "
             "through fork()";
      break;
    case Standing::HandedAway:
      reason = EndOwnedElsewhere::Reason::HandedAway;
      what = end + " was handed to another process (described for an exec'd worker or pickled) by " + process +
             "; this copy can no longer be used";
      break;
    default:
      what = end + " belongs to " + process +
             ", which used or adopted it first; this process only holds a copy "
             "inherited through fork(), and two processes using one end would corrupt its stream";
      break;
  }
  what +=
      ". An end belongs to one process: hand it over instead of sharing it (ferry::spawn does; after a plain "
      "fork(), call detach() in the process that gives it up and adopt() in the one that takes it), or give "
      "each process a channel of its own (per_rank) and fan them in with a Selector";
  throw EndOwnedElsewhere(what, role, owner, alive, reason);
}

}  // namespace ferry::detail
