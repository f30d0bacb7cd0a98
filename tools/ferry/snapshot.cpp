#include "snapshot.hpp"

#include <rapidjson/document.h>
#include <rapidjson/error/en.h>

#include <algorithm>
#include <cctype>

#include "cli_error.hpp"

namespace ferry::cli {
namespace {

using Json = rapidjson::Value;

// Reads the members of one JSON object, naming the object's path in every error.
class Reader {
 public:
  Reader(pid_t pid, const Json& object, std::string path) : pid_(pid), object_(object), path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw CliError(ExitCode::bad_reply,
                   "pid " + std::to_string(pid_) + " sent a malformed snapshot: " + path_ + field + " " + what);
  }
  const Json* find(const char* field) const {
    auto member = object_.FindMember(field);
    return member == object_.MemberEnd() ? nullptr : &member->value;
  }
  std::uint64_t u64(const char* field) const {
    const Json* value = find(field);
    if (value == nullptr || value->IsNull()) return 0;
    if (!value->IsUint64()) fail(field, "is not a non-negative integer");
    return value->GetUint64();
  }
  std::optional<std::int64_t> optional_i64(const char* field) const {
    const Json* value = find(field);
    if (value == nullptr || value->IsNull()) return std::nullopt;
    if (!value->IsInt64()) fail(field, "is not an integer or null");
    return value->GetInt64();
  }
  std::string text(const char* field) const {
    const Json* value = find(field);
    if (value == nullptr || value->IsNull()) return {};
    if (!value->IsString()) fail(field, "is not a string");
    return std::string(value->GetString(), value->GetStringLength());
  }
  bool boolean(const char* field) const {
    const Json* value = find(field);
    if (value == nullptr || value->IsNull()) return false;
    if (!value->IsBool()) fail(field, "is not true or false");
    return value->GetBool();
  }
  // The array `field` (empty when absent); calls read(element, "field[i]") for each object in it.
  template <class Read>
  void each_object(const char* field, Read read) const {
    const Json* value = find(field);
    if (value == nullptr || value->IsNull()) return;
    if (!value->IsArray()) fail(field, "is not an array");
    for (rapidjson::SizeType i = 0; i < value->Size(); ++i) {
      std::string element_path = path_ + field + "[" + std::to_string(i) + "]";
      if (!(*value)[i].IsObject()) fail(std::string(field) + "[" + std::to_string(i) + "]", "is not an object");
      read(Reader(pid_, (*value)[i], element_path + "."));
    }
  }
  const Json& object() const { return object_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
  const Json& object_;
  std::string path_;
};

// Every number under `value`, by dotted path (objects and arrays flattened; other values skipped).
void collect_numbers(const Json& value, const std::string& prefix, std::vector<NamedNumber>& out) {
  if (value.IsNumber()) {
    out.push_back({prefix, value.GetDouble()});
  } else if (value.IsBool()) {
    out.push_back({prefix, value.GetBool() ? 1.0 : 0.0});
  } else if (value.IsObject()) {
    for (auto member = value.MemberBegin(); member != value.MemberEnd(); ++member) {
      std::string name(member->name.GetString(), member->name.GetStringLength());
      collect_numbers(member->value, prefix.empty() ? name : prefix + "." + name, out);
    }
  } else if (value.IsArray()) {
    for (rapidjson::SizeType i = 0; i < value.Size(); ++i) {
      collect_numbers(value[i], prefix.empty() ? std::to_string(i) : prefix + "." + std::to_string(i), out);
    }
  }
}

EndSnapshot read_end(const Reader& in) {
  EndSnapshot end;
  end.id = in.u64("id");
  end.direction = in.text("direction");
  end.label = in.text("label");
  end.transport = in.text("transport");
  end.peer_pid = in.optional_i64("peer_pid");
  end.state = in.text("state");
  end.messages = in.u64("messages");
  end.bytes = in.u64("bytes");
  end.tensors = in.u64("tensors");
  end.new_segments = in.u64("new_segments");
  end.in_flight = in.optional_i64("in_flight");
  end.blocked_ns = in.u64("blocked_ns");
  end.blocked_now = in.boolean("blocked_now");
  end.last_activity_ns = in.u64("last_activity_ns");
  return end;
}

ListenerSnapshot read_listener(const Reader& in) {
  ListenerSnapshot listener;
  listener.address = in.text("address");
  listener.accepted = in.u64("accepted");
  listener.handshakes_in_progress = in.u64("handshakes_in_progress");
  if (const Json* refused = in.find("refused"); refused != nullptr && !refused->IsNull()) {
    if (!refused->IsObject()) in.fail("refused", "is not an object");
    Reader reasons(in.pid(), *refused, "refused.");
    for (auto member = refused->MemberBegin(); member != refused->MemberEnd(); ++member) {
      listener.refused.emplace_back(member->name.GetString(), reasons.u64(member->name.GetString()));
    }
  }
  return listener;
}

WorkerSnapshot read_worker(const Reader& in) {
  WorkerSnapshot worker;
  worker.rank = in.optional_i64("rank");
  worker.pid = in.optional_i64("pid").value_or(0);
  worker.state = in.text("state");
  worker.exit_code = in.optional_i64("exit_code");
  worker.signal = in.optional_i64("signal");
  return worker;
}

ConsumerSnapshot read_consumer(const Reader& in) {
  ConsumerSnapshot consumer;
  consumer.index = in.u64("index");
  for (auto member = in.object().MemberBegin(); member != in.object().MemberEnd(); ++member) {
    std::string name(member->name.GetString(), member->name.GetStringLength());
    if (name == "index") continue;
    if (member->value.IsString()) {
      consumer.texts.emplace_back(name, std::string(member->value.GetString(), member->value.GetStringLength()));
    } else {
      collect_numbers(member->value, name, consumer.numbers);
    }
  }
  return consumer;
}

FanoutSnapshot read_fanout(const Reader& in) {
  FanoutSnapshot fanout;
  fanout.kind = in.text("kind");
  fanout.label = in.text("label");
  in.each_object("consumers", [&](const Reader& consumer) { fanout.consumers.push_back(read_consumer(consumer)); });
  return fanout;
}

// An {"error": "..."} reply: the server refused or failed.
[[noreturn]] void refuse_error_reply(pid_t pid, const std::string& error) {
  std::string lowered = error;
  std::transform(lowered.begin(), lowered.end(), lowered.begin(), [](unsigned char c) { return std::tolower(c); });
  bool permission = lowered.find("permission") != std::string::npos || lowered.find("uid") != std::string::npos;
  throw CliError(permission ? ExitCode::permission : ExitCode::bad_reply,
                 "pid " + std::to_string(pid) + " answered with an error: " + error);
}

std::string excerpt(const std::string& reply) {
  std::string shown;
  for (char c : reply.substr(0, 60)) shown += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  return shown + (reply.size() > 60 ? "..." : "");
}

}  // namespace

double Snapshot::shared_memory_value(const std::string& name) const {
  for (const NamedNumber& number : shared_memory) {
    if (number.name == name) return number.value;
  }
  return 0;
}

Snapshot parse_snapshot(pid_t pid, const std::string& reply) {
  rapidjson::Document document;
  document.Parse(reply.data(), reply.size());
  if (document.HasParseError()) {
    throw CliError(ExitCode::bad_reply, "pid " + std::to_string(pid) + " sent a reply that is not JSON (" +
                                            rapidjson::GetParseError_En(document.GetParseError()) + " at byte " +
                                            std::to_string(document.GetErrorOffset()) + "): \"" + excerpt(reply) +
                                            "\"");
  }
  if (!document.IsObject()) {
    throw CliError(ExitCode::bad_reply, "pid " + std::to_string(pid) + " sent a reply that is not a JSON object");
  }
  Reader in(pid, document, "");
  if (in.find("error") != nullptr) refuse_error_reply(pid, in.text("error"));
  Snapshot snapshot;
  snapshot.raw = reply;
  snapshot.version = in.optional_i64("version").value_or(0);
  if (snapshot.version != snapshot_schema_version) {
    throw CliError(ExitCode::bad_reply, "pid " + std::to_string(pid) + " sent a snapshot of schema version " +
                                            std::to_string(snapshot.version) + "; this ferry reads version " +
                                            std::to_string(snapshot_schema_version) +
                                            " (use the ferry tool of the same release)");
  }
  auto claimed = in.optional_i64("pid");
  if (!claimed || *claimed != pid) in.fail("pid", "does not name the process asked (" + std::to_string(pid) + ")");
  snapshot.pid = pid;
  snapshot.program = in.text("program");
  snapshot.role = in.text("role");
  snapshot.rank = in.optional_i64("rank");
  snapshot.monotonic_ns = in.u64("monotonic_ns");
  in.each_object("ends", [&](const Reader& end) { snapshot.ends.push_back(read_end(end)); });
  in.each_object("listeners", [&](const Reader& listener) { snapshot.listeners.push_back(read_listener(listener)); });
  if (const Json* shared = in.find("shared_memory"); shared != nullptr)
    collect_numbers(*shared, "", snapshot.shared_memory);
  if (const Json* cuda = in.find("cuda"); cuda != nullptr && !cuda->IsNull()) {
    snapshot.cuda.emplace();
    collect_numbers(*cuda, "", *snapshot.cuda);
  }
  in.each_object("workers", [&](const Reader& worker) { snapshot.workers.push_back(read_worker(worker)); });
  in.each_object("fanouts", [&](const Reader& fanout) { snapshot.fanouts.push_back(read_fanout(fanout)); });
  return snapshot;
}

}  // namespace ferry::cli
