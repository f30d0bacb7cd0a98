// How the caching allocator takes back blocks that receivers gave back, without knowing the
// code that tracks them: the lifetime code installs a collector, which the allocator calls
// before it creates a segment and in trim().
#pragma once

namespace ferry {

/// Collects the blocks receivers gave back on every channel of this process; with
/// `check_receivers`, also those of receivers that exited (reads /proc).
using ReturnedBlockCollector = void (*)(bool check_receivers);

/// Installs `collector` for this process (the hold ledgers install theirs before main()).
void install_returned_block_collector(ReturnedBlockCollector collector) noexcept;

/// Calls the installed collector; nothing when none is installed (no channel code linked).
void collect_returned_blocks_through_hook(bool check_receivers);

}  // namespace ferry
