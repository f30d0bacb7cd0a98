// Transport::InProcess: a channel between threads of one process. Values of T are moved
// through a moodycamel BlockingConcurrentQueue, never serialized; tensors inside them are
// the very same objects on both sides.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <utility>

#include "ferry/detail/deadline.hpp"
#include "ferry/detail/transport.hpp"

namespace ferry::detail {

/// A value of some type on its way through an in-process channel.
class Parcel {
 public:
  virtual ~Parcel() = default;
};

/// A value of T on its way through an in-process channel.
template <class T>
class ParcelOf final : public Parcel {
 public:
  explicit ParcelOf(T&& moved) : value(std::move(moved)) {}
  T value;
};

/// The state both ends of an in-process channel share, without the value type: a queue of
/// parcels (an empty one marks the end of the stream) and a semaphore that counts free
/// places, so that a sender blocks while `capacity` values wait. Values sent from one
/// thread arrive in the order that thread sent them. The queue itself lives in
/// in_process_channel.cpp, so that only that file compiles moodycamel's queue.
///
/// End of stream: the queue keeps FIFO order per sending thread only, so the end marker
/// may overtake values sent earlier from other threads. close_sender() therefore records
/// how many values were sent in all, and the receiver reports the end only once it has
/// received that many.
class InProcessQueue {
 public:
  explicit InProcessQueue(std::size_t capacity);
  ~InProcessQueue();
  InProcessQueue(const InProcessQueue&) = delete;
  InProcessQueue& operator=(const InProcessQueue&) = delete;

  /// Takes one free place, waiting until `deadline`; false on timeout. Throws
  /// ChannelClosed when the receiver closed.
  bool reserve(const Deadline& deadline);
  /// Queues `parcel` in a place taken by reserve(). Throws ChannelClosed (and gives the
  /// place back) when either end closed meanwhile.
  void push(std::unique_ptr<Parcel> parcel);
  /// Ends the stream after the values sent so far. Idempotent.
  void close_sender() noexcept;
  /// Neither end has closed.
  bool sender_open() const noexcept;

  /// Takes the next parcel, waiting until `deadline`. One receiving thread at a time.
  ReadStatus receive(std::unique_ptr<Parcel>& out, const Deadline& deadline);
  /// Closes the receiving end: senders (also those waiting for room) get ChannelClosed,
  /// and the values still queued are destroyed.
  void close_receiver() noexcept;
  bool receiver_open() const noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// The sending end's share of an in-process channel of T; closing (or destroying) it
/// ends the stream. Move-only; empty after a move.
template <class T>
class InProcessSender {
 public:
  InProcessSender() = default;
  explicit InProcessSender(std::shared_ptr<InProcessQueue> queue) : queue_(std::move(queue)) {}
  InProcessSender(InProcessSender&&) noexcept = default;
  InProcessSender& operator=(InProcessSender&& other) noexcept {
    if (this != &other) {
      close();
      queue_ = std::move(other.queue_);
    }
    return *this;
  }
  ~InProcessSender() { close(); }

  explicit operator bool() const noexcept { return queue_ != nullptr; }
  /// Moves `value` into the channel once there is room; false (and `value` untouched)
  /// when the deadline passed first.
  bool send(T&& value, const Deadline& deadline) {
    if (!queue_->reserve(deadline)) return false;
    std::unique_ptr<Parcel> parcel;
    try {
      parcel = std::make_unique<ParcelOf<T>>(std::move(value));
    } catch (...) {
      queue_->push(nullptr);  // gives the place back
      throw;
    }
    queue_->push(std::move(parcel));
    return true;
  }
  void close() noexcept {
    if (queue_) queue_->close_sender();
  }
  bool is_open() const noexcept { return queue_ && queue_->sender_open(); }

 private:
  std::shared_ptr<InProcessQueue> queue_;
};

/// The receiving end's share of an in-process channel of T; closing (or destroying) it
/// makes further sends fail. Move-only; empty after a move.
template <class T>
class InProcessReceiver {
 public:
  InProcessReceiver() = default;
  explicit InProcessReceiver(std::shared_ptr<InProcessQueue> queue) : queue_(std::move(queue)) {}
  InProcessReceiver(InProcessReceiver&&) noexcept = default;
  InProcessReceiver& operator=(InProcessReceiver&& other) noexcept {
    if (this != &other) {
      close();
      queue_ = std::move(other.queue_);
    }
    return *this;
  }
  ~InProcessReceiver() { close(); }

  explicit operator bool() const noexcept { return queue_ != nullptr; }
  /// Moves the next value into `out`, waiting until `deadline`.
  ReadStatus receive(std::optional<T>& out, const Deadline& deadline) {
    std::unique_ptr<Parcel> parcel;
    const ReadStatus status = queue_->receive(parcel, deadline);
    // Both ends were made for T by channel<T>(): every parcel holds a T.
    if (status == ReadStatus::Frame) out.emplace(std::move(static_cast<ParcelOf<T>&>(*parcel).value));
    return status;
  }
  void close() noexcept {
    if (queue_) queue_->close_receiver();
  }
  bool is_open() const noexcept { return queue_ && queue_->receiver_open(); }

 private:
  std::shared_ptr<InProcessQueue> queue_;
};

}  // namespace ferry::detail
