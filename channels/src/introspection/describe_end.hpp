// How the ends (frame_channel.cpp) put themselves into a Snapshot.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "ferry/channel_options.hpp"
#include "ferry/detail/end_stats.hpp"

namespace ferry {
struct Snapshot;
}

namespace ferry::detail {

/// What an end knows of itself besides its counters.
struct EndFacts {
  bool sends = true;
  Transport transport = Transport::Pipe;
  const std::string& label;
  bool open = true;
  std::optional<std::uint64_t> in_flight;  ///< nullopt: not known
  pid_t pair_peer = 0;                     ///< the peer's process from the pair's word (pair_pids.hpp); 0: not known
};

/// Appends one end to out.ends.
void describe_end(Snapshot& out, const EndStats& stats, const EndFacts& facts);

}  // namespace ferry::detail
