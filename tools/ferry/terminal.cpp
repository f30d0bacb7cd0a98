#include "terminal.hpp"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cli_error.hpp"

namespace ferry::cli {
namespace {

volatile sig_atomic_t signal_write_fd = -1;

void on_signal(int signal) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(signal);
  if (signal_write_fd >= 0) {
    ssize_t ignored = ::write(signal_write_fd, &byte, 1);  // a full pipe already says "signalled"
    (void)ignored;
  }
  errno = saved;
}

constexpr const char* enter_screen = "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J";
constexpr const char* leave_screen = "\x1b[0m\x1b[?25h\x1b[?1049l";

}  // namespace

bool write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    ssize_t wrote = ::write(fd, text.data() + done, text.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) return false;
    done += static_cast<std::size_t>(wrote);
  }
  return true;
}

std::optional<TerminalSize> terminal_size(int fd) {
  winsize size{};
  if (::ioctl(fd, TIOCGWINSZ, &size) != 0 || size.ws_col == 0 || size.ws_row == 0) return std::nullopt;
  return TerminalSize{size.ws_col, size.ws_row};
}

SignalPipe::SignalPipe(std::initializer_list<int> signals) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw CliError(ExitCode::failure, std::string("pipe2() failed: ") + std::strerror(errno));
  }
  read_end_ = detail::UniqueFd(fds[0]);
  write_end_ = detail::UniqueFd(fds[1]);
  signal_write_fd = write_end_.get();
  for (int signal : signals) {
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    struct sigaction old {};
    if (::sigaction(signal, &action, &old) != 0) {
      throw CliError(ExitCode::failure, std::string("sigaction() failed: ") + std::strerror(errno));
    }
    previous_.emplace_back(signal, old);
  }
}

SignalPipe::~SignalPipe() {
  for (auto& [signal, old] : previous_) ::sigaction(signal, &old, nullptr);
  signal_write_fd = -1;
}

std::vector<int> SignalPipe::take() {
  std::vector<int> caught;
  unsigned char bytes[64];
  ssize_t got;
  while ((got = ::read(read_end_.get(), bytes, sizeof bytes)) > 0) caught.insert(caught.end(), bytes, bytes + got);
  return caught;
}

ScreenSession::ScreenSession(int input, int output) : input_(input), output_(output) {
  if (!::isatty(input) || !::isatty(output)) {
    throw CliError(ExitCode::usage,
                   "ferry top needs a terminal; in scripts use `ferry top --once` or `ferry top -n N`");
  }
  if (::tcgetattr(input, &saved_) != 0) {
    throw CliError(ExitCode::failure, std::string("tcgetattr() failed: ") + std::strerror(errno));
  }
  termios raw = saved_;
  raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO | ISIG | IEXTEN);
  raw.c_iflag &= ~static_cast<tcflag_t>(IXON | ICRNL);
  raw.c_cc[VMIN] = 0;
  raw.c_cc[VTIME] = 0;
  if (::tcsetattr(input, TCSAFLUSH, &raw) != 0) {
    throw CliError(ExitCode::failure, std::string("tcsetattr() failed: ") + std::strerror(errno));
  }
  write_all(output_, enter_screen);
}

ScreenSession::~ScreenSession() {
  write_all(output_, leave_screen);
  ::tcsetattr(input_, TCSAFLUSH, &saved_);
}

void ScreenSession::draw(const std::vector<std::string>& lines, const std::vector<std::size_t>& reverse,
                         const std::vector<std::size_t>& alert) {
  auto listed = [](const std::vector<std::size_t>& list, std::size_t i) {
    return std::find(list.begin(), list.end(), i) != list.end();
  };
  std::string screen = "\x1b[H";
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) screen += "\r\n";
    if (listed(alert, i)) {
      screen += "\x1b[1;31;7m" + lines[i] + "\x1b[K\x1b[0m";
    } else if (listed(reverse, i)) {
      screen += "\x1b[7m" + lines[i] + "\x1b[K\x1b[0m";
    } else {
      screen += lines[i] + "\x1b[K";
    }
  }
  screen += "\x1b[J";
  write_all(output_, screen);
}

}  // namespace ferry::cli
