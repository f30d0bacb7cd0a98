// The `ferry` binary against fake introspection servers (real processes on real abstract
// sockets): what it lists and prints, and how it treats a squatted name, a hung server, a
// garbage reply, an error reply, another user's process and a bad command line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <regex>

#include "snapshot.hpp"
#include "tool_runner.hpp"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;

std::string pid_text(pid_t pid) { return std::to_string(pid); }

// The line of `out` that starts with `pid` (after alignment spaces), or "".
std::string line_of(const std::string& out, pid_t pid) {
  std::regex line("(^|\n) *" + pid_text(pid) + " [^\n]*");
  std::smatch match;
  return std::regex_search(out, match, line) ? match.str() : "";
}

TEST(FerryTool, HelpDocumentsEveryCommandAndExitCode) {
  ToolRun run = run_tool({"--help"});
  EXPECT_EQ(run.exit_code, 0);
  for (const char* text : {"ps", "top", "show PID", "--json", "metrics", "--once", "-n N", "--timeout", "Exit codes",
                           "  3 ", "  4 ", "  5 "}) {
    EXPECT_NE(run.out.find(text), std::string::npos) << text;
  }
  EXPECT_EQ(run_tool({"show", "--help"}).out, run.out);
}

TEST(FerryTool, BadCommandLinesExitWithTwo) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{{},
                                                                                    {"frobnicate"},
                                                                                    {"show"},
                                                                                    {"show", "abc"},
                                                                                    {"show", "-5"},
                                                                                    {"ps", "extra"},
                                                                                    {"top", "-n", "0"},
                                                                                    {"--timeout", "-1", "ps"},
                                                                                    {"top", "--interval"}}) {
    ToolRun run = run_tool(args);
    EXPECT_EQ(run.exit_code, 2) << (args.empty() ? "(none)" : args[0]) << ": " << run.err;
    EXPECT_NE(run.err.find("ferry --help"), std::string::npos) << run.err;
  }
}

TEST(FerryTool, PsListsAnIntrospectableProcess) {
  FakeServer server({"serve"});
  ToolRun run = run_tool({"ps"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out.rfind("    PID  PROGRAM", 0), std::string::npos);  // header present below
  EXPECT_NE(run.out.find("PROGRAM"), std::string::npos);
  std::string line = line_of(run.out, server.pid());
  ASSERT_FALSE(line.empty()) << run.out;
  // pid, program, role and rank, 2 ends, 1 listener, 1 worker, 16 MiB in use, 24 MiB mapped.
  EXPECT_TRUE(std::regex_search(line, std::regex("fake_server +worker 2 +2 +1 +1 +16.0 MiB +24.0 MiB$"))) << line;
}

TEST(FerryTool, ShowJsonPrintsTheDocumentAsReceived) {
  FakeServer server({"serve"});
  ToolRun run = run_tool({"show", pid_text(server.pid()), "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  ferry::cli::Snapshot snapshot = ferry::cli::parse_snapshot(server.pid(), run.out);
  ASSERT_EQ(snapshot.ends.size(), 2u);
  EXPECT_EQ(snapshot.ends[0].messages, 1000u);
  EXPECT_EQ(snapshot.ends[0].bytes, 64000u);
  EXPECT_EQ(run.out.back(), '\n');
  EXPECT_EQ(std::count(run.out.begin(), run.out.end(), '\n'), 1);
}

TEST(FerryTool, ShowPrintsEverySection) {
  FakeServer server({"serve"});
  ToolRun run = run_tool({"show", pid_text(server.pid())});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  for (const char* text :
       {"program fake_server", "role worker 2", "ends (2)", "batches", "results", "shm_ring", "listeners (1)",
        "unix:/tmp/fake.sock", "bad_handshake 2", "bytes_in_use", "16.0 MiB", "cuda: none", "workers (1)", "4242",
        "exited", "fan-outs (1)", "distributor \"work\"", "delivered"}) {
    EXPECT_NE(run.out.find(text), std::string::npos) << text << " missing from\n" << run.out;
  }
}

TEST(FerryTool, MetricsLabelEachProcessAndEnd) {
  FakeServer server({"serve", "--label", "say \"hi\""});
  ToolRun run = run_tool({"metrics"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::string end = "{pid=\"" + pid_text(server.pid()) +
                    "\",end=\"0\",label=\"say \\\"hi\\\"\",transport=\"shm_ring\","
                    "direction=\"send\"}";
  EXPECT_NE(run.out.find("\nferry_end_messages_total" + end + " 1000\n"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("\nferry_end_bytes_total" + end + " 64000\n"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("ferry_listener_refused_total{pid=\"" + pid_text(server.pid()) +
                         "\",address=\"unix:/tmp/fake.sock\",reason=\"bad_handshake\"} 2\n"),
            std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("ferry_shared_memory_hits_total{pid=\"" + pid_text(server.pid()) + "\"} 41\n"),
            std::string::npos);
}

TEST(FerryTool, TopOnceMarksAStalledEnd) {
  FakeServer server({"serve", "--advance", "--stalled"});
  ToolRun run = run_tool({"top", "--once", "--interval", "0.2"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::regex stalled("\n *" + pid_text(server.pid()) + " +fake_server +1 +send +results[^\n]* 100% +STALLED\n");
  EXPECT_TRUE(std::regex_search(run.out, stalled)) << run.out;
  std::regex busy("\n *" + pid_text(server.pid()) + " +fake_server +0 +send +batches[^\n]*open\n");
  EXPECT_TRUE(std::regex_search(run.out, busy)) << run.out;
  EXPECT_EQ(run.out.find('\x1b'), std::string::npos) << "escape sequences in batch mode";
}

TEST(FerryTool, ServerTextNeverReachesTheTerminalAsControlCharacters) {
  FakeServer server({"serve", "--label", "\x1b]0;owned\x07\x1b[2J"});
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"ps"}, {"show", pid_text(server.pid())}, {"top", "--once", "--interval", "0.1"}}) {
    ToolRun run = run_tool(args);
    EXPECT_EQ(run.exit_code, 0) << run.err;
    EXPECT_EQ(run.out.find('\x1b'), std::string::npos) << args[0];
    EXPECT_EQ(run.out.find('\x07'), std::string::npos) << args[0];
  }
}

TEST(FerryTool, AbsentProcessOrIntrospectionOffIsReported) {
  ToolRun self = run_tool({"show", pid_text(::getpid())});
  EXPECT_EQ(self.exit_code, 3);
  EXPECT_NE(self.err.find("introspection is off"), std::string::npos) << self.err;
  pid_t gone;
  {
    FakeServer server({"serve"});
    gone = server.pid();
  }
  ToolRun dead = run_tool({"show", pid_text(gone)});
  EXPECT_EQ(dead.exit_code, 3) << dead.err;
  EXPECT_NE(dead.err.find("no such process"), std::string::npos) << dead.err;
  EXPECT_TRUE(line_of(run_tool({"ps"}).out, gone).empty()) << "a killed process stays listed";
}

TEST(FerryTool, SquattedNameIsRefused) {
  // The fake server binds this test's name and claims to be this test process.
  FakeServer squatter({"squat", pid_text(::getpid())});
  ToolRun show = run_tool({"show", pid_text(::getpid())});
  EXPECT_EQ(show.exit_code, 5);
  EXPECT_NE(show.err.find("squatted"), std::string::npos) << show.err;
  EXPECT_NE(show.err.find(pid_text(squatter.pid())), std::string::npos) << show.err;
  ToolRun ps = run_tool({"ps"});
  EXPECT_EQ(ps.exit_code, 0);
  EXPECT_TRUE(line_of(ps.out, ::getpid()).empty()) << ps.out;
  EXPECT_NE(ps.err.find("squatted"), std::string::npos) << ps.err;
}

TEST(FerryTool, HungServersTimeOut) {
  for (const char* mode : {"hang", "mute"}) {
    FakeServer hung({mode});
    FakeServer good({"serve"});
    ToolRun show = run_tool({"--timeout", "0.5", "show", pid_text(hung.pid())});
    EXPECT_EQ(show.exit_code, 5) << mode;
    EXPECT_NE(show.err.find("within 500 ms"), std::string::npos) << show.err;
    EXPECT_LT(show.took, 3s) << mode;
    // One hung process delays ps by one timeout, and the others are still listed.
    ToolRun ps = run_tool({"--timeout", "0.5", "ps"});
    EXPECT_EQ(ps.exit_code, 0);
    EXPECT_FALSE(line_of(ps.out, good.pid()).empty()) << ps.out;
    EXPECT_LT(ps.took, 3s) << mode;
  }
}

TEST(FerryTool, BadRepliesAreReported) {
  struct Case {
    const char* mode;
    const char* says;
  };
  for (const Case& c :
       {Case{"garbage", "not JSON"}, Case{"error", "unknown request"}, Case{"close", "without a reply"}}) {
    FakeServer server({c.mode});
    ToolRun show = run_tool({"show", pid_text(server.pid())});
    EXPECT_EQ(show.exit_code, 5) << c.mode;
    EXPECT_NE(show.err.find(c.says), std::string::npos) << show.err;
    EXPECT_EQ(show.err.find('\x1b'), std::string::npos) << c.mode;
    ToolRun ps = run_tool({"ps"});
    EXPECT_EQ(ps.exit_code, 0);
    EXPECT_NE(ps.err.find(c.says), std::string::npos) << ps.err;
  }
}

TEST(FerryTool, AnotherUsersProcessIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to run the tool as another user (nobody)";
  FakeServer server({"serve"});
  ToolRun show = run_tool({"show", pid_text(server.pid())}, 65534);
  EXPECT_EQ(show.exit_code, 4) << show.err;
  EXPECT_NE(show.err.find("permission refused"), std::string::npos) << show.err;
  ToolRun ps = run_tool({"ps"}, 65534);
  EXPECT_EQ(ps.exit_code, 0);
  EXPECT_TRUE(line_of(ps.out, server.pid()).empty()) << ps.out;
}

}  // namespace
}  // namespace ferry::test
