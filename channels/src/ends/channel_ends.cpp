#include "ferry/detail/channel_ends.hpp"

#include <exception>
#include <string>
#include <tuple>
#include <utility>

#include "ends/in_process_queue.hpp"
#include "ends/pair_pids.hpp"
#include "ferry/detail/frame_channel.hpp"
#include "ferry/error.hpp"
#include "ferry/select.hpp"

namespace ferry::detail {
namespace {

[[noreturn]] void throw_no_frame_core(const char* end) {
  throw Error(std::string("an InProcess ") + end +
              " has no frame core: its values are moved through an in-process queue, never framed, so it cannot "
              "be described for or handed to another process, nor used where a pipe, socket or ring end is needed; "
              "create the channel with Transport::Pipe, UnixSocket or ShmRing for that");
}

[[noreturn]] void throw_empty(const char* end) {
  throw ChannelClosed(std::string("this ") + end + " is empty (moved from or default-constructed)");
}

}  // namespace

SenderEnd::SenderEnd() noexcept = default;
SenderEnd::SenderEnd(std::unique_ptr<SenderCore> core) noexcept : core_(std::move(core)) {}
SenderEnd::SenderEnd(std::shared_ptr<InProcessQueue> queue) noexcept : queue_(std::move(queue)) {}
SenderEnd::SenderEnd(SenderEnd&&) noexcept = default;

SenderEnd& SenderEnd::operator=(SenderEnd&& other) noexcept {
  if (this != &other) {
    if (queue_) queue_->close_sender();
    queue_ = std::move(other.queue_);
    core_ = std::move(other.core_);
  }
  return *this;
}

SenderEnd::~SenderEnd() {
  if (!queue_) return;
  if (std::uncaught_exceptions() == 0) {
    queue_->close_sender();
  } else {
    queue_->drop_sender();
  }
}

bool SenderEnd::send(const void* value, const SentType& type, const Deadline& deadline) {
  return core().send(value, type, deadline);
}

bool SenderEnd::send_local(void* value, MakeParcel make, const Deadline& deadline) {
  queue_->check_process("Sender");
  if (!queue_->reserve(deadline)) return false;
  std::unique_ptr<Parcel> parcel;
  try {
    parcel = make(value);
  } catch (...) {
    queue_->push(nullptr);  // gives the place back
    throw;
  }
  queue_->push(std::move(parcel));
  return true;
}

bool SenderEnd::flush(const Deadline& deadline) { return is_local() || core().flush(deadline); }

void SenderEnd::close() {
  if (queue_) queue_->close_sender();
  if (core_) core_->close();
}

void SenderEnd::detach() noexcept {
  if (core_) core_->hand_over();
}

void SenderEnd::adopt() noexcept {
  if (core_) core_->adopt();
}

bool SenderEnd::is_open() const noexcept { return queue_ ? queue_->sender_open() : core_ && core_->is_open(); }

Transport SenderEnd::transport() const {
  if (queue_) return Transport::InProcess;
  if (!core_) throw_empty("Sender");
  return core_->transport();
}

void SenderEnd::track_delivery() {
  if (!queue_) core().track_delivery();
}

std::uint64_t SenderEnd::last_sequence() { return queue_ ? queue_->sent() : core().last_sequence(); }

std::uint64_t SenderEnd::delivered() { return queue_ ? queue_->taken() : core().delivered(); }

std::shared_ptr<const ReturnBoard> SenderEnd::delivery_board() { return core_ ? core_->delivery_board() : nullptr; }

std::optional<ReturnBoard::DeliveryWake> SenderEnd::request_delivery_wake(std::uint64_t sequence) {
  if (!core_) return std::nullopt;
  return core_->request_delivery_wake(sequence);
}

void SenderEnd::cancel_delivery_wake() {
  if (core_) core_->cancel_delivery_wake();
}

bool SenderEnd::receiver_gone() {
  if (queue_) return !queue_->receiver_open();
  return !core_ || core_->receiver_gone();
}

std::optional<SharedAllocator> SenderEnd::pool() const { return core_ ? core_->pool() : std::nullopt; }

bool send_by_owner(SenderCore& core, const void* message, const SentType& type, const Deadline& deadline) {
  return core.send_serialized_by_owner(message, type, deadline);
}

bool flush_by_owner(SenderCore& core, const Deadline& deadline) { return core.flush(deadline); }

SenderCore& SenderEnd::core() {
  if (queue_) throw_no_frame_core("Sender");
  if (!core_) throw_empty("Sender");
  return *core_;
}

ReceiverEnd::ReceiverEnd() noexcept = default;
ReceiverEnd::ReceiverEnd(std::unique_ptr<ReceiverCore> core) noexcept : core_(std::move(core)) {}
ReceiverEnd::ReceiverEnd(std::shared_ptr<InProcessQueue> queue) noexcept : queue_(std::move(queue)) {}
ReceiverEnd::ReceiverEnd(ReceiverEnd&&) noexcept = default;

ReceiverEnd& ReceiverEnd::operator=(ReceiverEnd&& other) noexcept {
  if (this != &other) {
    if (queue_) queue_->close_receiver();
    queue_ = std::move(other.queue_);
    core_ = std::move(other.core_);
  }
  return *this;
}

ReceiverEnd::~ReceiverEnd() {
  if (queue_) queue_->close_receiver();
}

ReadStatus ReceiverEnd::receive(void* out, const ReceivedType& type, const Deadline& deadline) {
  return core().receive(out, type, deadline);
}

ReadStatus ReceiverEnd::receive_local(std::unique_ptr<Parcel>& out, const Deadline& deadline) {
  queue_->check_process("Receiver");
  return queue_->receive(out, deadline);
}

void ReceiverEnd::close() noexcept {
  if (queue_) queue_->close_receiver();
  if (core_) core_->close();
}

void ReceiverEnd::detach() noexcept {
  if (queue_) queue_->close_receiver();
  if (core_) core_->detach();
}

void ReceiverEnd::adopt() noexcept {
  if (core_) core_->adopt();
}

bool ReceiverEnd::is_open() const noexcept { return queue_ ? queue_->receiver_open() : core_ && core_->is_open(); }

Transport ReceiverEnd::transport() const {
  if (queue_) return Transport::InProcess;
  if (!core_) throw_empty("Receiver");
  return core_->transport();
}

SelectorMember ReceiverEnd::selector_member() const noexcept { return SelectorMember{core_.get(), queue_.get()}; }

ReceiverCore& ReceiverEnd::core() {
  if (queue_) throw_no_frame_core("Receiver");
  if (!core_) throw_empty("Receiver");
  return *core_;
}

SenderEnd sender_end_over(std::unique_ptr<FrameWriter> writer, Transport transport, const ChannelOptions& options,
                          pid_t peer_pid) {
  auto core = std::make_unique<SenderCore>(std::move(writer), transport, options);
  core->stats().peer_pid.store(peer_pid, std::memory_order_relaxed);
  return SenderEnd(std::move(core));
}

ReceiverEnd receiver_end_over(std::unique_ptr<FrameReader> reader, Transport transport, std::uint64_t fingerprint,
                              std::string_view type_name, const ChannelOptions& options, pid_t peer_pid) {
  auto core = std::make_unique<ReceiverCore>(std::move(reader), transport, fingerprint, type_name, options);
  core->stats().peer_pid.store(peer_pid, std::memory_order_relaxed);
  return ReceiverEnd(std::move(core));
}

std::pair<SenderEnd, ReceiverEnd> make_channel_ends(Transport transport, const ChannelOptions& options,
                                                    std::uint64_t fingerprint, std::string_view type_name) {
  if (transport == Transport::InProcess) {
    auto queue = std::make_shared<InProcessQueue>(options.queue_capacity, options.name);
    return {SenderEnd(queue), ReceiverEnd(queue)};
  }
  auto [writer, reader] = make_transport(transport, options.limits, options.ring_capacity, options.ring_timing());
  auto pair = std::make_shared<PairPids>();
  SenderEnd sender(std::make_unique<SenderCore>(std::move(writer), transport, options, pair));
  return {std::move(sender), ReceiverEnd(std::make_unique<ReceiverCore>(std::move(reader), transport, fingerprint,
                                                                        type_name, options, std::move(pair)))};
}

DuplexEnds make_duplex_ends(Transport transport, const ChannelOptions& options, std::uint64_t a_fingerprint,
                            std::string_view a_type_name, std::uint64_t b_fingerprint, std::string_view b_type_name) {
  DuplexEnds ends;
  if (transport == Transport::InProcess) {
    std::tie(ends.a_sender, ends.b_receiver) = make_channel_ends(transport, options, a_fingerprint, a_type_name);
    std::tie(ends.b_sender, ends.a_receiver) = make_channel_ends(transport, options, b_fingerprint, b_type_name);
    return ends;
  }
  DuplexTransport made = make_duplex_transport(transport, options.limits, options.ring_capacity, options.ring_timing());
  // a_sender's frames reach b_receiver, b_sender's a_receiver: a word per direction.
  auto a_to_b = std::make_shared<PairPids>();
  auto b_to_a = std::make_shared<PairPids>();
  ends.a_sender = SenderEnd(std::make_unique<SenderCore>(std::move(made.a_writer), transport, options, a_to_b));
  ends.a_receiver = ReceiverEnd(
      std::make_unique<ReceiverCore>(std::move(made.a_reader), transport, b_fingerprint, b_type_name, options, b_to_a));
  ends.b_sender = SenderEnd(std::make_unique<SenderCore>(std::move(made.b_writer), transport, options, b_to_a));
  ends.b_receiver = ReceiverEnd(
      std::make_unique<ReceiverCore>(std::move(made.b_reader), transport, a_fingerprint, a_type_name, options, a_to_b));
  return ends;
}

const LiveEnd* as_live_end(SenderCore& core) noexcept { return &core; }
const LiveEnd* as_live_end(ReceiverCore& core) noexcept { return &core; }
bool core_used(const SenderCore& core) noexcept { return core.used(); }
bool core_used(const ReceiverCore& core) noexcept { return core.used(); }

}  // namespace ferry::detail
