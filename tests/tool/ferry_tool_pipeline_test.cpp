// The `ferry` binary against a real three-process pipeline with introspection on
// (introspected_pipeline.cpp: source -> relay -> sink, FERRY_INTROSPECT=1): ps, show --json
// and metrics report its channels with the counts that were sent; a stalled sink shows as
// the relay's send end blocked (STALLED in top); a killed process leaves the list.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <regex>
#include <sstream>
#include <thread>

#include "snapshot.hpp"
#include "tool_runner.hpp"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;
using ferry::cli::EndSnapshot;
using ferry::cli::Snapshot;

constexpr std::int64_t messages_sent = 500;

// introspected_pipeline with introspection on; stopped (stdin closed, then SIGKILL) on destruction.
class Pipeline {
 public:
  explicit Pipeline(bool stall) {
    int input[2];
    int output[2];
    if (::pipe2(input, O_CLOEXEC) != 0 || ::pipe2(output, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    std::string program = FERRY_PIPELINE_PATH;
    std::string count = std::to_string(stall ? 50 : messages_sent);
    std::vector<char*> argv{program.data(), count.data()};
    std::string stall_flag = "--stall";
    if (stall) argv.push_back(stall_flag.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(input[0], STDIN_FILENO);
      ::dup2(output[1], STDOUT_FILENO);
      ::setenv("FERRY_INTROSPECT", "1", 1);
      ::execv(program.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(input[0]);
    ::close(output[1]);
    stdin_ = input[1];
    std::string line;
    pollfd polled{output[0], POLLIN, 0};
    char c;
    while (::poll(&polled, 1, 30000) == 1 && ::read(output[0], &c, 1) == 1 && c != '\n') line += c;
    ::close(output[0]);
    std::istringstream words(line);
    std::string ready;
    words >> ready >> source >> relay >> sink;
    if (ready != "ready") throw std::runtime_error("the pipeline did not start: '" + line + "'");
  }
  ~Pipeline() {
    if (stdin_ >= 0) ::close(stdin_);
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(50ms);
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  pid_t source = 0;
  pid_t relay = 0;
  pid_t sink = 0;

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
};

Snapshot show_json(pid_t pid) {
  ToolRun run = run_tool({"show", std::to_string(pid), "--json"});
  if (run.exit_code != 0) throw std::runtime_error("ferry show failed: " + run.err);
  return ferry::cli::parse_snapshot(pid, run.out);
}

// The one end of `snapshot` with this direction and transport.
const EndSnapshot& end_of(const Snapshot& snapshot, const std::string& direction, const std::string& transport) {
  std::vector<const EndSnapshot*> found;
  for (const EndSnapshot& end : snapshot.ends) {
    if (end.direction == direction && end.transport == transport) found.push_back(&end);
  }
  if (found.size() != 1) {
    throw std::runtime_error("pid " + std::to_string(snapshot.pid) + " has " + std::to_string(found.size()) + " " +
                             direction + " ends over " + transport + ":\n" + snapshot.raw);
  }
  return *found.front();
}

std::string line_of(const std::string& out, pid_t pid) {
  std::smatch match;
  return std::regex_search(out, match, std::regex("(^|\n) *" + std::to_string(pid) + " [^\n]*")) ? match.str() : "";
}

TEST(FerryToolPipeline, ReportsTheCountsThatWereSent) {
  Pipeline pipeline(false);
  ToolRun ps = run_tool({"ps"});
  ASSERT_EQ(ps.exit_code, 0) << ps.err;
  for (pid_t pid : {pipeline.source, pipeline.relay, pipeline.sink}) {
    EXPECT_FALSE(line_of(ps.out, pid).empty()) << pid << " missing from\n" << ps.out;
  }
  EXPECT_TRUE(std::regex_search(line_of(ps.out, pipeline.source), std::regex(" main "))) << ps.out;
  EXPECT_TRUE(std::regex_search(line_of(ps.out, pipeline.relay), std::regex(" worker "))) << ps.out;

  Snapshot source = show_json(pipeline.source);
  Snapshot relay = show_json(pipeline.relay);
  Snapshot sink = show_json(pipeline.sink);
  const EndSnapshot& source_out = end_of(source, "send", "shm_ring");
  const EndSnapshot& relay_in = end_of(relay, "recv", "shm_ring");
  const EndSnapshot& relay_out = end_of(relay, "send", "unix_socket");
  const EndSnapshot& sink_in = end_of(sink, "recv", "unix_socket");
  EXPECT_EQ(source_out.label, "to relay");
  EXPECT_EQ(relay_in.label, "to relay");
  EXPECT_EQ(relay_out.label, "to sink");
  EXPECT_EQ(sink_in.label, "to sink");
  // Where the runtime knows the peer (ends handed to spawned workers may not), it is the relay.
  EXPECT_EQ(source_out.peer_pid.value_or(pipeline.relay), pipeline.relay);
  EXPECT_EQ(sink_in.peer_pid.value_or(pipeline.relay), pipeline.relay);
  for (const EndSnapshot* end : {&source_out, &relay_in, &relay_out, &sink_in}) {
    EXPECT_EQ(end->messages, static_cast<std::uint64_t>(messages_sent)) << end->direction << " " << end->transport;
    EXPECT_GT(end->bytes, static_cast<std::uint64_t>(messages_sent) * 200) << end->direction << " " << end->transport;
    EXPECT_EQ(end->state, "open");
  }
  EXPECT_EQ(source_out.bytes, relay_in.bytes);
  EXPECT_EQ(relay_out.bytes, sink_in.bytes);
  EXPECT_EQ(end_of(sink, "send", "pipe").messages, 1u);
  EXPECT_EQ(end_of(source, "recv", "pipe").messages, 1u);

  ToolRun metrics = run_tool({"metrics"});
  ASSERT_EQ(metrics.exit_code, 0) << metrics.err;
  auto sample = [&](pid_t pid, const EndSnapshot& end) {
    return "ferry_end_messages_total{pid=\"" + std::to_string(pid) + "\",end=\"" + std::to_string(end.id) +
           "\",label=\"" + end.label + "\",transport=\"" + end.transport + "\",direction=\"" + end.direction + "\"} " +
           std::to_string(messages_sent) + "\n";
  };
  EXPECT_NE(metrics.out.find(sample(pipeline.source, source_out)), std::string::npos) << metrics.out;
  EXPECT_NE(metrics.out.find(sample(pipeline.relay, relay_in)), std::string::npos) << metrics.out;
  EXPECT_NE(metrics.out.find(sample(pipeline.relay, relay_out)), std::string::npos) << metrics.out;
  EXPECT_NE(metrics.out.find(sample(pipeline.sink, sink_in)), std::string::npos) << metrics.out;
}

TEST(FerryToolPipeline, AStalledSinkShowsAsBlocked) {
  Pipeline pipeline(true);
  // The sink stopped reading: the relay's send end fills up and waits for room.
  bool blocked = false;
  for (int i = 0; i < 100 && !blocked; ++i) {
    blocked = end_of(show_json(pipeline.relay), "send", "unix_socket").blocked_now;
    if (!blocked) std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(blocked) << "the relay's send end never showed as blocked";
  ToolRun show = run_tool({"show", std::to_string(pipeline.relay)});
  EXPECT_TRUE(std::regex_search(show.out, std::regex("send [^\n]*unix_socket [^\n]* blocked "))) << show.out;
  ToolRun top = run_tool({"top", "--once", "--interval", "0.5"});
  ASSERT_EQ(top.exit_code, 0) << top.err;
  EXPECT_TRUE(std::regex_search(
      top.out, std::regex("\n *" + std::to_string(pipeline.relay) + " [^\n]* send [^\n]*unix_socket[^\n]* STALLED\n")))
      << top.out;
  // Stalled ends come first.
  std::smatch first;
  ASSERT_TRUE(std::regex_search(top.out, first, std::regex("MSG/S[^\n]*\n([^\n]*)\n"))) << top.out;
  EXPECT_NE(first[1].str().find("STALLED"), std::string::npos) << top.out;
}

TEST(FerryToolPipeline, AKilledProcessLeavesTheList) {
  Pipeline pipeline(true);
  ASSERT_FALSE(line_of(run_tool({"ps"}).out, pipeline.sink).empty());
  ASSERT_EQ(::kill(pipeline.sink, SIGKILL), 0);
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    ToolRun ps = run_tool({"ps"});
    gone = line_of(ps.out, pipeline.sink).empty() && ps.err.find(std::to_string(pipeline.sink)) == std::string::npos;
    if (!gone) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(gone) << "the killed sink is still listed";
  EXPECT_EQ(run_tool({"show", std::to_string(pipeline.sink)}).exit_code, 3);
}

}  // namespace
}  // namespace ferry::test
