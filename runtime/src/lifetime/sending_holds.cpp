#include <algorithm>

#include "ferry/detail/connection_holds.hpp"

namespace ferry {

void detail::SendingHolds::pin(std::span<detail::HoldLedger::Pin> pins, std::uint64_t sequence) {
  if (!ledger_) ledger_ = detail::HoldLedger::create();
  ledger_->pin(pins, sequence);
}

const std::shared_ptr<detail::ReturnBoard>& detail::SendingHolds::ensure_board() {
  if (!ledger_) ledger_ = detail::HoldLedger::create();
  return ledger_->board();
}

void detail::SendingHolds::unpin(std::span<const std::uint32_t> slots) {
  if (ledger_) ledger_->unpin(slots);
}

void detail::SendingHolds::take_returned_from_ledger(std::vector<std::uint32_t>& out) {
  if (ledger_->idle()) return;  // the common case of a connection that leases nothing now
  ledger_->collect(false);
  ledger_->take_returned(out);
}

void detail::SendingHolds::retire_passed_upstream_boards(std::vector<detail::FileIdentity>& retired) {
  for (PassedUpstream& sent : upstream_sent_) sent.retiring = false;
  const auto committed = upstream_sent_.begin() + static_cast<std::ptrdiff_t>(committed_);
  std::size_t count = 0;
  for (auto it = upstream_sent_.begin(); it != committed && count < kMaxRetiredPerFrame; ++it) {
    if (it->retiring || !it->board.expired()) continue;
    const detail::FileIdentity identity = it->identity;
    const auto same_board = [&identity](const PassedUpstream& other) { return other.identity == identity; };
    // A board that came on several connections lives here in one object per connection:
    // while one lives, the receiver keeps the board, and this entry just goes.
    if (std::any_of(upstream_sent_.begin(), committed,
                    [&](const PassedUpstream& other) { return same_board(other) && !other.board.expired(); })) {
      it->retiring = true;
      continue;
    }
    // Every object of it died (for good): one retirement for all its entries.
    for (auto other = it; other != committed; ++other) other->retiring = other->retiring || same_board(*other);
    retired.push_back(identity);
    ++count;
  }
}

void detail::SendingHolds::upstream_boards_to_pass(const SharedBlock& block,
                                                   std::vector<std::shared_ptr<detail::ReturnBoard>>& out) {
  scratch_.clear();
  block.append_return_boards(scratch_);  // nothing for a block of our own allocator
  for (std::shared_ptr<detail::ReturnBoard>& board : scratch_) {
    if (board->fd() < 0) continue;  // never for a received board (it keeps its fd)
    if (ledger_ && board->identity() == ledger_->board()->identity()) continue;
    // The receiver has the board (passed before and not retired by this frame; maybe by
    // another object of it, which came on another connection): then this object is only
    // tracked, so that the board is not retired while it lives.
    bool passed = false;
    bool tracked = false;
    for (const PassedUpstream& sent : upstream_sent_) {
      if (sent.identity != board->identity() || sent.retiring) continue;
      passed = true;
      tracked = !sent.board.owner_before(board) && !board.owner_before(sent.board);
      if (tracked) break;
    }
    if (passed) {
      if (!tracked) upstream_sent_.push_back(PassedUpstream{board, board->identity()});
      continue;
    }
    upstream_sent_.push_back(PassedUpstream{board, board->identity()});
    out.push_back(std::move(board));
  }
  scratch_.clear();
}

void detail::SendingHolds::commit_passed_upstream_boards() {
  // The receiver knows of the boards this frame retired: forget them. (One that died while
  // the frame was encoded is retired by the next one.)
  std::erase_if(upstream_sent_, [](const PassedUpstream& sent) { return sent.retiring; });
  committed_ = upstream_sent_.size();
}

void detail::SendingHolds::board_sent(std::uint64_t sequence, bool fd_passed) {
  board_sequence_ = sequence;
  if (fd_passed) ledger_->board()->close_fd();
}

void detail::SendingHolds::acknowledged(std::uint64_t sequence) {
  while (!kept_.empty() && kept_.front().first <= sequence) kept_.pop_front();
  // A board named by /proc path: the receiver has opened it.
  if (board_sent() && board_sequence_ <= sequence) {
    if (detail::ReturnBoard* returns = board()) returns->close_fd();
  }
}

void detail::SendingHolds::rollback_frame(std::uint64_t sequence) noexcept {
  while (!kept_.empty() && kept_.back().first == sequence) kept_.pop_back();
  upstream_sent_.erase(upstream_sent_.begin() + static_cast<std::ptrdiff_t>(committed_), upstream_sent_.end());
  for (PassedUpstream& sent : upstream_sent_) sent.retiring = false;  // retired by the next frame instead
}

void detail::SendingHolds::add_holder(const detail::ProcessIdentity& process) {
  if (ledger_) ledger_->board()->register_holder(process);
}

void detail::SendingHolds::receiver_gone() {
  if (ledger_) ledger_->receiver_gone();
}

void detail::SendingHolds::hand_over() {
  if (ledger_) ledger_->hand_over();
}

void detail::SendingHolds::adopt() { detail::HoldLedger::adopt_in_child(ledger_); }

void detail::SendingHolds::closed(detail::UniqueFd probe, bool probe_by_send, std::chrono::milliseconds exit_linger) {
  if (!ledger_) return;
  if (!kept_.empty()) ledger_->keep_until_resolved(std::exchange(kept_, {}), exit_linger);
  ledger_->channel_closed(std::move(probe), probe_by_send);
  ledger_.reset();  // the process's registry keeps it while the receiver holds blocks
}

}  // namespace ferry
