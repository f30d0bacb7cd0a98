#include "ferry/select.hpp"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <span>

#include "ferry/endpoint.hpp"
#include "ring/futex.hpp"
#include "ring/ring_layout.hpp"

namespace ferry {
namespace {

// How often a transport without a pollable descriptor is re-checked (an in-process queue,
// or rings in a set that also holds pipes or sockets, or on a kernel without futex_waitv).
constexpr std::chrono::microseconds kRecheckInterval{200};
// While only rings wait, how often their companion sockets are polled for a dead writer.
constexpr std::chrono::milliseconds kHangUpCheckInterval{100};
using Clock = std::chrono::steady_clock;

// True when the member's recv() would return without waiting for the peer to begin a message.
bool has_buffered_frame(const detail::SelectorMember& member) {
  return member.core != nullptr ? member.core->has_buffered_frame() : member.queue->ready();
}

// Sleeps until a ring of `words` (owned by members[word_owners[i]]) gets data, a writer
// behind `hang_ups` dies, the deadline passes or kHangUpCheckInterval elapses, and marks
// in `ready` what is ready. False when the kernel has no futex_waitv (nothing waited).
bool wait_on_futexes(const std::vector<detail::SelectorMember>& members, std::span<std::atomic<std::uint32_t>* const> words,
                     std::span<const std::size_t> word_owners, std::span<pollfd> hang_ups,
                     std::span<const std::size_t> hang_up_owners, std::vector<bool>& ready, const Deadline& deadline) {
  struct Awake {  // leaves every word at 0 however the wait ends
    std::span<std::atomic<std::uint32_t>* const> words;
    ~Awake() {
      for (auto* word : words) word->store(0, std::memory_order_relaxed);
    }
  } awake{words};
  // Announce the sleep, then re-check: the writer publishes, then looks at the word (both
  // sequentially consistent, as in RingEnd::sleep), so either it sees the 1 and wakes us
  // or we see its data here.
  for (auto* word : words) word->store(kRingSleeping, std::memory_order_seq_cst);
  bool any = false;
  const auto look = [&] {
    for (std::size_t i = 0; i < words.size(); ++i) {
      if (has_buffered_frame(members[word_owners[i]])) ready[word_owners[i]] = any = true;
    }
    // The companion sockets report a writer's death (nothing else is ever sent on them).
    while (!hang_ups.empty()) {
      const int rc = ::poll(hang_ups.data(), hang_ups.size(), 0);
      if (rc >= 0) {
        for (std::size_t i = 0; rc > 0 && i < hang_ups.size(); ++i) {
          if (hang_ups[i].revents != 0) ready[hang_up_owners[i]] = any = true;
        }
        break;
      }
      if (errno != EINTR) throw_errno("poll in Selector::wait");
    }
  };
  look();
  if (any || deadline.expired()) return true;
  // Wake up at the deadline, and every kHangUpCheckInterval to look for dead writers.
  const auto until = std::min(deadline.time_point(), Clock::now() + kHangUpCheckInterval);
  if (!futex_wait_any(words, kRingSleeping, until)) return false;
  look();
  return true;
}

}  // namespace

std::size_t Selector::add_member(const detail::SelectorMember& member) {
  if (!member) {
    throw Error("Selector::add(): this Receiver is empty (moved from or default-constructed); add the Receiver "
                "that channel() or duplex() made, or the one it was moved into");
  }
  members_.push_back(member);
  ++active_;
  return members_.size() - 1;
}

std::size_t Selector::add(Listener& listener) {
  detail::SelectorMember member;
  member.listener = &listener.core();
  const std::size_t index = add_member(member);
  ++listener_count_;
  return index;
}

void Selector::remove(std::size_t index) {
  if (!contains(index)) return;
  if (members_[index].listener != nullptr) --listener_count_;
  members_[index] = detail::SelectorMember{};
  --active_;
}

bool Selector::contains(std::size_t index) const noexcept { return index < members_.size() && members_[index]; }

void Selector::advance_listeners(const std::vector<pollfd>& fds, const std::vector<std::size_t>& owners,
                                 std::vector<bool>& ready) {
  if (listener_count_ == 0) return;
  std::vector<bool> woken(members_.size(), false);
  for (std::size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents != 0 && members_[owners[i]].listener != nullptr) woken[owners[i]] = true;
  }
  for (std::size_t index = 0; index < members_.size(); ++index) {
    detail::ListenerCore* listener = members_[index].listener;
    if (listener == nullptr || !listener->is_open()) continue;
    if (woken[index] || listener->next_deadline().expired()) {
      if (listener->pump(Deadline::now())) ready[index] = true;
    } else if (listener->has_waiting_client()) {
      ready[index] = true;
    }
  }
}

std::size_t Selector::wait() {
  if (empty()) throw Error("Selector::wait() on an empty set would wait for ever; add a receiver first");
  return *wait_until(Deadline::never());
}

std::optional<std::size_t> Selector::wait_for(Timeout timeout) {
  return wait_until(Deadline::after(timeout));
}

std::optional<std::size_t> Selector::try_wait() { return wait_until(Deadline::now()); }

std::optional<std::size_t> Selector::wait_until(const Deadline& deadline) {
  const std::size_t count = members_.size();
  std::vector<bool> ready(count, false);
  std::vector<pollfd> fds;
  std::vector<std::size_t> owners;  // fds[i] belongs to members_[owners[i]]
  std::vector<std::size_t> silent;  // receivers whose arriving data no descriptor reports
  std::vector<std::atomic<std::uint32_t>*> words;  // the futex words of silent receivers that have one
  std::vector<std::size_t> word_owners;            // words[i] belongs to members_[word_owners[i]]
  while (true) {
    // Frames already in user space count as ready: poll() cannot see them.
    fds.clear();
    owners.clear();
    silent.clear();
    words.clear();
    word_owners.clear();
    std::fill(ready.begin(), ready.end(), false);
    bool any_buffered = false;
    bool stream_fds = false;  // a descriptor that reports data (futexes cannot wait with it)
    Deadline poll_until = deadline;  // earlier when a listener's handshake expires first
    for (std::size_t index = 0; index < count; ++index) {
      const detail::SelectorMember& member = members_[index];
      if (!member) continue;
      if (detail::ListenerCore* listener = member.listener) {
        if (!listener->is_open()) continue;
        if (listener->has_waiting_client()) {
          ready[index] = any_buffered = true;
          continue;
        }
        const std::size_t first = fds.size();
        listener->append_poll_fds(fds);
        owners.resize(fds.size(), index);
        stream_fds = stream_fds || fds.size() > first;
        const Deadline handshakes = listener->next_deadline();
        if (handshakes.time_point() < poll_until.time_point()) poll_until = handshakes;
        continue;
      }
      if (has_buffered_frame(member)) {
        ready[index] = any_buffered = true;
        continue;
      }
      if (member.queue != nullptr) {  // an in-process queue: no descriptor, no futex word
        silent.push_back(index);
        continue;
      }
      detail::ReceiverCore* core = member.core;
      const int fd = core->readiness_fd();
      const bool reports_data = fd >= 0 && core->readiness_fd_reports_data();
      if (fd >= 0) {
        // A descriptor that reports only a hang-up may carry other bytes (a ring's companion
        // socket carries segment fds): wait for the hang-up alone there.
        fds.push_back(pollfd{fd, static_cast<short>(reports_data ? POLLIN : POLLRDHUP), 0});
        owners.push_back(index);
        stream_fds = stream_fds || reports_data;
      }
      if (reports_data) continue;
      // Without a descriptor that reports data (a ring's companion socket reports only a
      // hang-up; an in-process queue has none): sleep on its futex word, or re-check it at
      // short intervals.
      silent.push_back(index);
      if (std::atomic<std::uint32_t>* word = core->data_futex()) {
        words.push_back(word);
        word_owners.push_back(index);
      }
    }
    if (fds.empty() && silent.empty() && !any_buffered) {
      if (!deadline.is_never()) return std::nullopt;
      throw Error("Selector::wait(): no receiver in the set can become ready");
    }
    // Only rings (and nothing else) wait: sleep on their futex words, as a ring's own
    // recv() does, instead of waking every kRecheckInterval.
    if (!any_buffered && !silent.empty() && words.size() == silent.size() && !stream_fds &&
        words.size() <= kMaxFutexWaitWords && futexes_work_) {
      if (wait_on_futexes(members_, words, word_owners, fds, owners, ready, deadline)) {
        if (const auto index = pick(ready)) return index;
        if (deadline.expired()) return std::nullopt;
        continue;
      }
      futexes_work_ = false;  // futex_waitv is missing (Linux before 5.16): re-check instead
    }

    // With a frame buffered, look at the descriptors without waiting: the pick among
    // everything ready must be fair.
    timespec zero{};
    timespec left{};
    const timespec* timeout = nullptr;
    if (any_buffered) {
      timeout = &zero;
    } else if (!poll_until.is_never()) {
      left = poll_until.remaining_timespec();
      timeout = &left;
    }
    timespec recheck{};
    if (!silent.empty() && !any_buffered) {
      recheck.tv_nsec = std::chrono::duration_cast<std::chrono::nanoseconds>(kRecheckInterval).count();
      if (timeout == nullptr || recheck.tv_sec < left.tv_sec ||
          (recheck.tv_sec == left.tv_sec && recheck.tv_nsec < left.tv_nsec)) {
        timeout = &recheck;
      }
    }
    const int rc = fds.empty() && timeout == &zero ? 0 : ::ppoll(fds.data(), fds.size(), timeout, nullptr);
    if (rc < 0) {
      if (errno == EINTR) continue;
      throw_errno("ppoll in Selector::wait");
    }
    for (std::size_t i = 0; rc > 0 && i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const detail::SelectorMember& member = members_[owners[i]];
      if (member.listener != nullptr) continue;  // advance_listeners() looks at those
      // A hint (a UCX worker's wake-up) counts only once a frame is there.
      ready[owners[i]] = !member.core->readiness_fd_is_a_hint() || member.core->has_buffered_frame();
    }
    advance_listeners(fds, owners, ready);
    // Receivers without a descriptor that reports data are looked at again after the wait.
    for (const std::size_t index : silent) {
      if (!ready[index] && has_buffered_frame(members_[index])) ready[index] = true;
    }
    if (const auto index = pick(ready)) return index;
    if (deadline.expired()) return std::nullopt;
  }
}

std::optional<std::size_t> Selector::pick(const std::vector<bool>& ready) {
  const std::size_t count = ready.size();
  for (std::size_t step = 0; step < count; ++step) {
    const std::size_t index = (next_ + step) % count;
    if (ready[index]) {
      next_ = index + 1;
      return index;
    }
  }
  return std::nullopt;
}

}  // namespace ferry
