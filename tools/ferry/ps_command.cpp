#include "ps_command.hpp"

#include "table.hpp"
#include "units.hpp"

namespace ferry::cli {

std::string role_text(const Snapshot& snapshot) {
  std::string role = snapshot.role.empty() ? "?" : snapshot.role;
  if (snapshot.rank) role += " " + std::to_string(*snapshot.rank);
  return role;
}

std::string render_ps(const std::vector<Snapshot>& snapshots) {
  Table table({{"PID", Align::right},
               {"PROGRAM", Align::left},
               {"ROLE", Align::left},
               {"ENDS", Align::right},
               {"LISTENERS", Align::right},
               {"WORKERS", Align::right},
               {"SHM IN USE", Align::right},
               {"SHM MAPPED", Align::right}});
  for (const Snapshot& snapshot : snapshots) {
    table.add_row({std::to_string(snapshot.pid), snapshot.program, role_text(snapshot),
                   std::to_string(snapshot.ends.size()), std::to_string(snapshot.listeners.size()),
                   std::to_string(snapshot.workers.size()), human_bytes(snapshot.shared_memory_value("bytes_in_use")),
                   human_bytes(snapshot.shared_memory_value("segment_bytes"))});
  }
  std::string out;
  for (const std::string& line : table.render()) out += line + "\n";
  return out;
}

}  // namespace ferry::cli
