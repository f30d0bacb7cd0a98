#include "top_model.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include "table.hpp"
#include "units.hpp"

namespace ferry::cli {
namespace {

double per_second(std::uint64_t before, std::uint64_t after, double seconds) {
  return after >= before ? static_cast<double>(after - before) / seconds : 0.0;
}

// Fills the rates of `row` from the same end one interval earlier.
void derive_rates(TopRow& row, const EndSnapshot& before, std::uint64_t interval_ns) {
  double seconds = static_cast<double>(interval_ns) / 1e9;
  row.has_rates = true;
  row.messages_per_second = per_second(before.messages, row.end.messages, seconds);
  row.bytes_per_second = per_second(before.bytes, row.end.bytes, seconds);
  double blocked =
      row.end.blocked_ns >= before.blocked_ns ? static_cast<double>(row.end.blocked_ns - before.blocked_ns) : 0;
  row.blocked_percent = std::clamp(100.0 * blocked / static_cast<double>(interval_ns), 0.0, 100.0);
  row.stalled = row.end.direction == "send" && row.end.blocked_now && row.end.messages == before.messages;
}

bool busier(const TopRow& a, const TopRow& b) {
  if (a.stalled != b.stalled) return a.stalled;
  if (a.bytes_per_second != b.bytes_per_second) return a.bytes_per_second > b.bytes_per_second;
  if (a.messages_per_second != b.messages_per_second) return a.messages_per_second > b.messages_per_second;
  if (a.end.messages != b.end.messages) return a.end.messages > b.end.messages;
  return std::pair(a.pid, a.end.id) < std::pair(b.pid, b.end.id);
}

std::string state_text(const TopRow& row) {
  if (row.stalled) return "STALLED";
  if (row.end.blocked_now && row.end.state == "open") return "waiting";
  return row.end.state;
}

std::string header_text(const std::vector<TopRow>& rows, const TopSummary& summary) {
  double messages = 0;
  double bytes = 0;
  std::size_t stalled = 0;
  for (const TopRow& row : rows) {
    messages += row.messages_per_second;
    bytes += row.bytes_per_second;
    stalled += row.stalled ? 1 : 0;
  }
  std::string text = "ferry top  " + summary.clock + "  " + std::to_string(summary.processes) + " processes  " +
                     std::to_string(rows.size()) + " ends  " + human_count(messages) + " msg/s  " +
                     human_byte_rate(bytes);
  if (stalled > 0) text += "  " + std::to_string(stalled) + " STALLED";
  if (summary.unreadable > 0) text += "  " + std::to_string(summary.unreadable) + " unreadable";
  return text + "  (q quits)";
}

Table rows_table(const std::vector<TopRow>& rows) {
  // Narrow terminals lose the peer, then the transport, the total, the direction, the program.
  Table table({{"PID", Align::right},
               {"PROGRAM", Align::left, 6, 1},
               {"END", Align::right},
               {"DIR", Align::left, 0, 2},
               {"LABEL", Align::left, 5},
               {"TRANSPORT", Align::left, 6, 4},
               {"PEER", Align::right, 0, 5},
               {"MSG/S", Align::right},
               {"BYTES/S", Align::right},
               {"MESSAGES", Align::right, 0, 3},
               {"IN FLIGHT", Align::right},
               {"BLOCKED", Align::right},
               {"STATE"}});
  for (const TopRow& row : rows) {
    const EndSnapshot& end = row.end;
    table.add_row({std::to_string(row.pid), row.program, std::to_string(end.id), end.direction,
                   end.label.empty() ? "-" : end.label, end.transport,
                   end.peer_pid ? std::to_string(*end.peer_pid) : "-",
                   row.has_rates ? human_count(row.messages_per_second) : "-",
                   row.has_rates ? human_byte_rate(row.bytes_per_second) : "-",
                   human_count(static_cast<double>(end.messages)), end.in_flight ? std::to_string(*end.in_flight) : "-",
                   row.has_rates ? human_percent(row.blocked_percent) : "-", state_text(row)});
  }
  return table;
}

}  // namespace

std::vector<TopRow> top_rows(const std::vector<Snapshot>& previous, const std::vector<Snapshot>& current) {
  std::map<pid_t, const Snapshot*> before;
  for (const Snapshot& snapshot : previous) before[snapshot.pid] = &snapshot;
  std::vector<TopRow> rows;
  for (const Snapshot& snapshot : current) {
    auto earlier = before.find(snapshot.pid);
    for (const EndSnapshot& end : snapshot.ends) {
      TopRow row{snapshot.pid, snapshot.program, end};
      if (earlier != before.end() && snapshot.monotonic_ns > earlier->second->monotonic_ns) {
        const auto& old_ends = earlier->second->ends;
        auto old = std::find_if(old_ends.begin(), old_ends.end(), [&](const EndSnapshot& e) { return e.id == end.id; });
        if (old != old_ends.end()) derive_rates(row, *old, snapshot.monotonic_ns - earlier->second->monotonic_ns);
      }
      rows.push_back(std::move(row));
    }
  }
  std::sort(rows.begin(), rows.end(), busier);
  return rows;
}

TopFrame render_top_frame(const std::vector<TopRow>& all_rows, const TopSummary& summary, std::size_t width,
                          std::size_t height) {
  // Closed ends that never carried a message (a forked worker's copies of its parent's
  // ends) are left out: they would only push the live ones down.
  std::vector<TopRow> rows;
  for (const TopRow& row : all_rows) {
    if (row.end.state != "closed" || row.end.messages != 0) rows.push_back(row);
  }
  TopFrame frame;
  std::string header = header_text(rows, summary);
  if (rows.size() < all_rows.size()) {
    header += "  (" + std::to_string(all_rows.size() - rows.size()) + " unused closed ends hidden)";
  }
  frame.lines.push_back(cut_to_width(printable(header), width));
  if (summary.unreadable > 0) frame.lines.push_back(cut_to_width(printable(summary.first_problem), width));
  frame.lines.emplace_back();
  if (rows.empty()) {
    frame.lines.push_back("no channel ends (start a program with FERRY_INTROSPECT=1)");
    return frame;
  }
  std::vector<std::string> table = rows_table(rows).render(width);
  frame.header_line = frame.lines.size();
  std::size_t room = height > frame.lines.size() + 1 ? height - frame.lines.size() - 1 : 0;  // rows below the header
  std::size_t shown = std::min(rows.size(), room);
  if (shown < rows.size() && shown > 0) --shown;  // keep a line to say how many are left out
  frame.lines.push_back(table[0]);
  for (std::size_t i = 0; i < shown; ++i) {
    if (rows[i].stalled) frame.stalled_lines.push_back(frame.lines.size());
    frame.lines.push_back(table[i + 1]);
  }
  if (shown < rows.size()) {
    frame.lines.push_back(cut_to_width("... " + std::to_string(rows.size() - shown) + " more ends", width));
  }
  return frame;
}

}  // namespace ferry::cli
