// The terminal for `ferry top`. Contract: a ScreenSession puts the terminal in raw mode
// (no echo, no line buffering, Ctrl-C read as a key) and on the alternate screen with the
// cursor hidden; its destructor restores all of it, so every way out of `ferry top` (q,
// Ctrl-C, SIGTERM, SIGHUP, an exception) leaves the terminal as it found it. A SignalPipe
// turns the signals it watches into bytes on a pipe that poll() can wait on, and restores
// the previous handlers when destroyed.
#pragma once

#include <signal.h>

#include <termios.h>
#include <chrono>
#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "ferry/detail/unique_fd.hpp"

namespace ferry::cli {

struct TerminalSize {
  std::size_t columns = 0;
  std::size_t rows = 0;
};

/// The size of the terminal on `fd` (TIOCGWINSZ), or nothing when it is not a terminal.
std::optional<TerminalSize> terminal_size(int fd);

class SignalPipe {
 public:
  explicit SignalPipe(std::initializer_list<int> signals);
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;
  int read_fd() const noexcept { return read_end_.get(); }
  /// The signals caught since the last call.
  std::vector<int> take();

 private:
  detail::UniqueFd read_end_;
  detail::UniqueFd write_end_;
  std::vector<std::pair<int, struct sigaction>> previous_;
};

class ScreenSession {
 public:
  /// Throws CliError when `input` or `output` is not a terminal.
  ScreenSession(int input, int output);
  ~ScreenSession();
  ScreenSession(const ScreenSession&) = delete;
  ScreenSession& operator=(const ScreenSession&) = delete;

  /// Replaces the screen with `lines`; those listed in `reverse` in reverse video, those
  /// in `alert` in bold red reverse video.
  void draw(const std::vector<std::string>& lines, const std::vector<std::size_t>& reverse,
            const std::vector<std::size_t>& alert);

 private:
  int input_;
  int output_;
  termios saved_{};
};

/// Writes all of `text` to `fd` (retrying short writes and EINTR); false on error.
bool write_all(int fd, const std::string& text);

}  // namespace ferry::cli
