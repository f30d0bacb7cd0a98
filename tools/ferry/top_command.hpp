// `ferry top`: live per-channel rates. Contract: interactive on a terminal (alternate
// screen, refreshed every `interval`, q / Q / Ctrl-C / SIGINT / SIGTERM / SIGHUP quit and
// restore the terminal, a resize redraws at once); with `frames` set, or when stdout is not
// a terminal, it prints that many frames (default 1) as plain text, each after one interval,
// and exits (for scripts).
#pragma once

#include <chrono>
#include <optional>

namespace ferry::cli {

struct TopOptions {
  std::chrono::milliseconds interval{1000};
  std::chrono::milliseconds timeout{2000};  ///< per refresh, for every process at once (at most `interval`)
  std::optional<int> frames;                ///< batch mode: print this many frames
};

/// Runs `ferry top`; returns the exit code.
int run_top(const TopOptions& options);

}  // namespace ferry::cli
