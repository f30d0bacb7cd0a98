#include "endpoints/refusal_log.hpp"

#include <algorithm>
#include <cstdio>

namespace ferry::detail {

void RefusalLog::write(const std::string& line) {
  const Clock::time_point now = Clock::now();
  const std::chrono::duration<double> elapsed = now - refilled_;
  tokens_ = std::min(kBurst, tokens_ + elapsed.count() * kPerSecond);
  refilled_ = now;
  if (tokens_ < 1) {
    ++left_out_;
    return;
  }
  tokens_ -= 1;
  if (left_out_ > 0) {
    std::fprintf(stderr, "%s (and %zu more refusals not shown: at most one line a second)\n", line.c_str(), left_out_);
    left_out_ = 0;
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

}  // namespace ferry::detail
