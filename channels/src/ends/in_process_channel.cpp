// GCC 12 warns that ThreadSanitizer cannot see std::atomic_thread_fence, which moodycamel's
// queue uses; the warning cannot be scoped to the queue's header (it is reported at
// <atomic>), so it is off for this file only, the one file that compiles the queue.
#if defined(__SANITIZE_THREAD__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic ignored "-Wtsan"
#endif

#include "ends/in_process_queue.hpp"

#include <concurrentqueue/blockingconcurrentqueue.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <string>

#include "ferry/detail/live_ends.hpp"
#include "ferry/detail/thread_annotations.hpp"
#include "ferry/error.hpp"
#include "ferry/introspection.hpp"
#include "ferry/wait_interruption.hpp"

namespace ferry::detail {
namespace {

bool is_poll(const Deadline& deadline) {
  return deadline.time_point() == Deadline::Clock::time_point::min() || deadline.expired();
}

// Runs `wait_for(microseconds)` (a timed wait of the queue or its semaphore; true when it
// got what it waits for) until it succeeds or `deadline` passes, in slices that honour the
// thread's wait-interruption check (such a wait sleeps on through a signal).
template <class WaitFor>
bool wait_in_slices(const Deadline& deadline, const WaitFor& wait_for) {
  while (true) {
    bool sliced = false;
    const std::chrono::nanoseconds limit = sleep_limit(deadline, sliced, detail::SignalWake::Deaf);
    const std::int64_t micros = std::max<std::int64_t>(1, (limit.count() + 999) / 1000);
    if (wait_for(micros)) return true;
    if (!sliced) return false;
    wait_interruption_point(false, detail::SignalWake::Deaf);
  }
}

[[noreturn]] void throw_receiver_closed() {
  throw ChannelClosed("cannot send: the receiving end of the in-process channel was closed");
}

[[noreturn]] void throw_sender_dropped() {
  throw PeerDied(
      "the Sender of this in-process channel was destroyed by an exception before it closed the stream (its "
      "thread failed): the values it sent were all received, but the stream was cut short, not ended");
}

}  // namespace

struct InProcessQueue::State {
  explicit State(std::size_t capacity)
      : room(static_cast<moodycamel::LightweightSemaphore::ssize_t>(
            std::clamp<std::size_t>(capacity, 1, std::numeric_limits<int>::max() / 4))) {}

  moodycamel::BlockingConcurrentQueue<std::unique_ptr<Parcel>> queue;
  // Every value goes in through this one token, under `mutex`: the queue keeps the order of
  // one producer only, and the n-th value taken must be the n-th sent (taken() counts them).
  moodycamel::ProducerToken producer FERRY_GUARDED_BY(mutex){queue};
  std::atomic<std::uint64_t> taken{0};  // values the receiver took
  moodycamel::LightweightSemaphore room;
  mutable detail::Mutex mutex;  // orders sends against close_sender() and close_receiver()
  std::uint64_t sent FERRY_GUARDED_BY(mutex) = 0;
  bool sender_closed FERRY_GUARDED_BY(mutex) = false;
  std::atomic<bool> sender_dropped{false};  // the sender was destroyed by an exception
  std::atomic<bool> receiver_closed{false};
  std::atomic<std::uint64_t> final_count{0};
  // The receiving thread's own state.
  std::uint64_t received = 0;
  bool end_seen = false;
};

InProcessQueue::InProcessQueue(std::size_t capacity, std::string label)
    : state_(std::make_unique<State>(capacity)),
      label_(std::move(label)),
      sender_id_(next_end_id()),
      receiver_id_(next_end_id()) {
  list();
}

InProcessQueue::~InProcessQueue() { unlist(); }

void InProcessQueue::describe(Snapshot& out) const {
  const State& s = *state_;
  const std::uint64_t taken = s.taken.load(std::memory_order_acquire);
  const bool receiver_closed = s.receiver_closed.load(std::memory_order_acquire);
  // A send in progress holds the mutex: then the sender is open, and what it sent is what
  // was taken plus what the queue holds.
  std::uint64_t sent = taken + s.queue.size_approx();
  bool sender_closed = false;
  if (s.mutex.try_lock()) {
    const MutexLock lock(s.mutex, std::adopt_lock);
    sent = s.sent;
    sender_closed = s.sender_closed;
  }
  const pid_t here = current_process_id();
  for (const bool sends : {true, false}) {
    EndSnapshot& end = out.ends.emplace_back();
    end.id = sends ? sender_id_ : receiver_id_;
    end.sends = sends;
    end.label = label_;
    end.transport = std::string(transport_name(Transport::InProcess));
    if (here == creator_) end.peer_pid = here;  // a fork()'s copy reaches nobody
    const bool closed = receiver_closed || (sends && sender_closed);
    end.state = !sends && s.sender_dropped.load(std::memory_order_relaxed) ? "peer_died" : closed ? "closed" : "open";
    end.messages = sends ? sent : taken;
    if (sends) end.in_flight = sent > taken ? sent - taken : 0;
  }
}

void InProcessQueue::throw_other_process(const char* role) const {
  throw EndOwnedElsewhere(std::string("this InProcess ") + role + " belongs to process " + std::to_string(creator_) +
                              ", which made the channel; this process holds a copy inherited through fork(), and "
                              "what it sends or takes never reaches the other process. Create the channel with "
                              "Transport::Pipe, UnixSocket or ShmRing to reach another process",
                          role, creator_, true, EndOwnedElsewhere::Reason::UsedElsewhere);
}

bool InProcessQueue::reserve(const Deadline& deadline) {
  if (state_->receiver_closed.load(std::memory_order_acquire)) throw_receiver_closed();
  if (is_poll(deadline)) return state_->room.tryWait();
  if (deadline.is_never() && !wait_interruptible()) return state_->room.wait();
  return wait_in_slices(deadline, [&](std::int64_t micros) { return state_->room.wait(micros); });
}

void InProcessQueue::push(std::unique_ptr<Parcel> parcel) {
  detail::MutexLock lock(state_->mutex);
  if (!parcel || state_->sender_closed || state_->receiver_closed.load(std::memory_order_acquire)) {
    lock.unlock();
    state_->room.signal();
    if (!parcel) return;  // a sender giving its place back
    if (state_->receiver_closed.load(std::memory_order_acquire)) throw_receiver_closed();
    throw ChannelClosed("cannot send: this Sender was closed");
  }
  if (!state_->queue.enqueue(state_->producer, std::move(parcel))) {
    lock.unlock();
    state_->room.signal();
    throw std::bad_alloc();
  }
  ++state_->sent;
}

void InProcessQueue::close_sender() noexcept { end_stream(false); }

void InProcessQueue::drop_sender() noexcept { end_stream(true); }

void InProcessQueue::end_stream(bool dropped) noexcept {
  const detail::MutexLock lock(state_->mutex);
  if (state_->sender_closed) return;
  state_->sender_closed = true;
  state_->sender_dropped.store(dropped, std::memory_order_relaxed);  // published by final_count
  state_->final_count.store(state_->sent, std::memory_order_release);
  // enqueue fails only when memory is exhausted; the receiver would then wait for the end.
  (void)state_->queue.enqueue(state_->producer, nullptr);
}

bool InProcessQueue::sender_open() const noexcept {
  const detail::MutexLock lock(state_->mutex);
  return !state_->sender_closed && !state_->receiver_closed.load(std::memory_order_acquire);
}

ReadStatus InProcessQueue::receive(std::unique_ptr<Parcel>& out, const Deadline& deadline) {
  State& s = *state_;
  while (true) {
    if (s.receiver_closed.load(std::memory_order_acquire)) return ReadStatus::Closed;
    if (s.end_seen && s.received == s.final_count.load(std::memory_order_acquire)) {
      if (s.sender_dropped.load(std::memory_order_relaxed)) throw_sender_dropped();
      return ReadStatus::Closed;
    }
    std::unique_ptr<Parcel> parcel;
    if (deadline.is_never() && !wait_interruptible()) {
      s.queue.wait_dequeue(parcel);
    } else if (is_poll(deadline) ? !s.queue.try_dequeue(parcel) : !wait_in_slices(deadline, [&](std::int64_t micros) {
                 return s.queue.wait_dequeue_timed(parcel, micros);
               })) {
      return ReadStatus::Timeout;
    }
    if (!parcel) {  // the end marker: values from other threads may still be on their way
      s.end_seen = true;
      continue;
    }
    ++s.received;
    s.taken.fetch_add(1, std::memory_order_release);
    s.room.signal();
    out = std::move(parcel);
    return ReadStatus::Frame;
  }
}

void InProcessQueue::close_receiver() noexcept {
  {
    const detail::MutexLock lock(state_->mutex);
    if (state_->receiver_closed.load(std::memory_order_relaxed)) return;
    state_->receiver_closed.store(true, std::memory_order_release);
  }
  state_->room.signal(std::numeric_limits<int>::max() / 4);  // wake every sender waiting for room
  std::unique_ptr<Parcel> parcel;
  while (state_->queue.try_dequeue(parcel)) parcel.reset();
}

bool InProcessQueue::ready() const noexcept {
  const State& s = *state_;
  return s.receiver_closed.load(std::memory_order_acquire) || s.queue.size_approx() > 0 ||
         (s.end_seen && s.received == s.final_count.load(std::memory_order_acquire));
}

std::uint64_t InProcessQueue::sent() const noexcept {
  const detail::MutexLock lock(state_->mutex);
  return state_->sent;
}

std::uint64_t InProcessQueue::taken() const noexcept { return state_->taken.load(std::memory_order_acquire); }

bool InProcessQueue::receiver_open() const noexcept { return !state_->receiver_closed.load(std::memory_order_acquire); }

}  // namespace ferry::detail
