#include "units.hpp"

#include <cmath>
#include <cstdio>

namespace ferry::cli {
namespace {

std::string printed(const char* format, double value, const char* unit) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, value, unit);
  return buffer;
}

}  // namespace

std::string human_bytes(double bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 5) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? printed("%.0f %s", bytes, units[0]) : printed("%.1f %s", bytes, units[unit]);
}

std::string human_count(double count) {
  static const char* const units[] = {"", "k", "M", "G", "T", "P"};
  int unit = 0;
  while (count >= 1000 && unit < 5) {
    count /= 1000;
    ++unit;
  }
  if (unit == 0) return count == std::floor(count) ? printed("%.0f%s", count, "") : printed("%.1f%s", count, "");
  return printed("%.1f%s", count, units[unit]);
}

std::string human_byte_rate(double bytes_per_second) { return human_bytes(bytes_per_second) + "/s"; }

std::string human_percent(double percent) { return printed("%.0f%s", percent, "%"); }

std::string human_duration_ns(double nanoseconds) {
  if (nanoseconds < 1e3) return printed("%.0f %s", nanoseconds, "ns");
  if (nanoseconds < 1e6) return printed("%.1f %s", nanoseconds / 1e3, "us");
  if (nanoseconds < 1e9) return printed("%.1f %s", nanoseconds / 1e6, "ms");
  if (nanoseconds < 60e9) return printed("%.1f %s", nanoseconds / 1e9, "s");
  auto seconds = static_cast<long long>(nanoseconds / 1e9);
  char buffer[64];
  if (seconds < 3600) {
    std::snprintf(buffer, sizeof buffer, "%lldm%02llds", seconds / 60, seconds % 60);
  } else {
    std::snprintf(buffer, sizeof buffer, "%lldh%02lldm", seconds / 3600, (seconds / 60) % 60);
  }
  return buffer;
}

}  // namespace ferry::cli
