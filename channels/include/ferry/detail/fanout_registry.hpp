// The process-wide list of fan-outs (Distributor, Broadcast) that introspection reports
// (ferry/introspection.hpp). A fan-out registers itself for its lifetime.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ferry/fanout.hpp"

namespace ferry {
struct Snapshot;
}

namespace ferry::detail {

/// Reads a fan-out's per-consumer figures without waiting: std::nullopt when its lock is
/// busy (a send in progress); introspection then reports the figures it read last.
using TryFanoutStats = std::optional<std::vector<ConsumerStats>> (*)(void* fanout);

/// Keeps `fanout` in the list while it lives, labelled `label` (FanoutOptions::name). Declare
/// it as the fan-out's last member: made after what `stats` reads, destroyed before it.
/// Neither copyable nor movable.
class FanoutRegistration {
 public:
  FanoutRegistration(const char* kind, void* fanout, TryFanoutStats stats, std::string label = {});
  ~FanoutRegistration();
  FanoutRegistration(const FanoutRegistration&) = delete;
  FanoutRegistration& operator=(const FanoutRegistration&) = delete;

 private:
  void* fanout_;
};

/// Appends every registered fan-out to out.fanouts.
void describe_fanouts(Snapshot& out);

}  // namespace ferry::detail
