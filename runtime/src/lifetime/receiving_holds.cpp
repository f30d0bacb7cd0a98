#include "ferry/detail/connection_holds.hpp"
#include "ferry/detail/thread_annotations.hpp"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>

#include "ferry/detail/object_pool.hpp"
#include "ferry/error.hpp"

namespace ferry {
namespace {

// How long a receiver waits for an upstream sender to finish a check of its holders (it
// reads a few /proc entries; only a stopped process takes longer).
constexpr std::chrono::milliseconds kUpstreamCheckPatience{2000};

// A block received on a connection. When it dies (its lease was released and no tensor of
// this process views it any more), it gives its storage slot back to the sender through
// the connection's return board, so that the sender's allocator may recycle it.
class ReceivedBlock final : public SharedBlock {
 public:
  ReceivedBlock(std::shared_ptr<detail::SharedSegment> segment, std::size_t offset, std::size_t nbytes,
                std::shared_ptr<detail::ReturnPath> returns, std::uint32_t slot,
                std::shared_ptr<Allocation> own_allocation)
      : SharedBlock(std::move(segment), offset, nbytes),
        returns_(std::move(returns)),
        own_allocation_(std::move(own_allocation)),
        slot_(slot),
        generation_(detail::fork_generation()) {
    mark_received();
  }
  ~ReceivedBlock() override {
    // A forked child's copy is not the holder the sender knows: only the receiver returns,
    // and not once it handed the connection to a forked process that may still hold this.
    if (generation_ == detail::fork_generation() && !returns_->handed_over.load(std::memory_order_relaxed)) {
      returns_->board->post_return(slot_);
    }
  }
  ReceivedBlock(const ReceivedBlock&) = delete;
  ReceivedBlock& operator=(const ReceivedBlock&) = delete;
  void append_return_boards(std::vector<std::shared_ptr<detail::ReturnBoard>>& out) const override {
    returns_->append_boards(out);
  }

 private:
  std::shared_ptr<detail::ReturnPath> returns_;
  // A block of this process's allocator that came back through forwarders: its allocation,
  // so that the allocator does not recycle the block while it lives here.
  std::shared_ptr<Allocation> own_allocation_;
  std::uint32_t slot_;
  std::uint64_t generation_;
};

// Registers this process on `board` (ReturnBoard::hold_registration()); throws
// TooManyHolders when the board has no place.
void hold_or_refuse(detail::ReturnBoard& board, detail::ReturnBoard::HolderRole role) {
  if (board.hold_registration(role)) return;
  throw TooManyHolders(
      "this process cannot register as a holder of what it receives: " +
      std::to_string(detail::ReturnBoard::kMaxHolders) +
      " other living processes hold blocks that came through the same connection (its receiver, processes that "
      "took it over, and every process its blocks were forwarded to), so the process they came from could recycle "
      "them under this one; the frame is refused. Let fewer processes hold that connection's tensors at once (copy "
      "the tensors a large fan-out forwards: Tensor::clone())");
}

// Registers on the upstream board of forwarded blocks and checks that nothing was
// reclaimed since the forwarder read the board's reclaim count (it read it while it held
// the blocks; a count that moved means every holder upstream exited meanwhile, the
// forwarder too, and the blocks may have been recycled).
void hold_forwarded(detail::ReturnBoard& upstream, std::uint32_t reclaims_when_forwarded, std::size_t index) {
  hold_or_refuse(upstream, detail::ReturnBoard::HolderRole::Downstream);
  const std::optional<std::uint32_t> reclaims = upstream.reclaims_after_checks(kUpstreamCheckPatience);
  // The forwarder read the count before it sent, and counts only grow: one ahead of the
  // board's own is a lie, not a death.
  if (reclaims && reclaims_when_forwarded > *reclaims) {
    throw ProtocolError("segment " + std::to_string(index) + " is an upstream return board whose reclaim count " +
                        std::to_string(reclaims_when_forwarded) + " is ahead of the board's own (" +
                        std::to_string(*reclaims) + ")");
  }
  if (!reclaims || *reclaims != reclaims_when_forwarded) {
    throw PeerDied(
        "the tensors of this frame were forwarded by a process that exited before this receiver "
        "could register as their holder, and the process they came from " +
        std::string(reclaims ? "has reclaimed their memory since" : "did not finish checking its holders") +
        " (it may hold other data now); the frame cannot be read");
  }
}

}  // namespace

namespace detail {

void ReturnPath::append_boards(std::vector<std::shared_ptr<detail::ReturnBoard>>& out) const {
  out.push_back(board);
  const detail::MutexLock lock(mutex_);
  out.insert(out.end(), upstream_.begin(), upstream_.end());
}

void ReturnPath::add_upstream(std::shared_ptr<detail::ReturnBoard> upstream_board) {
  const detail::MutexLock lock(mutex_);
  upstream_.push_back(std::move(upstream_board));
}

void ReturnPath::retire_upstream(const detail::FileIdentity& identity) {
  const detail::MutexLock lock(mutex_);
  std::erase_if(upstream_, [&identity](const auto& upstream) { return upstream->identity() == identity; });
}

bool ReturnPath::knows(const detail::FileIdentity& identity) const {
  if (board->identity() == identity) return true;
  const detail::MutexLock lock(mutex_);
  return std::any_of(upstream_.begin(), upstream_.end(),
                     [&identity](const auto& upstream) { return upstream->identity() == identity; });
}

void ReturnPath::keep_registrations() noexcept {
  board->keep_registration();
  const detail::MutexLock lock(mutex_);
  for (const auto& upstream : upstream_) upstream->keep_registration();
}

std::vector<std::shared_ptr<detail::ReturnBoard>> ReturnPath::upstream_boards() const {
  const detail::MutexLock lock(mutex_);
  return upstream_;
}

}  // namespace detail

void detail::ReceivingHolds::adopt_board(detail::SharedMemory memory) {
  auto board = detail::ReturnBoard::open_received(std::move(memory));
  returns_ = std::make_shared<detail::ReturnPath>();
  returns_->board = std::move(board);
}

void detail::ReceivingHolds::add_upstream_board(detail::SharedMemory memory, std::uint32_t reclaims_when_forwarded,
                                                std::size_t index) {
  const detail::FileIdentity identity = memory.identity();
  auto upstream = detail::ReturnBoard::open_received(std::move(memory));
  // A board of this process: a block it sent came back through forwarders. Registering
  // would keep everything it sent on that connection pinned for as long as it lives; the
  // blocks are kept by their pins instead (find_own_pinned()).
  if (std::shared_ptr<detail::HoldLedger> own = detail::own_ledger_of_board(identity)) {
    // Once per ledger (a board retired and passed again comes back), and none that died.
    std::erase_if(own_upstream_ledgers_, [&own](const auto& weak) {
      const auto ledger = weak.lock();
      return !ledger || ledger == own;
    });
    own_upstream_ledgers_.emplace_back(own);
  } else {
    hold_forwarded(*upstream, reclaims_when_forwarded, index);  // before resolving anything
  }
  returns_->add_upstream(std::move(upstream));
}

bool detail::ReceivingHolds::claim_frame(std::uint64_t sequence) {
  // Register this process as a holder before holding anything: the sender keeps what it
  // pinned for us as long as a registered holder lives.
  register_as_holder();  // throws when it cannot: nothing of the frame would be safe to read
  return returns_->board->claim_resolved(sequence);
}

void detail::ReceivingHolds::register_in_this_generation() {
  const std::uint64_t generation = detail::fork_generation();
  hold_or_refuse(*returns_->board, detail::ReturnBoard::HolderRole::Receiver);
  // A forked process that took the receiver over holds forwarded blocks too.
  for (const auto& upstream : returns_->upstream_boards()) {
    if (!detail::own_ledger_of_board(upstream->identity()))
      hold_or_refuse(*upstream, detail::ReturnBoard::HolderRole::Downstream);
  }
  registered_generation_ = generation;
}

std::shared_ptr<SharedBlock> detail::ReceivingHolds::make_block(std::shared_ptr<detail::SharedSegment> segment,
                                                                std::size_t offset, std::size_t nbytes,
                                                                std::uint32_t slot, std::shared_ptr<Allocation> own) {
  return std::allocate_shared<ReceivedBlock>(detail::PoolAllocator<ReceivedBlock>(), std::move(segment), offset, nbytes,
                                             returns_, slot, std::move(own));
}

std::shared_ptr<Allocation> detail::ReceivingHolds::find_own_pinned(const detail::SharedSegment* segment,
                                                                    std::size_t offset) const {
  // Its storage died here: the pin of the connection it left on keeps it (a forwarder
  // holds it, so that pin stays until the block is given back along the way).
  for (const auto& weak_ledger : own_upstream_ledgers_) {
    if (const auto ledger = weak_ledger.lock()) {
      if (auto allocation = ledger->find_pinned(segment, offset)) return allocation;
    }
  }
  return nullptr;
}

void detail::ReceivingHolds::reset() noexcept {
  // Blocks still alive keep the board (and its fd) for their returns; no frame comes any more.
  returns_.reset();
  own_upstream_ledgers_.clear();
}

void detail::ReceivingHolds::hand_over() noexcept {
  if (returns_) {
    returns_->handed_over.store(true, std::memory_order_relaxed);
    // The forked process that takes the blocks over may register after they died here.
    returns_->keep_registrations();
  }
  reset();
}

}  // namespace ferry
