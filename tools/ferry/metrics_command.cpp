#include "metrics_command.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <utility>

#include "show_command.hpp"

namespace ferry::cli {
namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

std::string escape_help_text(std::string_view text);

// Families in first-seen order, each with its samples from every process.
class Exposition {
 public:
  void add(const std::string& name, const char* type, const std::string& help, const Labels& labels,
           const std::string& value) {
    auto family = std::find_if(families_.begin(), families_.end(), [&](const Family& f) { return f.name == name; });
    if (family == families_.end()) {
      families_.push_back(Family{name, type, help, {}});
      family = families_.end() - 1;
    }
    family->samples.push_back(name + label_text(labels) + " " + value);
  }
  std::string text() const {
    std::string out;
    for (const Family& family : families_) {
      out += "# HELP " + family.name + " " + escape_help_text(family.help) + "\n";
      out += "# TYPE " + family.name + " " + family.type + "\n";
      for (const std::string& sample : family.samples) out += sample + "\n";
    }
    return out;
  }

 private:
  struct Family {
    std::string name;
    std::string type;
    std::string help;
    std::vector<std::string> samples;
  };
  static std::string label_text(const Labels& labels) {
    std::string out = "{";
    for (const auto& [name, value] : labels) {
      out += (out.size() > 1 ? "," : "") + name + "=\"" + escape_label_value(value) + "\"";
    }
    return out + "}";
  }
  std::vector<Family> families_;
};

// HELP text escapes backslash and line feed only.
std::string escape_help_text(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string number_text(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) return plain_number(value);
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.17g", value);
  return buffer;
}

std::string seconds_text(std::uint64_t nanoseconds) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.9f", static_cast<double>(nanoseconds) / 1e9);
  return buffer;
}

// Fields of SharedMemoryStats and ConsumerStats that only grow: exposed as counters.
bool is_counter_field(const std::string& name) {
  static const std::set<std::string> counters{
      "hits", "misses", "misses_after_release", "misses_cold", "segments_released", "sent", "delivered", "skipped"};
  return counters.count(name) != 0;
}

void add_process(Exposition& out, const Snapshot& s) {
  std::string pid = std::to_string(s.pid);
  out.add("ferry_process_info", "gauge", "A process with introspection on: its program, role and rank (always 1).",
          {{"pid", pid}, {"program", s.program}, {"role", s.role}, {"rank", s.rank ? std::to_string(*s.rank) : ""}},
          "1");
}

void add_end(Exposition& out, const Snapshot& s, const EndSnapshot& end) {
  Labels labels{{"pid", std::to_string(s.pid)},
                {"end", std::to_string(end.id)},
                {"label", end.label},
                {"transport", end.transport},
                {"direction", end.direction}};
  out.add("ferry_end_messages_total", "counter", "Messages sent or received through a channel end.", labels,
          std::to_string(end.messages));
  out.add("ferry_end_bytes_total", "counter", "Bytes sent or received through a channel end.", labels,
          std::to_string(end.bytes));
  out.add("ferry_end_tensors_total", "counter", "Tensors sent or received through a channel end.", labels,
          std::to_string(end.tensors));
  out.add("ferry_end_new_segments_total", "counter",
          "Shared-memory segments a channel end passed or mapped for the first time.", labels,
          std::to_string(end.new_segments));
  out.add("ferry_end_blocked_seconds_total", "counter",
          "Time a channel end spent blocked waiting for room or for a message.", labels, seconds_text(end.blocked_ns));
  if (end.in_flight) {  // absent where not known
    out.add("ferry_end_in_flight", "gauge", "Messages in flight on a channel end.", labels,
            std::to_string(*end.in_flight));
  }
  out.add("ferry_end_blocked", "gauge", "1 while a channel end is blocked waiting, 0 otherwise.", labels,
          end.blocked_now ? "1" : "0");
  std::uint64_t idle =
      end.last_activity_ns > 0 && end.last_activity_ns <= s.monotonic_ns ? s.monotonic_ns - end.last_activity_ns : 0;
  out.add("ferry_end_idle_seconds", "gauge", "Time since a channel end last sent or received.", labels,
          seconds_text(idle));
  Labels with_state = labels;
  with_state.emplace_back("state", end.state);
  out.add("ferry_end_state", "gauge", "A channel end's state (open, closed, peer_died) as a label (always 1).",
          with_state, "1");
}

void add_listener(Exposition& out, const Snapshot& s, const ListenerSnapshot& listener) {
  Labels labels{{"pid", std::to_string(s.pid)}, {"address", listener.address}};
  out.add("ferry_listener_accepted_total", "counter", "Connections a listener accepted.", labels,
          std::to_string(listener.accepted));
  for (const auto& [reason, count] : listener.refused) {
    Labels with_reason = labels;
    with_reason.emplace_back("reason", reason);
    out.add("ferry_listener_refused_total", "counter", "Connections a listener refused, by reason.", with_reason,
            std::to_string(count));
  }
  out.add("ferry_listener_handshakes_in_progress", "gauge", "Handshakes a listener has under way.", labels,
          std::to_string(listener.handshakes_in_progress));
}

void add_numbers(Exposition& out, const std::string& prefix, const std::string& what, const Labels& labels,
                 const std::vector<NamedNumber>& numbers) {
  for (const NamedNumber& number : numbers) {
    std::string name = prefix + metric_name_fragment(number.name);
    if (is_counter_field(number.name)) {
      out.add(name + "_total", "counter", what + " counter " + number.name + ".", labels, number_text(number.value));
    } else {
      out.add(name, "gauge", what + " figure " + number.name + ".", labels, number_text(number.value));
    }
  }
}

void add_worker(Exposition& out, const Snapshot& s, const WorkerSnapshot& worker) {
  out.add("ferry_worker_state", "gauge", "A spawned worker's state (running, exited, failed) as a label (always 1).",
          {{"pid", std::to_string(s.pid)},
           {"rank", worker.rank ? std::to_string(*worker.rank) : ""},
           {"worker_pid", std::to_string(worker.pid)},
           {"state", worker.state}},
          "1");
}

void add_fanout(Exposition& out, const Snapshot& s, std::size_t index, const FanoutSnapshot& fanout) {
  for (const ConsumerSnapshot& consumer : fanout.consumers) {
    Labels labels{{"pid", std::to_string(s.pid)},
                  {"fanout", std::to_string(index)},
                  {"kind", fanout.kind},
                  {"label", fanout.label},
                  {"consumer", std::to_string(consumer.index)}};
    add_numbers(out, "ferry_fanout_consumer_", "A fan-out consumer's", labels, consumer.numbers);
  }
}

}  // namespace

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string metric_name_fragment(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!allowed) c = '_';
  }
  return out;
}

std::string render_metrics(const std::vector<Snapshot>& snapshots) {
  Exposition out;
  for (const Snapshot& s : snapshots) {
    add_process(out, s);
    for (const EndSnapshot& end : s.ends) add_end(out, s, end);
    for (const ListenerSnapshot& listener : s.listeners) add_listener(out, s, listener);
    Labels pid{{"pid", std::to_string(s.pid)}};
    add_numbers(out, "ferry_shared_memory_", "The shared-memory allocator's", pid, s.shared_memory);
    if (s.cuda) add_numbers(out, "ferry_cuda_", "CUDA's", pid, *s.cuda);
    for (const WorkerSnapshot& worker : s.workers) add_worker(out, s, worker);
    for (std::size_t i = 0; i < s.fanouts.size(); ++i) add_fanout(out, s, i, s.fanouts[i]);
  }
  return out.text();
}

}  // namespace ferry::cli
