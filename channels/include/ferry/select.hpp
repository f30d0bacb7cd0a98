// Waiting on many receivers at once, of any message types, from one thread: the fan-in
// of a collector that reads from many workers without a thread per channel.
#pragma once

#include <poll.h>
#include <chrono>
#include <cstddef>
#include <optional>
#include <vector>

#include "ferry/channel.hpp"

namespace ferry {

class Listener;
namespace detail {
class ListenerCore;
struct SelectorWaitPlan;  // what one pass of Selector's wait looks at (select.cpp)
/// What a Selector waits on: a receiver's frame core, an InProcess receiver's queue, or a
/// listener (endpoint.hpp); exactly one is set.
struct SelectorMember {
  ReceiverCore* core = nullptr;
  const InProcessQueue* queue = nullptr;
  ListenerCore* listener = nullptr;
  explicit operator bool() const noexcept { return core != nullptr || queue != nullptr || listener != nullptr; }
};
}  // namespace detail

/// A set of receivers to wait on. add() returns an index that stays valid until
/// remove(); wait() returns the index of a receiver that is ready: its recv() returns
/// without waiting for the peer to *begin* a message (a whole frame is buffered, data or
/// a hang-up arrived, or the end is closed). It may still wait for the rest of a frame
/// that is arriving; try_recv() never waits and resumes a partial frame later.
///
/// A receiver that reached end-of-stream stays ready for ever: remove() it once its
/// recv() returned std::nullopt (or threw). Ready receivers are served round-robin, so a
/// busy one cannot starve the others. The Selector keeps references: a receiver must
/// stay alive (it may be moved) while it is in the set. Use from one thread. Receivers of
/// every transport mix: threads (Transport::InProcess) and processes fan in together.
///
/// A Listener (endpoint.hpp) can be in the set too: it is ready when a client of a kind it
/// serves completed its handshake and waits; take it with the matching accept_*_for()
/// (a zero timeout does not wait). While the Selector waits, it advances the listener's
/// handshakes.
///
/// ```cpp
/// ferry::Selector selector;
/// for (auto& rx : results) selector.add(rx);
/// while (!selector.empty()) {
///   const std::size_t i = selector.wait();
///   if (auto result = results[i].recv()) handle(*result);
///   else selector.remove(i);                      // that worker closed its end
/// }
/// ```
class Selector {
 public:
  /// Adds `receiver` to the set; returns its index (indices count up from 0 and are
  /// never reused). Throws Error for an empty Receiver (moved from or default-constructed).
  template <class T>
  std::size_t add(Receiver<T>& receiver) {
    return add_member(receiver.end_.selector_member());
  }
  /// Adds `listener` to the set (it must stay alive while it is in the set); returns its index.
  std::size_t add(Listener& listener);
  /// Removes receiver `index` from the set (no effect when it was removed already).
  void remove(std::size_t index);
  /// Whether receiver `index` is in the set.
  bool contains(std::size_t index) const noexcept;
  /// The number of receivers in the set.
  std::size_t size() const noexcept { return active_; }
  bool empty() const noexcept { return active_ == 0; }

  /// Waits until a receiver is ready; returns its index. Throws Error when the set is empty.
  std::size_t wait();
  /// Waits at most `timeout`; std::nullopt when no receiver became ready.
  std::optional<std::size_t> wait_for(Timeout timeout);
  /// Returns a ready receiver's index without waiting, if there is one.
  std::optional<std::size_t> try_wait();

 private:
  std::size_t add_member(const detail::SelectorMember& member);
  // Advances the listeners in the set whose descriptors reported events (or whose
  // handshakes' deadlines passed) and marks those with a waiting client in `ready`.
  void advance_listeners(const std::vector<pollfd>& fds, const std::vector<std::size_t>& owners,
                         std::vector<bool>& ready);
  std::optional<std::size_t> wait_until(const detail::Deadline& deadline);
  // Polls the plan's descriptors once, within its timeout, and marks what is ready in it;
  // false when a signal interrupted the wait.
  bool poll_once(detail::SelectorWaitPlan& plan);
  // The next ready index, round-robin from next_.
  std::optional<std::size_t> pick(const std::vector<bool>& ready);

  std::vector<detail::SelectorMember> members_;  // empty once removed
  std::size_t listener_count_ = 0;
  std::size_t active_ = 0;
  std::size_t next_ = 0;      // where the round-robin scan starts
  bool futexes_work_ = true;  // false once futex_waitv turned out to be missing
};

}  // namespace ferry
