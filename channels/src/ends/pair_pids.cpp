#include "ends/pair_pids.hpp"

#include <atomic>
#include <cstdint>

#include "ends/claim_pages.hpp"

namespace ferry::detail {

namespace {

constexpr std::uint64_t kPidHalf = 0xffff'ffffULL;

unsigned pid_half_shift(bool sender) noexcept { return sender ? 0 : 32; }

std::uint64_t both_halves(pid_t pid) noexcept {
  const auto half = static_cast<std::uint64_t>(static_cast<std::uint32_t>(pid));
  return half | (half << 32);
}

}  // namespace

PairPids::PairPids() : slot_(take_claim_word(both_halves(current_process_id()))) {}

PairPids::~PairPids() { give_back_claim_word(slot_); }

void PairPids::set(bool sender, pid_t pid) noexcept {
  const unsigned shift = pid_half_shift(sender);
  const std::uint64_t half = static_cast<std::uint64_t>(static_cast<std::uint32_t>(pid)) << shift;
  std::uint64_t word = slot_.word->load(std::memory_order_relaxed);
  while (!slot_.word->compare_exchange_weak(word, (word & ~(kPidHalf << shift)) | half, std::memory_order_relaxed)) {
  }
}

pid_t PairPids::get(bool sender) const noexcept {
  const std::uint64_t word = slot_.word->load(std::memory_order_relaxed);
  return static_cast<pid_t>(static_cast<std::uint32_t>((word >> pid_half_shift(sender)) & kPidHalf));
}

}  // namespace ferry::detail
