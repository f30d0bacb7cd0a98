// SlotTable: one numbered table of what one end of a connection leases to the other.
//
// Contract. Both ends of a connection keep one SlotTable per kind of lease (storages,
// segments), and the two tables stay in step through the frames:
//   - The sending end numbers the slots: take() hands out the lowest-cost free number (one
//     given back before, else the next never used) and fails with Error once `capacity`
//     slots are in use. A frame introduces what it took; rollback() of that frame frees the
//     slot again (free()).
//   - When what a slot names dies at the sender, retire_where() moves the slot to Dying and
//     queues its release. The next frame announces every queued release (announce()); once
//     that frame is sent, commit_announced() frees each slot at once, or, for a slot whose
//     receiver gives it back on the return board (take(..., awaits_return = true)), marks it
//     Released until free() is called with the number the board returned.
//   - The receiving end follows: check_free() refuses a number above capacity or still
//     held (ProtocolError: a lying sender), place() fills it, release() empties it (and
//     refuses a slot that holds nothing), find() looks one up.
//   - saw_deaths() remembers a process-wide death count, so that a scan for dead entries
//     runs only after something died.
// A slot's state: Free (unused) -> Live (take / place) -> Dying (retired, release not yet
// announced) -> Released (announced, waiting for the receiver's return) -> Free. Live slots
// are also kept in a dense list (live()) for scans. Entry is what one slot names; a slot
// that is not Live holds Entry{}. Not thread-safe: one per end of one connection.
// See docs/design/leases-and-returns.md.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ferry/error.hpp"

namespace ferry::detail {

/// How a SlotTable names its slots in error messages.
struct SlotNames {
  const char* slot;    ///< a slot: "slot", "segment slot"
  const char* entry;   ///< the frame entry that names one: "handle", "segment"
  const char* leased;  ///< what the slots hold, plural: "storages", "segments"
  const char* advice;  ///< what a sender out of slots can do (may be empty)
};

/// The slots of a connection's storages (capacity: ReturnBoard::kSlots) and segments.
inline constexpr SlotNames kStorageSlotNames{"slot", "handle", "storages",
                                             "let the receiver drop tensors, or send fewer, larger ones"};
inline constexpr SlotNames kSegmentSlotNames{"segment slot", "segment", "segments", ""};
/// The most segment slots a sender may lease to one receiver.
inline constexpr std::uint32_t kMaxSegmentSlots = 1u << 20;

template <class Entry>
class SlotTable {
 public:
  enum class State : std::uint8_t { Free, Live, Dying, Released };

  SlotTable(std::uint32_t capacity, SlotNames names) : capacity_(capacity), names_(names) {}

  std::uint32_t capacity() const noexcept { return capacity_; }
  State state(std::uint32_t slot) const noexcept { return slot < slots_.size() ? slots_[slot].state : State::Free; }
  /// The entry of a slot in use (any state but Free keeps its number; only Live has an entry).
  Entry& at(std::uint32_t slot) noexcept { return slots_[slot].entry; }
  /// The Live slots, in no particular order.
  std::span<const std::uint32_t> live() const noexcept { return live_; }
  /// True while no slot was ever used (or after clear()).
  bool never_used() const noexcept { return slots_.empty(); }

  // ---- the sending end --------------------------------------------------------------

  /// A free slot, now Live and holding `entry`. Throws Error when `capacity` are in use.
  std::uint32_t take(Entry entry, bool awaits_return) {
    const std::uint32_t slot = free_.empty() ? next_number() : pop_free();
    make_live(slot, std::move(entry)).awaits_return = awaits_return;
    return slot;
  }
  /// Retires every Live slot for which `dead(slot, entry)` is true: Dying, release queued.
  template <class Dead>
  void retire_where(Dead&& dead) {
    for (std::size_t i = live_.size(); i-- > 0;) {  // backwards: removal moves the last one here
      const std::uint32_t slot = live_[i];
      if (!dead(slot, slots_[slot].entry)) continue;
      unlist(slot);
      slots_[slot].state = State::Dying;
      unannounced_.push_back(slot);
    }
  }
  /// The releases the frame being encoded announces: every one queued so far. The span
  /// stays valid until the next call of a non-const function.
  std::span<const std::uint32_t> announce() noexcept {
    announced_ = unannounced_.size();
    return {unannounced_.data(), announced_};
  }
  /// The frame that announced the releases was sent: each slot is free again, or Released
  /// when its receiver gives it back on the return board.
  void commit_announced() {
    for (std::size_t i = 0; i < announced_; ++i) settle_released(unannounced_[i]);
    unannounced_.erase(unannounced_.begin(), unannounced_.begin() + static_cast<std::ptrdiff_t>(announced_));
    announced_ = 0;
  }
  /// True when the receiver may give `slot` back (in use, and taken with awaits_return):
  /// a number a lying receiver posts otherwise is ignored.
  bool returnable(std::uint32_t slot) const noexcept {
    return slot < slots_.size() && slots_[slot].state != State::Free && slots_[slot].awaits_return;
  }
  /// Frees `slot` from any state (given back, or its frame rolled back). Not for a Dying
  /// slot between announce() and commit_announced().
  void free(std::uint32_t slot) {
    Slot& info = slots_[slot];
    if (info.state == State::Free) return;
    if (info.state == State::Live) unlist(slot);
    if (info.state == State::Dying) std::erase(unannounced_, slot);
    info = Slot{};
    free_.push_back(slot);
  }
  /// True once when `deaths` (a process-wide count) moved since the last call.
  bool saw_deaths(std::uint64_t deaths) noexcept { return std::exchange(seen_deaths_, deaths) != deaths; }

  // ---- the receiving end ------------------------------------------------------------

  /// The Live entry at `slot`, or null.
  Entry* find(std::uint32_t slot) noexcept {
    return slot < slots_.size() && slots_[slot].state == State::Live ? &slots_[slot].entry : nullptr;
  }
  /// Throws ProtocolError unless frame entry `index` may place something at `slot`.
  void check_free(std::uint32_t slot, std::size_t index) const {
    if (slot >= capacity_) throw_above_capacity(slot, index);
    if (state(slot) != State::Free) throw_reused(slot, index);
  }
  /// Fills `slot` (checked by check_free()).
  void place(std::uint32_t slot, Entry entry) {
    if (slot >= slots_.size()) slots_.resize(std::size_t{slot} + 1);
    make_live(slot, std::move(entry));
  }
  /// The sender released `slot`: its entry is destroyed. Throws ProtocolError when it holds nothing.
  void release(std::uint32_t slot) {
    if (find(slot) == nullptr) throw_not_held(slot);
    unlist(slot);  // destroys the entry
    slots_[slot].state = State::Free;
  }
  /// Empties the table (the connection closed).
  void clear() noexcept {
    slots_.clear();
    live_.clear();
    free_.clear();
    unannounced_.clear();
    announced_ = 0;
    next_ = 0;
  }

 private:
  struct Slot {
    State state = State::Free;
    bool awaits_return = false;
    std::uint32_t live_at = 0;  // Live: index in live_
    Entry entry{};
  };
  std::uint32_t next_number() {
    if (next_ >= capacity_) throw_exhausted();
    slots_.resize(std::size_t{next_} + 1);
    return next_++;
  }
  std::uint32_t pop_free() noexcept {
    const std::uint32_t slot = free_.back();
    free_.pop_back();
    return slot;
  }
  Slot& make_live(std::uint32_t slot, Entry entry) {
    Slot& info = slots_[slot];
    info.state = State::Live;
    info.entry = std::move(entry);
    info.live_at = static_cast<std::uint32_t>(live_.size());
    live_.push_back(slot);
    return info;
  }
  // Removes a Live slot from live_ (swap-remove) and drops its entry.
  void unlist(std::uint32_t slot) noexcept {
    Slot& info = slots_[slot];
    const std::uint32_t moved = live_.back();
    live_[info.live_at] = moved;
    slots_[moved].live_at = info.live_at;
    live_.pop_back();
    info.entry = Entry{};
  }
  void settle_released(std::uint32_t slot) {
    if (slots_[slot].awaits_return) {
      slots_[slot].state = State::Released;
      return;
    }
    slots_[slot] = Slot{};
    free_.push_back(slot);
  }
  [[noreturn]] void throw_exhausted() const {
    const std::string advice = *names_.advice != '\0' ? std::string("; ") + names_.advice : std::string();
    throw Error("the receiver holds " + std::to_string(capacity_) + " " + names_.leased +
                " of this channel, the most one channel can track" + advice);
  }
  [[noreturn]] void throw_above_capacity(std::uint32_t slot, std::size_t index) const {
    throw ProtocolError(std::string(names_.entry) + " " + std::to_string(index) + " asks for " + names_.slot + " " +
                        std::to_string(slot) + ", above the limit of " + std::to_string(capacity_));
  }
  [[noreturn]] void throw_reused(std::uint32_t slot, std::size_t index) const {
    throw ProtocolError(std::string(names_.entry) + " " + std::to_string(index) + " reuses " + names_.slot + " " +
                        std::to_string(slot) + " before releasing it");
  }
  [[noreturn]] void throw_not_held(std::uint32_t slot) const {
    throw ProtocolError(std::string("frame releases ") + names_.slot + " " + std::to_string(slot) +
                        " which holds no lease");
  }

  std::uint32_t capacity_;
  SlotNames names_;
  std::vector<Slot> slots_;                 // by slot number
  std::vector<std::uint32_t> live_;         // the Live slots
  std::vector<std::uint32_t> free_;         // numbers to reuse (the sending end)
  std::vector<std::uint32_t> unannounced_;  // Dying slots, in the order they died
  std::size_t announced_ = 0;               // the first of unannounced_ that the frame announces
  std::uint32_t next_ = 0;                  // the lowest number never used
  std::uint64_t seen_deaths_ = 0;
};

}  // namespace ferry::detail
