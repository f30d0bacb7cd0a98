#include "top_command.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <limits>
#include <thread>

#include "cli_error.hpp"
#include "collect.hpp"
#include "terminal.hpp"
#include "top_model.hpp"

namespace ferry::cli {
namespace {

using Clock = std::chrono::steady_clock;

std::string wall_clock() {
  std::time_t now = std::time(nullptr);
  std::tm local{};
  char buffer[16] = "";
  if (::localtime_r(&now, &local) != nullptr) std::strftime(buffer, sizeof buffer, "%H:%M:%S", &local);
  return buffer;
}

// One refresh: the rows against the previous collection, which it then replaces.
TopFrame next_frame(Collection& previous, const TopOptions& options, TerminalSize size) {
  Collection current = collect_all(options.timeout);
  TopSummary summary{wall_clock(), current.snapshots.size(), current.problems.size(),
                     current.problems.empty() ? "" : current.problems.front().message};
  TopFrame frame = render_top_frame(top_rows(previous.snapshots, current.snapshots), summary, size.columns, size.rows);
  previous = std::move(current);
  return frame;
}

int run_batch(const TopOptions& options) {
  TerminalSize size{std::numeric_limits<std::size_t>::max(), std::numeric_limits<std::size_t>::max()};
  if (auto terminal = terminal_size(STDOUT_FILENO)) size.columns = terminal->columns;
  Collection previous = collect_all(options.timeout);
  int frames = options.frames.value_or(1);
  for (int i = 0; i < frames; ++i) {
    std::this_thread::sleep_for(options.interval);
    TopFrame frame = next_frame(previous, options, size);
    std::string text = i > 0 ? "\n" : "";
    for (const std::string& line : frame.lines) text += line + "\n";
    if (!write_all(STDOUT_FILENO, text)) return static_cast<int>(ExitCode::failure);
  }
  return 0;
}

enum class Event { refresh, redraw, quit };

// Waits up to `until` for a key or a signal.
Event wait_event(SignalPipe& signals, Clock::time_point until) {
  for (;;) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
    if (left.count() <= 0) return Event::refresh;
    pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {signals.read_fd(), POLLIN, 0}};
    int ready = ::poll(fds, 2, static_cast<int>(left.count()));
    if (ready < 0 && errno != EINTR) throw CliError(ExitCode::failure, "poll() on the terminal failed");
    if (fds[1].revents != 0) {
      bool resized = false;
      for (int signal : signals.take()) {
        if (signal != SIGWINCH) return Event::quit;
        resized = true;
      }
      if (resized) return Event::redraw;
    }
    if (fds[0].revents & (POLLHUP | POLLERR)) return Event::quit;
    if (fds[0].revents & POLLIN) {
      char keys[64];
      ssize_t got = ::read(STDIN_FILENO, keys, sizeof keys);
      if (got == 0) return Event::quit;
      for (ssize_t i = 0; i < got; ++i) {
        if (keys[i] == 'q' || keys[i] == 'Q' || keys[i] == 3 /* Ctrl-C */ || keys[i] == 4 /* Ctrl-D */)
          return Event::quit;
      }
    }
  }
}

int run_interactive(const TopOptions& options) {
  SignalPipe signals{SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH};
  ScreenSession screen(STDIN_FILENO, STDOUT_FILENO);
  Collection previous;
  TopFrame frame;
  auto draw = [&] { screen.draw(frame.lines, {frame.header_line}, frame.stalled_lines); };
  for (;;) {
    TerminalSize size = terminal_size(STDOUT_FILENO).value_or(TerminalSize{80, 24});
    frame = next_frame(previous, options, size);
    if (frame.header_line == 0) frame.header_line = std::numeric_limits<std::size_t>::max();  // no table
    draw();
    auto next = Clock::now() + options.interval;
    for (;;) {
      Event event = wait_event(signals, next);
      if (event == Event::quit) return 0;
      if (event == Event::refresh) break;
      // Resized: lay out the frame again on the next refresh, at once.
      next = Clock::now();
    }
  }
}

}  // namespace

int run_top(const TopOptions& given) {
  TopOptions options = given;
  // A hung process must not slow the refresh (nor q) beyond one interval.
  options.timeout = std::min(options.timeout, options.interval);
  if (options.frames || !::isatty(STDOUT_FILENO)) return run_batch(options);
  return run_interactive(options);
}

}  // namespace ferry::cli
