// How the ends (frame_channel.cpp) put themselves into a Snapshot.
#pragma once

#include <cstdint>
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
  std::uint64_t in_flight = 0;
};

/// Appends one end to out.ends.
void describe_end(Snapshot& out, const EndStats& stats, const EndFacts& facts);

}  // namespace ferry::detail
