// ferry::to_json: a Snapshot as one line of JSON, schema version 1
// (docs/design/introspection.md).
#include <cstdio>
#include <string>
#include <string_view>

#include "ferry/introspection.hpp"

namespace ferry {
namespace {

class JsonWriter {
 public:
  std::string text;

  void string(std::string_view value) {
    text += '"';
    for (const char c : value) {
      const auto byte = static_cast<unsigned char>(c);
      switch (c) {
        case '"': text += "\\\""; break;
        case '\\': text += "\\\\"; break;
        case '\n': text += "\\n"; break;
        case '\r': text += "\\r"; break;
        case '\t': text += "\\t"; break;
        default:
          if (byte < 0x20) {
            char escaped[8];
            std::snprintf(escaped, sizeof escaped, "\\u%04x", byte);
            text += escaped;
          } else {
            text += c;  // UTF-8 passes as it is
          }
      }
    }
    text += '"';
  }
  void key(std::string_view name) {
    comma();
    string(name);
    text += ':';
    pending_value_ = true;
  }
  void open(char bracket) {
    value_prefix();
    text += bracket;
    first_ = true;
  }
  void close(char bracket) {
    text += bracket;
    first_ = false;
  }
  template <class Number>
  void number(Number value) {
    value_prefix();
    text += std::to_string(value);
    first_ = false;
  }
  void boolean(bool value) {
    value_prefix();
    text += value ? "true" : "false";
    first_ = false;
  }
  void null() {
    value_prefix();
    text += "null";
    first_ = false;
  }
  void string_value(std::string_view value) {
    value_prefix();
    string(value);
    first_ = false;
  }
  template <class Number>
  void field(std::string_view name, Number value) {
    key(name);
    number(value);
  }
  void field_string(std::string_view name, std::string_view value) {
    key(name);
    string_value(value);
  }
  template <class Number>
  void field_optional(std::string_view name, const std::optional<Number>& value) {
    key(name);
    if (value) {
      number(*value);
    } else {
      null();
    }
  }

 private:
  void comma() {
    if (!first_) text += ',';
    first_ = false;
  }
  // A value in an array needs a comma before it unless it is the first; after a key none.
  void value_prefix() {
    if (pending_value_) {
      pending_value_ = false;
      return;
    }
    comma();
  }

  bool first_ = true;
  bool pending_value_ = false;
};

void write_end(JsonWriter& json, const EndSnapshot& end) {
  json.open('{');
  json.field("id", end.id);
  json.field_string("direction", end.sends ? "send" : "recv");
  json.field_string("label", end.label);
  json.field_string("transport", end.transport);
  json.field_optional("peer_pid", end.peer_pid);
  json.field_string("state", end.state);
  json.field("messages", end.messages);
  json.field("bytes", end.bytes);
  json.field("tensors", end.tensors);
  json.field("new_segments", end.new_segments);
  json.field_optional("in_flight", end.in_flight);
  json.field("blocked_ns", end.blocked_ns);
  json.key("blocked_now");
  json.boolean(end.blocked_now);
  json.field("last_activity_ns", end.last_activity_ns);
  json.close('}');
}

void write_listener(JsonWriter& json, const ListenerSnapshot& listener) {
  json.open('{');
  json.field_string("address", listener.address);
  json.field("accepted", listener.accepted);
  json.key("refused");
  json.open('{');
  for (const auto& [reason, count] : listener.refused) json.field(reason, count);
  json.close('}');
  json.field("handshakes_in_progress", listener.handshakes_in_progress);
  json.close('}');
}

void write_shared_memory(JsonWriter& json, const SharedMemoryStats& stats) {
  json.open('{');
  json.field("segments", stats.segments);
  json.field("segment_bytes", stats.segment_bytes);
  json.field("bytes_in_use", stats.bytes_in_use);
  json.field("bytes_cached", stats.bytes_cached);
  json.field("blocks_in_use", stats.blocks_in_use);
  json.field("hits", stats.hits);
  json.field("misses", stats.misses);
  json.field("misses_after_release", stats.misses_after_release);
  json.field("misses_cold", stats.misses_cold);
  json.field("segments_released", stats.segments_released);
  json.close('}');
}

void write_worker(JsonWriter& json, const WorkerSnapshot& worker) {
  json.open('{');
  json.field("rank", worker.rank);
  json.field("pid", worker.pid);
  json.field_string("state", worker.state);
  json.field_optional("exit_code", worker.exit_code);
  json.field_optional("signal", worker.signal);
  json.close('}');
}

void write_fanout(JsonWriter& json, const FanoutSnapshot& fanout) {
  json.open('{');
  json.field_string("kind", fanout.kind);
  json.field_string("label", fanout.label);
  json.key("consumers");
  json.open('[');
  for (std::size_t index = 0; index < fanout.consumers.size(); ++index) {
    const ConsumerStats& consumer = fanout.consumers[index];
    json.open('{');
    json.field("index", index);
    json.field("id", consumer.id);
    json.field_string("transport", transport_name(consumer.transport));
    json.field("sent", consumer.sent);
    json.field("delivered", consumer.delivered);
    json.field("in_flight", consumer.in_flight);
    json.field("window", consumer.window);
    json.field("skipped", consumer.skipped);
    json.close('}');
  }
  json.close(']');
  json.close('}');
}

template <class Item, class Write>
void write_array(JsonWriter& json, std::string_view name, const std::vector<Item>& items, Write write) {
  json.key(name);
  json.open('[');
  for (const Item& item : items) write(json, item);
  json.close(']');
}

}  // namespace

std::string to_json(const Snapshot& snapshot) {
  JsonWriter json;
  json.open('{');
  json.field("version", snapshot.version);
  json.field("pid", snapshot.pid);
  json.field_string("program", snapshot.program);
  json.field_string("role", snapshot.role);
  json.field_optional("rank", snapshot.rank);
  json.field("monotonic_ns", snapshot.monotonic_ns);
  write_array(json, "ends", snapshot.ends, write_end);
  write_array(json, "listeners", snapshot.listeners, write_listener);
  json.key("shared_memory");
  write_shared_memory(json, snapshot.shared_memory);
  json.key("cuda");
  if (snapshot.cuda) {
    json.open('{');
    for (const auto& [name, value] : snapshot.cuda->figures) json.field(name, value);
    json.close('}');
  } else {
    json.null();
  }
  write_array(json, "workers", snapshot.workers, write_worker);
  write_array(json, "fanouts", snapshot.fanouts, write_fanout);
  json.key("introspection");
  json.open('{');
  json.field("served", snapshot.introspection.served);
  json.field("refused_other_user", snapshot.introspection.refused_other_user);
  json.field("dropped", snapshot.introspection.dropped);
  json.close('}');
  json.close('}');
  json.text += '\n';
  return json.text;
}

}  // namespace ferry
