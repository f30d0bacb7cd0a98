// `ferry`: shows running ferry processes (ps, top, show, metrics). See usage.cpp.
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "cli_error.hpp"
#include "collect.hpp"
#include "metrics_command.hpp"
#include "ps_command.hpp"
#include "show_command.hpp"
#include "top_command.hpp"
#include "usage.hpp"

namespace ferry::cli {
namespace {

[[noreturn]] void usage_error(const std::string& message) {
  throw CliError(ExitCode::usage, message + " (see `ferry --help`)");
}

std::chrono::milliseconds parse_seconds(const std::string& option, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  double seconds = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 || !std::isfinite(seconds) || seconds <= 0 ||
      seconds > 86400) {
    usage_error(option + " takes a number of seconds greater than 0, not '" + text + "'");
  }
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(seconds * 1000)));
}

long parse_positive(const std::string& what, const std::string& text, long maximum) {
  long value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value <= 0 || value > maximum) {
    usage_error(what + " must be a positive integer, not '" + text + "'");
  }
  return value;
}

// Reports each unreadable process on stderr.
void report_problems(const Collection& collection) {
  for (const FetchProblem& problem : collection.problems) std::cerr << "ferry: " << problem.message << "\n";
}

int run_ps(const std::vector<std::string>& args, std::chrono::milliseconds timeout) {
  if (!args.empty()) usage_error("ps takes no arguments");
  Collection collection = collect_all(timeout);
  std::cout << render_ps(collection.snapshots);
  report_problems(collection);
  if (collection.snapshots.empty() && collection.problems.empty()) {
    std::cerr << "ferry: no process has introspection on (start one with FERRY_INTROSPECT=1)\n";
  }
  return 0;
}

int run_metrics(const std::vector<std::string>& args, std::chrono::milliseconds timeout) {
  if (!args.empty()) usage_error("metrics takes no arguments");
  Collection collection = collect_all(timeout);
  std::cout << render_metrics(collection.snapshots);
  report_problems(collection);
  return 0;
}

int run_show(const std::vector<std::string>& args, std::chrono::milliseconds timeout) {
  bool json = false;
  std::optional<pid_t> pid;
  for (const std::string& arg : args) {
    if (arg == "--json") {
      json = true;
    } else if (!pid && !arg.starts_with("-")) {
      pid = static_cast<pid_t>(parse_positive("PID", arg, 0x7fffffff));
    } else {
      usage_error("show takes a PID and optionally --json, not '" + arg + "'");
    }
  }
  if (!pid) usage_error("show needs a PID (`ferry ps` lists them)");
  Collection collection = collect({*pid}, timeout);
  if (!collection.problems.empty()) {
    throw CliError(collection.problems.front().code, collection.problems.front().message);
  }
  const Snapshot& snapshot = collection.snapshots.front();
  if (json) {
    std::cout << snapshot.raw << (snapshot.raw.ends_with('\n') ? "" : "\n");
  } else {
    std::cout << render_show(snapshot);
  }
  return 0;
}

int run_top_command(const std::vector<std::string>& args, std::chrono::milliseconds timeout) {
  TopOptions options;
  options.timeout = timeout;
  for (std::size_t i = 0; i < args.size(); ++i) {
    auto value = [&](const std::string& option) {
      if (i + 1 >= args.size()) usage_error(option + " needs a value");
      return args[++i];
    };
    if (args[i] == "--once") {
      options.frames = 1;
    } else if (args[i] == "-n") {
      options.frames = static_cast<int>(parse_positive("-n", value("-n"), 1000000));
    } else if (args[i] == "--interval") {
      options.interval = parse_seconds("--interval", value("--interval"));
    } else {
      usage_error("top does not take '" + args[i] + "'");
    }
  }
  return run_top(options);
}

int run(std::vector<std::string> args) {
  std::chrono::milliseconds timeout = default_fetch_timeout;
  while (!args.empty() && args.front().starts_with("-")) {
    if (args.front() == "-h" || args.front() == "--help") {
      std::cout << usage_text();
      return 0;
    }
    if (args.front() != "--timeout" || args.size() < 2) usage_error("unknown option '" + args.front() + "'");
    timeout = parse_seconds("--timeout", args[1]);
    args.erase(args.begin(), args.begin() + 2);
  }
  if (args.empty()) usage_error("a command is needed: ps, top, show PID or metrics");
  std::string command = args.front();
  args.erase(args.begin());
  for (const std::string& arg : args) {
    if (arg == "-h" || arg == "--help") command = "help";
  }
  if (command == "help") {
    std::cout << usage_text();
    return 0;
  }
  if (command == "ps") return run_ps(args, timeout);
  if (command == "top") return run_top_command(args, timeout);
  if (command == "show") return run_show(args, timeout);
  if (command == "metrics") return run_metrics(args, timeout);
  usage_error("unknown command '" + command + "'");
}

}  // namespace
}  // namespace ferry::cli

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    int code = ferry::cli::run(std::move(args));
    std::cout.flush();
    return std::cout ? code : static_cast<int>(ferry::cli::ExitCode::failure);
  } catch (const ferry::cli::CliError& error) {
    std::cout.flush();
    std::cerr << "ferry: " << error.what() << "\n";
    return static_cast<int>(error.code());
  } catch (const std::exception& error) {
    std::cout.flush();
    std::cerr << "ferry: " << error.what() << "\n";
    return static_cast<int>(ferry::cli::ExitCode::failure);
  }
}
