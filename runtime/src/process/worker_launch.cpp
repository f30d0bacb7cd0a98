#include "process/worker_launch.hpp"

#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <csignal>

namespace ferry::detail {
namespace {

// Reads one integer field followed by ':' from `text`.
template <class Int>
bool take_field(std::string_view& text, Int& out) {
  const auto colon = text.find(':');
  if (colon == std::string_view::npos) return false;
  const auto* begin = text.data();
  const auto* end = text.data() + colon;
  const auto [ptr, error] = std::from_chars(begin, end, out);
  if (error != std::errc() || ptr != end) return false;
  text.remove_prefix(colon + 1);
  return true;
}

}  // namespace

std::string encode_spec(const ExecWorkerSpec& spec) {
  return "1:" + std::to_string(spec.parent) + ":" + std::to_string(spec.rank) + ":" + std::to_string(spec.world_size) +
         ":" + std::to_string(spec.report_fd) + ":" + std::to_string(spec.payload_fd) + ":" +
         std::to_string(spec.parent_death_signal) + ":" + spec.name;
}

std::optional<ExecWorkerSpec> decode_spec(std::string_view text) {
  ExecWorkerSpec spec;
  int version = 0;
  if (!take_field(text, version) || version != 1) return std::nullopt;
  if (!take_field(text, spec.parent) || !take_field(text, spec.rank) || !take_field(text, spec.world_size) ||
      !take_field(text, spec.report_fd) || !take_field(text, spec.payload_fd) ||
      !take_field(text, spec.parent_death_signal)) {
    return std::nullopt;
  }
  if (text.empty() || spec.rank < 0 || spec.world_size <= spec.rank || spec.report_fd < 0 || spec.payload_fd < 0) {
    return std::nullopt;
  }
  spec.name = std::string(text);
  return spec;
}

int bind_to_parent(pid_t parent, int signal) noexcept {
  if (::prctl(PR_SET_PDEATHSIG, signal, 0, 0, 0) != 0) return errno;
  // The parent may have died between fork() and prctl(): then nobody sends the signal.
  if (::getppid() != parent) return -1;
  return 0;
}

void unblock_all_signals() noexcept {
  sigset_t none;
  ::sigemptyset(&none);
  // NOLINTNEXTLINE(concurrency-mt-unsafe): runs in a forked child (one thread), where sigprocmask is async-signal-safe
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

}  // namespace ferry::detail
