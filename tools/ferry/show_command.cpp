#include "show_command.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "ps_command.hpp"
#include "table.hpp"
#include "units.hpp"

namespace ferry::cli {
namespace {

std::string indented(const Table& table) {
  std::string out;
  for (const std::string& line : table.render()) out += "  " + line + "\n";
  return out;
}

std::string optional_number(const std::optional<std::int64_t>& value) { return value ? std::to_string(*value) : "-"; }

std::string ends_section(const Snapshot& snapshot) {
  std::string out = "ends (" + std::to_string(snapshot.ends.size()) + "):\n";
  if (snapshot.ends.empty()) return out + "  none\n";
  Table table({{"ID", Align::right},
               {"DIR"},
               {"LABEL"},
               {"TRANSPORT"},
               {"PEER", Align::right},
               {"STATE"},
               {"MESSAGES", Align::right},
               {"BYTES", Align::right},
               {"TENSORS", Align::right},
               {"NEW SEGS", Align::right},
               {"IN FLIGHT", Align::right},
               {"BLOCKED", Align::right},
               {"NOW"},
               {"IDLE", Align::right}});
  for (const EndSnapshot& end : snapshot.ends) {
    std::string idle = end.last_activity_ns == 0 || end.last_activity_ns > snapshot.monotonic_ns
                           ? "-"
                           : human_duration_ns(static_cast<double>(snapshot.monotonic_ns - end.last_activity_ns));
    table.add_row({std::to_string(end.id), end.direction, end.label.empty() ? "-" : end.label, end.transport,
                   optional_number(end.peer_pid), end.state, std::to_string(end.messages),
                   human_bytes(static_cast<double>(end.bytes)), std::to_string(end.tensors),
                   std::to_string(end.new_segments), optional_number(end.in_flight),
                   human_duration_ns(static_cast<double>(end.blocked_ns)), end.blocked_now ? "blocked" : "-", idle});
  }
  return out + indented(table);
}

std::string listeners_section(const Snapshot& snapshot) {
  std::string out = "listeners (" + std::to_string(snapshot.listeners.size()) + "):\n";
  if (snapshot.listeners.empty()) return out + "  none\n";
  Table table({{"ADDRESS"}, {"ACCEPTED", Align::right}, {"HANDSHAKES", Align::right}, {"REFUSED"}});
  for (const ListenerSnapshot& listener : snapshot.listeners) {
    std::string refused;
    for (const auto& [reason, count] : listener.refused) {
      refused += (refused.empty() ? "" : ", ") + reason + " " + std::to_string(count);
    }
    table.add_row({listener.address, std::to_string(listener.accepted), std::to_string(listener.handshakes_in_progress),
                   refused.empty() ? "-" : refused});
  }
  return out + indented(table);
}

// A section of named numbers; those whose name says bytes also in human units.
std::string numbers_section(const std::string& title, const std::vector<NamedNumber>& numbers) {
  std::string out = title + ":\n";
  if (numbers.empty()) return out + "  none\n";
  Table table({{"FIELD"}, {"VALUE", Align::right}, {""}});
  for (const NamedNumber& number : numbers) {
    bool bytes = number.name.find("bytes") != std::string::npos;
    table.add_row({number.name, plain_number(number.value), bytes ? human_bytes(number.value) : ""});
  }
  std::vector<std::string> lines = table.render();
  for (std::size_t i = 1; i < lines.size(); ++i) out += "  " + lines[i] + "\n";  // no header
  return out;
}

std::string workers_section(const Snapshot& snapshot) {
  std::string out = "workers (" + std::to_string(snapshot.workers.size()) + "):\n";
  if (snapshot.workers.empty()) return out + "  none\n";
  Table table(
      {{"RANK", Align::right}, {"PID", Align::right}, {"STATE"}, {"EXIT", Align::right}, {"SIGNAL", Align::right}});
  for (const WorkerSnapshot& worker : snapshot.workers) {
    table.add_row({optional_number(worker.rank), std::to_string(worker.pid), worker.state,
                   optional_number(worker.exit_code), optional_number(worker.signal)});
  }
  return out + indented(table);
}

std::string fanout_table(const FanoutSnapshot& fanout) {
  std::vector<Column> columns{{"CONSUMER", Align::right}};
  std::vector<std::string> names;
  std::vector<std::string> texts;
  for (const ConsumerSnapshot& consumer : fanout.consumers) {
    for (const auto& [name, value] : consumer.texts) {
      if (std::find(texts.begin(), texts.end(), name) == texts.end()) texts.push_back(name);
    }
    for (const NamedNumber& number : consumer.numbers) {
      if (std::find(names.begin(), names.end(), number.name) == names.end()) names.push_back(number.name);
    }
  }
  for (const std::string& name : texts) columns.push_back({name});
  for (const std::string& name : names) columns.push_back({name, Align::right});
  Table table(columns);
  for (const ConsumerSnapshot& consumer : fanout.consumers) {
    std::vector<std::string> cells{std::to_string(consumer.index)};
    for (const std::string& name : texts) {
      std::string cell = "-";
      for (const auto& [field, value] : consumer.texts) cell = field == name ? value : cell;
      cells.push_back(cell);
    }
    for (const std::string& name : names) {
      std::string cell = "-";
      for (const NamedNumber& number : consumer.numbers) cell = number.name == name ? plain_number(number.value) : cell;
      cells.push_back(cell);
    }
    table.add_row(cells);
  }
  std::string out;
  for (const std::string& line : table.render()) out += "    " + line + "\n";
  return out;
}

std::string fanouts_section(const Snapshot& snapshot) {
  std::string out = "fan-outs (" + std::to_string(snapshot.fanouts.size()) + "):\n";
  if (snapshot.fanouts.empty()) return out + "  none\n";
  for (const FanoutSnapshot& fanout : snapshot.fanouts) {
    out += "  " + printable(fanout.kind) + (fanout.label.empty() ? "" : " \"" + printable(fanout.label) + "\"") + ", " +
           std::to_string(fanout.consumers.size()) + " consumers\n";
    if (!fanout.consumers.empty()) out += fanout_table(fanout);
  }
  return out;
}

}  // namespace

std::string plain_number(double value) {
  char buffer[64];
  if (std::isfinite(value) && value == std::floor(value) && std::fabs(value) < 1e18) {
    std::snprintf(buffer, sizeof buffer, "%.0f", value);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.6g", value);
  }
  return buffer;
}

std::string render_show(const Snapshot& snapshot) {
  std::string out = "pid " + std::to_string(snapshot.pid) + "  program " + printable(snapshot.program) + "  role " +
                    printable(role_text(snapshot)) + "\n";
  out += ends_section(snapshot);
  out += listeners_section(snapshot);
  out += numbers_section("shared memory", snapshot.shared_memory);
  out += snapshot.cuda ? numbers_section("cuda", *snapshot.cuda) : "cuda: none\n";
  out += workers_section(snapshot);
  out += fanouts_section(snapshot);
  return out;
}

}  // namespace ferry::cli
