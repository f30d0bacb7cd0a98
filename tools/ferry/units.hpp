// Human-readable numbers for the tool's tables. Contract: short, fixed-style strings:
// bytes in binary units ("0 B", "512 B", "1.5 KiB", "12.0 MiB"), counts and rates with SI
// suffixes ("950", "12.3k", "4.1M"), byte rates as bytes plus "/s", percentages as "37%".
#pragma once

#include <cstdint>
#include <string>

namespace ferry::cli {

std::string human_bytes(double bytes);
std::string human_count(double count);
std::string human_byte_rate(double bytes_per_second);
std::string human_percent(double percent);
/// A duration in the largest fitting unit: "850 ns", "12.0 us", "3.4 ms", "2.1 s", "5m03s".
std::string human_duration_ns(double nanoseconds);

}  // namespace ferry::cli
