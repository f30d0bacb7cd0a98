// `ferry top`'s figures and frame, without the terminal. Contract: top_rows() pairs each end
// of `current` with the same end (pid, end id) in `previous` and derives its rates over the
// process's monotonic_ns interval: messages/s, bytes/s and the % of the interval spent
// blocked. A send end is STALLED when it is blocked now (waiting for room: its consumer
// does not keep up) and carried no message in the interval; a receive end blocked now is
// only "waiting" (for its producer, whose own send end says whether it is stuck).
// Rows come stalled first, then busiest (bytes/s, then messages/s) first. render_top_frame()
// lays them out in at most `width` x `height` cells, leaving out closed ends that never
// carried a message (a forked worker's copies of its parent's ends).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "snapshot.hpp"

namespace ferry::cli {

struct TopRow {
  pid_t pid = 0;
  std::string program;
  EndSnapshot end;
  bool has_rates = false;  ///< false on the first frame or for a new end
  double messages_per_second = 0;
  double bytes_per_second = 0;
  double blocked_percent = 0;
  bool stalled = false;
};

std::vector<TopRow> top_rows(const std::vector<Snapshot>& previous, const std::vector<Snapshot>& current);

struct TopFrame {
  std::vector<std::string> lines;
  std::size_t header_line = 0;             ///< the table's header (shown highlighted)
  std::vector<std::size_t> stalled_lines;  ///< lines of stalled ends (shown highlighted)
};

struct TopSummary {
  std::string clock;  ///< wall time "HH:MM:SS"
  std::size_t processes = 0;
  std::size_t unreadable = 0;  ///< processes that did not answer properly
  std::string first_problem;   ///< one of their messages
};

TopFrame render_top_frame(const std::vector<TopRow>& rows, const TopSummary& summary, std::size_t width,
                          std::size_t height);

}  // namespace ferry::cli
