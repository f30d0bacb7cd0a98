#include "ferry/select.hpp"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <optional>
#include <span>

#include "ends/in_process_queue.hpp"
#include "ferry/detail/frame_channel.hpp"
#include "ferry/endpoint.hpp"
#include "ferry/wait_interruption.hpp"
#include "ring/futex.hpp"
#include "ring/ring_layout.hpp"

namespace ferry {
namespace {

// How often a transport without a pollable descriptor is re-checked (an in-process queue,
// or rings in a set that also holds pipes or sockets, or on a kernel without futex_waitv).
constexpr std::chrono::microseconds kRecheckInterval{200};
// While only rings wait, how often their companion sockets are polled for a dead writer.
constexpr std::chrono::milliseconds kHangUpCheckInterval{100};
// How often a receiver whose descriptor is a hint (a UCX worker's wake-up fd) is looked at
// without a wake-up: UCX before 1.14 may leave the fd quiet for a frame that arrived.
constexpr std::chrono::milliseconds kHintRecheckInterval{50};
using Clock = std::chrono::steady_clock;

// True when the member's recv() would return without waiting for the peer to begin a message.
bool has_buffered_frame(const detail::SelectorMember& member) {
  return member.core != nullptr ? member.core->has_buffered_frame() : member.queue->ready();
}

}  // namespace

// What one pass of Selector::wait_until() looks at, gathered from the members: what is
// ready already, the descriptors to poll, and the receivers no descriptor reports data for.
struct detail::SelectorWaitPlan {
  std::vector<bool> ready;
  std::vector<pollfd> fds;
  std::vector<std::size_t> owners;                          // fds[i] belongs to members_[owners[i]]
  std::vector<std::size_t> silent;                          // receivers whose arriving data no descriptor reports
  std::vector<std::size_t> hinted;                          // receivers whose descriptor is a hint that may be missed
  std::vector<std::atomic<std::uint32_t>*> words;           // the futex words of silent receivers that have one
  std::vector<std::size_t> word_owners;                     // words[i] belongs to members_[word_owners[i]]
  bool any_buffered = false;                                // a member is ready without waiting
  bool stream_fds = false;                                  // a descriptor reports data (futexes cannot wait with it)
  detail::Deadline poll_until = detail::Deadline::never();  // earlier than the caller's when a handshake expires first

  void reset(std::size_t count, const detail::Deadline& deadline) {
    ready.assign(count, false);
    fds.clear();
    owners.clear();
    silent.clear();
    hinted.clear();
    words.clear();
    word_owners.clear();
    any_buffered = stream_fds = false;
    poll_until = deadline;
  }

  void add_listener(std::size_t index, detail::ListenerCore& listener) {
    if (!listener.is_open()) return;
    if (listener.has_waiting_client()) {
      ready[index] = any_buffered = true;
      return;
    }
    const std::size_t first = fds.size();
    listener.append_poll_fds(fds);
    owners.resize(fds.size(), index);
    stream_fds = stream_fds || fds.size() > first;
    const detail::Deadline handshakes = listener.next_deadline();
    if (handshakes.time_point() < poll_until.time_point()) poll_until = handshakes;
  }

  void add_receiver(std::size_t index, const detail::SelectorMember& member) {
    // Frames already in user space count as ready: poll() cannot see them.
    if (has_buffered_frame(member)) {
      ready[index] = any_buffered = true;
      return;
    }
    if (member.queue != nullptr) {  // an in-process queue: no descriptor, no futex word
      silent.push_back(index);
      return;
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
      if (reports_data && core->readiness_fd_is_a_hint()) hinted.push_back(index);
    }
    if (reports_data) return;
    // Without a descriptor that reports data: sleep on its futex word, or re-check it at
    // short intervals.
    silent.push_back(index);
    if (std::atomic<std::uint32_t>* word = core->data_futex()) {
      words.push_back(word);
      word_owners.push_back(index);
    }
  }

  bool nothing_can_wake() const { return fds.empty() && silent.empty() && !any_buffered; }

  // Only rings (and nothing else) wait: they can sleep on their futex words together.
  bool only_rings_wait() const {
    return !any_buffered && !silent.empty() && words.size() == silent.size() && !stream_fds &&
           words.size() <= kMaxFutexWaitWords;
  }

  // How long ppoll() may sleep (nullptr: for ever). With a frame buffered it only looks, so
  // the pick among everything ready stays fair; silent receivers cap it at kRecheckInterval,
  // hinted ones at kHintRecheckInterval.
  const timespec* poll_timeout(timespec& storage) const {
    if (any_buffered) {
      storage = timespec{};
      return &storage;
    }
    std::optional<std::chrono::nanoseconds> recheck;
    if (!silent.empty()) {
      recheck = kRecheckInterval;
    } else if (!hinted.empty()) {
      recheck = kHintRecheckInterval;
    }
    // The thread's wait-interruption check, when installed, is due at most this far away;
    // and a long wait wakes every kReleaseCheck to let go of copies of ends owned elsewhere
    // (live_ends.hpp; Selector::wait_until).
    if (const auto slice = detail::wait_interruption_slice(); slice != std::chrono::nanoseconds::max()) {
      recheck = recheck ? std::min(*recheck, slice) : slice;
    }
    recheck = recheck ? std::min<std::chrono::nanoseconds>(*recheck, kReleaseCheck) : kReleaseCheck;
    const std::chrono::nanoseconds left = poll_until.is_never() ? *recheck : poll_until.remaining();
    const std::chrono::nanoseconds sleep = recheck ? std::min(left, *recheck) : left;
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(sleep);
    storage = timespec{static_cast<std::time_t>(seconds.count()), static_cast<long>((sleep - seconds).count())};
    return &storage;
  }

  // Marks the receivers whose descriptors reported events (listeners are advanced apart).
  void mark_polled(const std::vector<detail::SelectorMember>& members) {
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const detail::SelectorMember& member = members[owners[i]];
      if (member.listener != nullptr) continue;
      // A hint (a UCX worker's wake-up) counts only once a frame is there.
      ready[owners[i]] = !member.core->readiness_fd_is_a_hint() || member.core->has_buffered_frame();
    }
  }

  // Receivers without a descriptor that reports data, and those whose descriptor is a hint,
  // are looked at again after the wait.
  void recheck_silent(const std::vector<detail::SelectorMember>& members) {
    for (const std::size_t index : silent) {
      if (!ready[index] && has_buffered_frame(members[index])) ready[index] = true;
    }
    for (const std::size_t index : hinted) {
      if (!ready[index] && has_buffered_frame(members[index])) ready[index] = true;
    }
  }
};

namespace {

// Sleeps until a ring of the plan's words gets data, a writer behind its hang-up
// descriptors dies, the deadline passes or kHangUpCheckInterval elapses, and marks in
// plan.ready what is ready. False when the kernel has no futex_waitv (nothing waited).
bool wait_on_futexes(const std::vector<detail::SelectorMember>& members, detail::SelectorWaitPlan& plan,
                     const detail::Deadline& deadline) {
  const std::span<std::atomic<std::uint32_t>* const> words(plan.words);
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
      if (has_buffered_frame(members[plan.word_owners[i]])) plan.ready[plan.word_owners[i]] = any = true;
    }
    // The companion sockets report a writer's death (nothing else is ever sent on them).
    while (!plan.fds.empty()) {
      const int rc = ::poll(plan.fds.data(), plan.fds.size(), 0);
      if (rc >= 0) {
        for (std::size_t i = 0; rc > 0 && i < plan.fds.size(); ++i) {
          if (plan.fds[i].revents != 0) plan.ready[plan.owners[i]] = any = true;
        }
        break;
      }
      if (errno != EINTR) throw_errno("poll in Selector::wait");
    }
  };
  look();
  if (any || deadline.expired()) return true;
  // Wake up at the deadline, and every kHangUpCheckInterval to look for dead writers.
  const auto until = std::min(
      deadline.time_point(),
      Clock::now() + std::min<std::chrono::nanoseconds>(kHangUpCheckInterval, detail::wait_interruption_slice()));
  if (!futex_wait_any(words, kRingSleeping, until)) return false;
  look();
  return true;
}

}  // namespace

std::size_t Selector::add_member(const detail::SelectorMember& member) {
  if (!member) {
    throw Error(
        "Selector::add(): this Receiver is empty (moved from or default-constructed); add the Receiver "
        "that channel() or duplex() made, or the one it was moved into");
  }
  members_.push_back(member);
  ++active_;
  return members_.size() - 1;
}

std::size_t Selector::add(Listener& listener) {
  detail::SelectorMember member;
  member.listener = &detail::EndAccess::core(listener);
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
      if (listener->pump(detail::Deadline::now())) ready[index] = true;
    } else if (listener->has_waiting_client()) {
      ready[index] = true;
    }
  }
}

std::size_t Selector::wait() {
  if (empty()) throw Error("Selector::wait() on an empty set would wait for ever; add a receiver first");
  return *wait_until(detail::Deadline::never());
}

std::optional<std::size_t> Selector::wait_for(Timeout timeout) { return wait_until(detail::Deadline::after(timeout)); }

std::optional<std::size_t> Selector::try_wait() { return wait_until(detail::Deadline::now()); }

std::optional<std::size_t> Selector::wait_until(const detail::Deadline& deadline) {
  detail::SelectorWaitPlan plan;
  // Waiting for long, every kReleaseCheck: let go of copies of ends other processes took,
  // one of which may be what keeps a member's peer from ending (live_ends.hpp). The clock
  // is read only after a round that found nothing ready.
  std::optional<detail::Deadline::Clock::time_point> next_release;
  const auto after_idle_round = [&next_release] {
    const detail::Deadline::Clock::time_point now = detail::Deadline::Clock::now();
    if (next_release && now >= *next_release) {
      detail::release_ends_owned_elsewhere();
      next_release.reset();
    }
    if (!next_release) next_release = now + detail::kReleaseCheck;
  };
  while (true) {
    plan.reset(members_.size(), deadline);
    for (std::size_t index = 0; index < members_.size(); ++index) {
      const detail::SelectorMember& member = members_[index];
      if (member.listener != nullptr) {
        plan.add_listener(index, *member.listener);
      } else if (member) {
        plan.add_receiver(index, member);
      }
    }
    if (plan.nothing_can_wake()) {
      if (!deadline.is_never()) return std::nullopt;
      throw Error("Selector::wait(): no receiver in the set can become ready");
    }
    if (futexes_work_ && plan.only_rings_wait()) {
      if (wait_on_futexes(members_, plan, deadline)) {
        if (const auto index = pick(plan.ready)) return index;
        if (deadline.expired()) return std::nullopt;
        after_idle_round();
        detail::wait_interruption_point();  // may throw: nothing was taken
        continue;
      }
      futexes_work_ = false;  // futex_waitv is missing (Linux before 5.16): re-check instead
    }
    if (!poll_once(plan)) {  // interrupted by a signal
      detail::wait_interruption_point(true);
      continue;
    }
    if (const auto index = pick(plan.ready)) return index;
    if (deadline.expired()) return std::nullopt;
    after_idle_round();
    detail::wait_interruption_point();  // may throw: nothing was taken
  }
}

bool Selector::poll_once(detail::SelectorWaitPlan& plan) {
  timespec storage{};
  const timespec* timeout = plan.poll_timeout(storage);
  const bool look_only = timeout != nullptr && timeout->tv_sec == 0 && timeout->tv_nsec == 0;
  const int rc = plan.fds.empty() && look_only ? 0 : ::ppoll(plan.fds.data(), plan.fds.size(), timeout, nullptr);
  if (rc < 0) {
    if (errno == EINTR) return false;
    throw_errno("ppoll in Selector::wait");
  }
  if (rc > 0) plan.mark_polled(members_);
  advance_listeners(plan.fds, plan.owners, plan.ready);
  plan.recheck_silent(members_);
  return true;
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
