// The `ferry` tool's parts, without processes: discovery's parsing of /proc/net/unix, the
// snapshot model, units, tables, the Prometheus exposition and `ferry top`'s rates and frame.
#include <gtest/gtest.h>

#include <regex>
#include <sstream>

#include "cli_error.hpp"
#include "discovery.hpp"
#include "metrics_command.hpp"
#include "ps_command.hpp"
#include "show_command.hpp"
#include "snapshot.hpp"
#include "table.hpp"
#include "top_model.hpp"
#include "units.hpp"

namespace ferry::cli {
namespace {

// A version-1 snapshot of process `pid` with one end, as a server sends it.
std::string document(int pid, std::uint64_t monotonic_ns, std::uint64_t messages, std::uint64_t bytes,
                     std::uint64_t blocked_ns, bool blocked_now, const std::string& label = "\"batches\"") {
  return R"({"version":1,"pid":)" + std::to_string(pid) + R"(,"program":"pipeline","role":"worker","rank":1,)" +
         R"("monotonic_ns":)" + std::to_string(monotonic_ns) + R"(,"ends":[{"id":3,"direction":"send","label":)" +
         label + R"(,"transport":"shm_ring","peer_pid":77,"state":"open","messages":)" + std::to_string(messages) +
         R"(,"bytes":)" + std::to_string(bytes) + R"(,"tensors":2,"new_segments":1,"in_flight":4,"blocked_ns":)" +
         std::to_string(blocked_ns) + R"(,"blocked_now":)" + (blocked_now ? "true" : "false") +
         R"(,"last_activity_ns":5}],"listeners":[],"shared_memory":{"bytes_in_use":1536,"segment_bytes":4096},)" +
         R"("cuda":null,"workers":[],"fanouts":[]})" + "\n";
}

Snapshot parsed(int pid, std::uint64_t monotonic_ns, std::uint64_t messages, std::uint64_t bytes,
                std::uint64_t blocked_ns, bool blocked_now) {
  return parse_snapshot(pid, document(pid, monotonic_ns, messages, bytes, blocked_ns, blocked_now, "\"batches\""));
}

ExitCode code_of_parse(int pid, const std::string& reply, std::string* message = nullptr) {
  try {
    parse_snapshot(pid, reply);
  } catch (const CliError& error) {
    if (message) *message = error.what();
    return error.code();
  }
  return ExitCode::ok;
}

TEST(ToolDiscovery, FindsListeningIntrospectionSocketsOnly) {
  std::string table =
      "Num       RefCount Protocol Flags    Type St Inode Path\n"
      "0000000000000000: 00000002 00000000 00010000 0001 01 100 @ferry-introspect.456\n"
      "0000000000000000: 00000003 00000000 00000000 0001 03 101 @ferry-introspect.456\n"  // accepted connection
      "0000000000000000: 00000002 00000000 00010000 0001 01 102 @ferry-introspect.123\n"
      "0000000000000000: 00000002 00000000 00010000 0001 01 103 @ferry-introspect.0123\n"  // leading zero
      "0000000000000000: 00000002 00000000 00010000 0001 01 104 @ferry-introspect.12x\n"
      "0000000000000000: 00000002 00000000 00010000 0001 01 105 @ferry-introspect.\n"
      "0000000000000000: 00000002 00000000 00010000 0001 01 106 /tmp/ferry-introspect.9\n"  // a file, not abstract
      "0000000000000000: 00000002 00000000 00010000 0002 01 107 @ferry-introspect.99\n"     // datagram
      "0000000000000000: 00000002 00000000 00010000 0001 01 108 @other.7\n"
      "0000000000000000: 00000002 00000000 00010000 0001 01 109\n"  // unnamed
      "garbage line\n"
      "0000000000000000: 00000002 00000000 00010000 0001 01 110 @ferry-introspect.99999999999\n";
  EXPECT_EQ(parse_introspectable_pids(table), (std::vector<pid_t>{123, 456}));
  EXPECT_EQ(introspection_socket_name(42), "ferry-introspect.42");
}

TEST(ToolSnapshot, ReadsEveryField) {
  std::string reply = R"({"version":1,"pid":10,"program":"p","role":"main","rank":null,"monotonic_ns":99,
    "ends":[{"id":1,"direction":"recv","label":"x","transport":"pipe","peer_pid":null,"state":"peer_died",
             "messages":5,"bytes":18446744073709551615,"tensors":1,"new_segments":2,"in_flight":3,"blocked_ns":4,
             "blocked_now":true,"last_activity_ns":6,"future_field":[1,2]}],
    "listeners":[{"address":"unix:/s","accepted":2,"refused":{"bad_secret":3,"full":1},"handshakes_in_progress":1}],
    "shared_memory":{"bytes_in_use":10,"segments":1},"cuda":{"devices":[{"bytes":7}]},
    "workers":[{"rank":0,"pid":11,"state":"failed","exit_code":null,"signal":9}],
    "fanouts":[{"kind":"broadcast","label":"b","consumers":[{"index":0,"transport":"shm_ring","sent":4,"skipped":1}]}]})";
  Snapshot s = parse_snapshot(10, reply);
  EXPECT_EQ(s.raw, reply);
  EXPECT_EQ(s.program, "p");
  EXPECT_FALSE(s.rank.has_value());
  ASSERT_EQ(s.ends.size(), 1u);
  EXPECT_EQ(s.ends[0].state, "peer_died");
  EXPECT_EQ(s.ends[0].bytes, 18446744073709551615ull);
  EXPECT_FALSE(s.ends[0].peer_pid.has_value());
  EXPECT_TRUE(s.ends[0].blocked_now);
  ASSERT_EQ(s.listeners.size(), 1u);
  EXPECT_EQ(s.listeners[0].refused.size(), 2u);
  EXPECT_EQ(s.shared_memory_value("bytes_in_use"), 10);
  ASSERT_TRUE(s.cuda.has_value());
  ASSERT_EQ(s.cuda->size(), 1u);
  EXPECT_EQ((*s.cuda)[0].name, "devices.0.bytes");
  ASSERT_EQ(s.workers.size(), 1u);
  EXPECT_EQ(s.workers[0].signal, 9);
  EXPECT_FALSE(s.workers[0].exit_code.has_value());
  ASSERT_EQ(s.fanouts.size(), 1u);
  ASSERT_EQ(s.fanouts[0].consumers.size(), 1u);
  EXPECT_EQ(s.fanouts[0].consumers[0].texts.size(), 1u);
  EXPECT_EQ(s.fanouts[0].consumers[0].numbers.size(), 2u);
}

TEST(ToolSnapshot, MissingSectionsAndCountersReadAsEmpty) {
  Snapshot s = parse_snapshot(3, R"({"version":1,"pid":3,"ends":[{"id":0}]})");
  ASSERT_EQ(s.ends.size(), 1u);
  EXPECT_EQ(s.ends[0].messages, 0u);
  EXPECT_TRUE(s.listeners.empty());
  EXPECT_FALSE(s.cuda.has_value());
}

TEST(ToolSnapshot, RefusesBadReplies) {
  std::string message;
  EXPECT_EQ(code_of_parse(3, "\x1b[2Jnot json\n", &message), ExitCode::bad_reply);
  EXPECT_NE(message.find("not JSON"), std::string::npos) << message;
  EXPECT_EQ(message.find('\x1b'), std::string::npos) << "control characters reach the terminal";
  EXPECT_EQ(code_of_parse(3, "[1,2]"), ExitCode::bad_reply);
  EXPECT_EQ(code_of_parse(3, R"({"version":1,"pid":3} trailing)"), ExitCode::bad_reply);
  EXPECT_EQ(code_of_parse(3, R"({"version":2,"pid":3})", &message), ExitCode::bad_reply);
  EXPECT_NE(message.find("version 2"), std::string::npos) << message;
  EXPECT_EQ(code_of_parse(3, R"({"version":1,"pid":4})", &message), ExitCode::bad_reply);
  EXPECT_EQ(code_of_parse(3, R"({"version":1,"pid":3,"ends":[{"messages":-1}]})", &message), ExitCode::bad_reply);
  EXPECT_NE(message.find("ends[0].messages"), std::string::npos) << message;
  EXPECT_EQ(code_of_parse(3, R"({"version":1,"pid":3,"ends":{}})"), ExitCode::bad_reply);
  EXPECT_EQ(code_of_parse(3, R"({"error":"unknown request"})", &message), ExitCode::bad_reply);
  EXPECT_NE(message.find("unknown request"), std::string::npos) << message;
  EXPECT_EQ(code_of_parse(3, R"({"error":"permission refused: uid 5"})"), ExitCode::permission);
  EXPECT_EQ(code_of_parse(3, std::string("{\"version\":1,\0\"pid\":3}", 22)), ExitCode::bad_reply);
}

TEST(ToolUnits, AreShortAndExact) {
  EXPECT_EQ(human_bytes(0), "0 B");
  EXPECT_EQ(human_bytes(1023), "1023 B");
  EXPECT_EQ(human_bytes(1536), "1.5 KiB");
  EXPECT_EQ(human_bytes(16 << 20), "16.0 MiB");
  EXPECT_EQ(human_count(950), "950");
  EXPECT_EQ(human_count(12345), "12.3k");
  EXPECT_EQ(human_count(2.5), "2.5");
  EXPECT_EQ(human_byte_rate(2048), "2.0 KiB/s");
  EXPECT_EQ(human_percent(37.4), "37%");
  EXPECT_EQ(human_duration_ns(850), "850 ns");
  EXPECT_EQ(human_duration_ns(3.4e6), "3.4 ms");
  EXPECT_EQ(human_duration_ns(303e9), "5m03s");
}

TEST(ToolTable, AlignsShrinksAndSanitises) {
  Table table({{"NAME", Align::left, 4}, {"N", Align::right}});
  table.add_row({"short", "1"});
  table.add_row({"a much longer name", "12345"});
  table.add_row({"evil\x1b[31m", "2"});
  std::vector<std::string> wide = table.render();
  ASSERT_EQ(wide.size(), 4u);
  EXPECT_EQ(wide[0], "NAME                    N");
  EXPECT_EQ(wide[1], "short                   1");
  EXPECT_EQ(wide[2], "a much longer name  12345");
  EXPECT_EQ(wide[3], "evil?[31m               2");
  std::vector<std::string> narrow = table.render(14);
  for (const std::string& line : narrow) EXPECT_LE(display_width(line), 14u) << line;
  EXPECT_EQ(narrow[2], "a much~  12345");
  EXPECT_EQ(printable("caf\xc3\xa9\xff\x7f"), "caf\xc3\xa9??");
  EXPECT_EQ(display_width("caf\xc3\xa9"), 4u);
  EXPECT_EQ(cut_to_width("caf\xc3\xa9s", 4), "caf~");
}

TEST(ToolTable, DropsColumnsHighestRankFirst) {
  Table table({{"A"}, {"BB", Align::left, 0, 1}, {"CCC", Align::left, 0, 2}, {"D"}});
  table.add_row({"a", "b", "c", "d"});
  EXPECT_EQ(table.render(), (std::vector<std::string>{"A  BB  CCC  D", "a  b   c    d"}));
  EXPECT_EQ(table.render(9), (std::vector<std::string>{"A  BB  D", "a  b   d"}));
  EXPECT_EQ(table.render(4), (std::vector<std::string>{"A  D", "a  d"}));
  EXPECT_EQ(table.render(3), (std::vector<std::string>{"A ~", "a ~"}));
}

TEST(ToolPs, OneAlignedLinePerProcess) {
  std::vector<Snapshot> snapshots{parsed(12, 1, 1, 1, 0, false), parsed(7000, 1, 1, 1, 0, false)};
  std::string out = render_ps(snapshots);
  EXPECT_EQ(out,
            " PID  PROGRAM   ROLE      ENDS  LISTENERS  WORKERS  SHM IN USE  SHM MAPPED\n"
            "  12  pipeline  worker 1     1          0        0     1.5 KiB     4.0 KiB\n"
            "7000  pipeline  worker 1     1          0        0     1.5 KiB     4.0 KiB\n");
}

TEST(ToolShow, NamesEverySection) {
  std::string out = render_show(parsed(12, 100, 5, 640, 0, true));
  for (const char* section : {"pid 12", "ends (1)", "listeners (0)", "shared memory", "cuda: none", "workers (0)",
                              "fan-outs (0)", "shm_ring", "batches", "blocked"}) {
    EXPECT_NE(out.find(section), std::string::npos) << section << " missing from\n" << out;
  }
}

TEST(ToolMetrics, EscapesLabelValues) {
  EXPECT_EQ(escape_label_value("plain"), "plain");
  EXPECT_EQ(escape_label_value("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(metric_name_fragment("devices.0.bytes-used"), "devices_0_bytes_used");
}

TEST(ToolMetrics, FollowsTheTextExpositionFormat) {
  std::vector<Snapshot> snapshots{parse_snapshot(12, document(12, 10, 5, 640, 2500000000, true, R"("say \"hi\"\\\n")")),
                                  parsed(13, 10, 6, 700, 0, false)};
  std::string out = render_metrics(snapshots);
  EXPECT_NE(out.find("# TYPE ferry_end_messages_total counter\n"), std::string::npos) << out;
  EXPECT_NE(out.find("ferry_end_messages_total{pid=\"12\",end=\"3\",label=\"say \\\"hi\\\"\\\\\\n\","
                     "transport=\"shm_ring\",direction=\"send\"} 5\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("ferry_end_messages_total{pid=\"13\",end=\"3\",label=\"batches\",transport=\"shm_ring\","
                     "direction=\"send\"} 6\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("ferry_end_blocked_seconds_total{pid=\"12\",end=\"3\",label=\"say \\\"hi\\\"\\\\\\n\","
                     "transport=\"shm_ring\",direction=\"send\"} 2.500000000\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("ferry_shared_memory_bytes_in_use{pid=\"13\"} 1536\n"), std::string::npos) << out;
  // Every family once, HELP then TYPE then its samples; every sample well formed.
  std::regex help("# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) [^\n]+");
  std::regex type("# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge)");
  std::regex sample(R"(([a-zA-Z_:][a-zA-Z0-9_:]*)\{pid="\d+"(,[a-z_]+="([^"\\]|\\.)*")*\} [0-9.e+-]+)");
  std::istringstream lines(out);
  std::string line;
  std::vector<std::string> families;
  std::string current;
  std::smatch match;
  while (std::getline(lines, line)) {
    if (std::regex_match(line, match, help)) {
      current = match[1];
      EXPECT_EQ(std::count(families.begin(), families.end(), current), 0) << current << " appears twice";
      families.push_back(current);
      ASSERT_TRUE(std::getline(lines, line));
      ASSERT_TRUE(std::regex_match(line, match, type)) << line;
      EXPECT_EQ(match[1], current);
      EXPECT_EQ(match[2] == "counter", current.ends_with("_total")) << line;
      continue;
    }
    ASSERT_TRUE(std::regex_match(line, match, sample)) << line;
    EXPECT_EQ(match[1], current) << line;
  }
  EXPECT_GE(families.size(), 10u);
}

TEST(ToolTop, RatesFromTwoSnapshots) {
  // Two processes one second apart: pid 12 carried 100 messages (6400 bytes), blocked 0.25 s;
  // pid 13 carried nothing and is blocked now: stalled.
  std::vector<Snapshot> before{parsed(12, 1000000000, 100, 6400, 0, false), parsed(13, 1000000000, 7, 70, 0, true)};
  std::vector<Snapshot> after{parsed(12, 2000000000, 200, 12800, 250000000, false),
                              parsed(13, 2000000000, 7, 70, 1000000000, true)};
  std::vector<TopRow> rows = top_rows(before, after);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].pid, 13);  // stalled first
  EXPECT_TRUE(rows[0].stalled);
  EXPECT_DOUBLE_EQ(rows[0].blocked_percent, 100.0);
  EXPECT_EQ(rows[1].pid, 12);
  EXPECT_FALSE(rows[1].stalled);
  EXPECT_DOUBLE_EQ(rows[1].messages_per_second, 100.0);
  EXPECT_DOUBLE_EQ(rows[1].bytes_per_second, 6400.0);
  EXPECT_DOUBLE_EQ(rows[1].blocked_percent, 25.0);
  std::vector<TopRow> first = top_rows({}, after);
  EXPECT_FALSE(first[0].has_rates);
  EXPECT_FALSE(first[0].stalled);
  // A receive end blocked with nothing coming is waiting, not stalled.
  before[1].ends[0].direction = "recv";
  after[1].ends[0].direction = "recv";
  std::vector<TopRow> waiting = top_rows(before, after);
  EXPECT_EQ(waiting[1].pid, 13);
  EXPECT_FALSE(waiting[1].stalled);
  TopFrame frame = render_top_frame(waiting, TopSummary{"12:00:00", 2, 0, ""}, 200, 50);
  EXPECT_NE(frame.lines.back().find("waiting"), std::string::npos) << frame.lines.back();
  EXPECT_TRUE(frame.stalled_lines.empty());
}

TEST(ToolTop, BusiestFirst) {
  std::vector<Snapshot> before{parsed(12, 1000000000, 0, 0, 0, false), parsed(13, 1000000000, 0, 0, 0, false),
                               parsed(14, 1000000000, 0, 0, 0, false)};
  std::vector<Snapshot> after{parsed(12, 2000000000, 10, 10, 0, false), parsed(13, 2000000000, 5, 5000, 0, false),
                              parsed(14, 2000000000, 20, 100, 0, false)};
  std::vector<TopRow> rows = top_rows(before, after);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].pid, 13);
  EXPECT_EQ(rows[1].pid, 14);
  EXPECT_EQ(rows[2].pid, 12);
}

TEST(ToolTop, FrameFitsTheTerminal) {
  std::vector<Snapshot> before;
  std::vector<Snapshot> after;
  for (int pid = 100; pid < 140; ++pid) {
    before.push_back(parsed(pid, 1000000000, 0, 0, 0, false));
    bool stalled = pid == 120;  // blocked now, and no message in the interval
    after.push_back(parsed(pid, 2000000000, stalled ? 0 : static_cast<std::uint64_t>(pid), 1000, 0, stalled));
  }
  std::vector<TopRow> rows = top_rows(before, after);
  TopSummary summary{"12:00:00", after.size(), 0, ""};
  TopFrame frame = render_top_frame(rows, summary, 80, 20);
  EXPECT_LE(frame.lines.size(), 20u);
  for (const std::string& line : frame.lines) EXPECT_LE(display_width(line), 80u) << line;
  EXPECT_NE(frame.lines.back().find("more ends"), std::string::npos) << frame.lines.back();
  EXPECT_NE(frame.lines[0].find("1 STALLED"), std::string::npos) << frame.lines[0];
  ASSERT_EQ(frame.stalled_lines.size(), 1u);
  EXPECT_NE(frame.lines[frame.stalled_lines[0]].find("STALLED"), std::string::npos)
      << frame.lines[frame.stalled_lines[0]];
  EXPECT_NE(frame.lines[frame.header_line].find("BYTES/S"), std::string::npos);
  EXPECT_EQ(frame.lines[frame.header_line].find("PEER"), std::string::npos) << "the peer column goes first";
  EXPECT_NE(frame.lines[frame.header_line].find("MSG/S"), std::string::npos);
  TopFrame wide = render_top_frame(rows, summary, 200, 100);
  EXPECT_EQ(wide.lines.size(), 3u + rows.size());
  // A closed end that never carried a message is hidden, and counted in the header.
  rows[5].end.state = "closed";
  rows[5].end.messages = 0;
  rows[6].end.state = "closed";  // closed after carrying messages: still shown
  TopFrame hidden = render_top_frame(rows, summary, 300, 100);
  EXPECT_EQ(hidden.lines.size(), 2u + rows.size());
  EXPECT_NE(hidden.lines[0].find("1 unused closed ends hidden"), std::string::npos) << hidden.lines[0];
}

}  // namespace
}  // namespace ferry::cli
