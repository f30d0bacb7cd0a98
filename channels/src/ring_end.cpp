#include "ferry/ring_end.hpp"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ferry/error.hpp"
#include "ferry/futex.hpp"

namespace ferry::detail {

RingEnd::RingEnd(std::shared_ptr<const RingSegment> segment, UniqueFd companion, const RingTiming& timing)
    : segment_(std::move(segment)),
      data_(segment_->data()),
      capacity_(segment_->capacity()),
      companion_(std::move(companion)),
      timing_(timing) {}

void RingEnd::copy_in(std::uint64_t position, const std::byte* from, std::size_t size) const noexcept {
  const std::size_t at = static_cast<std::size_t>(position & (capacity_ - 1));
  const std::size_t first = std::min<std::size_t>(size, capacity_ - at);
  std::memcpy(data_ + at, from, first);
  if (first < size) std::memcpy(data_, from + first, size - first);
}

void RingEnd::copy_out(std::uint64_t position, std::byte* to, std::size_t size) const noexcept {
  const std::size_t at = static_cast<std::size_t>(position & (capacity_ - 1));
  const std::size_t first = std::min<std::size_t>(size, capacity_ - at);
  std::memcpy(to, data_ + at, first);
  if (first < size) std::memcpy(to + first, data_, size - first);
}

bool RingEnd::peer_gone() {
  if (peer_gone_) return true;
  if (!companion_) return peer_gone_ = true;
  next_peer_check_ = Deadline::Clock::now() + timing_.peer_check_interval;
  pollfd entry{companion_.get(), POLLRDHUP, 0};
  while (true) {
    const int rc = ::poll(&entry, 1, 0);
    if (rc >= 0) break;
    if (errno != EINTR) throw_errno("poll of a ring's companion socket");
  }
  // Nothing is ever written to the companion socket: any event means the peer is gone.
  peer_gone_ = (entry.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLIN)) != 0;
  return peer_gone_;
}

bool RingEnd::peer_gone_lately() {
  if (peer_gone_) return true;
  if (Deadline::Clock::now() < next_peer_check_) return false;
  return peer_gone();
}

WaitOutcome RingEnd::wait(std::atomic<std::uint32_t>& word, Condition ready, const Deadline& deadline) {
  if (ready()) return WaitOutcome::Ready;
  if (peer_gone_) return WaitOutcome::PeerGone;
  if (deadline.expired() || deadline.time_point() == Deadline::Clock::time_point::min()) {
    if (peer_gone_lately() && !ready()) return WaitOutcome::PeerGone;
    return ready() ? WaitOutcome::Ready : WaitOutcome::Timeout;
  }
  if (timing_.spin > std::chrono::nanoseconds::zero()) {
    const auto stop = std::min(Deadline::Clock::now() + timing_.spin, deadline.time_point());
    for (unsigned i = 1;; ++i) {
      cpu_relax();
      if (ready()) return WaitOutcome::Ready;
      if (i % 16 == 0 && Deadline::Clock::now() >= stop) break;
    }
  }
  return sleep(word, ready, deadline);
}

WaitOutcome RingEnd::sleep(std::atomic<std::uint32_t>& word, Condition ready, const Deadline& deadline) {
  struct Awake {  // leaves the word at 0 however the wait ends
    std::atomic<std::uint32_t>& word;
    ~Awake() { word.store(0, std::memory_order_relaxed); }
  } awake{word};
  while (true) {
    // Announce the sleep, then re-check. The store, the position loads in ready() and
    // the peer's publishing store and load of this word are all sequentially consistent:
    // either the peer sees the 1 and wakes us, or we see its new position.
    word.store(1, std::memory_order_seq_cst);
    if (ready()) return WaitOutcome::Ready;
    const auto now = Deadline::Clock::now();
    if (now >= next_peer_check_ && peer_gone()) return ready() ? WaitOutcome::Ready : WaitOutcome::PeerGone;
    if (deadline.expired()) return WaitOutcome::Timeout;
    auto timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(next_peer_check_ - now);
    if (!deadline.is_never()) timeout = std::min(timeout, deadline.remaining());
    futex_wait(word, 1, std::max(timeout, std::chrono::nanoseconds(1000)));
  }
}

void RingEnd::wake(std::atomic<std::uint32_t>& word) {
  if (word.load(std::memory_order_seq_cst) == 0) return;
  if (word.exchange(0, std::memory_order_seq_cst) != 0) futex_wake(word, 1);
}

void RingEnd::close() noexcept {
  segment_.reset();
  data_ = nullptr;
  companion_.reset();
}

std::vector<int> RingEnd::descriptors() const {
  std::vector<int> out;
  if (segment_) out.push_back(segment_->fd());
  if (companion_) out.push_back(companion_.get());
  return out;
}

}  // namespace ferry::detail
