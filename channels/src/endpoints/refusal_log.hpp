// The default report of refused clients: one line on stderr each, at most kBurst lines at
// once and then about one a second, so that any local process that can connect cannot
// flood the log. The lines left out are counted and the next line written says how many.
// Used when EndpointOptions::on_refusal is empty (a callback there sees every refusal).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace ferry::detail {

class RefusalLog {
 public:
  /// Lines written back to back before the rate applies.
  static constexpr double kBurst = 10;
  /// Lines a second after that.
  static constexpr double kPerSecond = 1;

  /// Writes `line` to stderr unless the rate is spent (then counts it).
  void write(const std::string& line);

 private:
  using Clock = std::chrono::steady_clock;
  double tokens_ = kBurst;
  Clock::time_point refilled_ = Clock::now();
  std::size_t left_out_ = 0;
};

}  // namespace ferry::detail
