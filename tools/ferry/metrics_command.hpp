// `ferry metrics`: every process's figures in Prometheus' text exposition format (0.0.4).
// Contract: each metric family appears once, as "# HELP", "# TYPE" and then its samples for
// every process; counters end in "_total"; every sample carries pid="..."; an end's samples
// also carry end, label, transport and direction. Label values are escaped (\\, \", \n);
// names built from a process's own fields are reduced to [a-zA-Z0-9_].
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "snapshot.hpp"

namespace ferry::cli {

std::string render_metrics(const std::vector<Snapshot>& snapshots);

/// A label value escaped for the text format: backslash, double quote and line feed.
std::string escape_label_value(std::string_view value);

/// A metric name fragment: characters other than [a-zA-Z0-9_] become '_'.
std::string metric_name_fragment(std::string_view text);

}  // namespace ferry::cli
