#include "ferry/detail/process_identity.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include "ferry/detail/unique_fd.hpp"
#include "ferry/error.hpp"

namespace ferry {

constinit std::atomic<std::uint64_t> detail::g_fork_generation{0};

namespace {

void count_fork_in_child() { detail::g_fork_generation.fetch_add(1, std::memory_order_relaxed); }

// Registered before main(), so that fork_generation() is a plain load (it runs for every
// block). Without the handler, forks would go unnoticed: failing to register (for lack of
// memory) ends the program rather than let it continue unsafely.
void register_fork_counter() noexcept {
  if (const int rc = ::pthread_atfork(nullptr, nullptr, &count_fork_in_child); rc != 0) std::terminate();
}

[[maybe_unused]] const bool g_fork_counter_made_at_start = (register_fork_counter(), true);

// State and start time from the text of /proc/<pid>/stat: "pid (comm) S ppid ... starttime ...".
// The command name may hold spaces and parentheses, so fields are counted after the last ')'.
struct StatFields {
  char state = '?';
  std::uint64_t start_time = 0;
};

std::optional<StatFields> parse_stat(std::string_view text) {
  const std::size_t close = text.rfind(')');
  if (close == std::string_view::npos || close + 2 >= text.size()) return std::nullopt;
  StatFields fields;
  fields.state = text[close + 2];
  // After ')' come fields 3 (state), 4, ...; starttime is field 22.
  std::size_t position = close + 2;
  for (int field = 3; field < 22; ++field) {
    position = text.find(' ', position);
    if (position == std::string_view::npos) return std::nullopt;
    ++position;
  }
  std::uint64_t value = 0;
  bool any = false;
  for (; position < text.size() && text[position] >= '0' && text[position] <= '9'; ++position) {
    value = value * 10 + static_cast<std::uint64_t>(text[position] - '0');
    any = true;
  }
  if (!any) return std::nullopt;
  fields.start_time = value;
  return fields;
}

// The fields of /proc/<pid>/stat, or nullopt when the process does not exist.
std::optional<StatFields> read_stat(std::int32_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  detail::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT || errno == ESRCH) return std::nullopt;
    throw_errno("open " + path);
  }
  std::array<char, 1024> buffer{};
  std::size_t filled = 0;
  while (filled < buffer.size()) {
    const ssize_t got = ::read(fd.get(), buffer.data() + filled, buffer.size() - filled);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == ESRCH) return std::nullopt;  // exited while we read
      throw_errno("read " + path);
    }
    if (got == 0) break;
    filled += static_cast<std::size_t>(got);
  }
  return parse_stat(std::string_view(buffer.data(), filled));
}

}  // namespace

detail::ProcessIdentity detail::current_process() {
  // Lock-free, so that a fork while another thread asks leaves nothing locked in the child.
  // Threads of one fork generation compute the same identity, so concurrent stores agree;
  // the generation is published last.
  static std::atomic<std::uint64_t> cached_generation{~std::uint64_t{0}};
  static std::atomic<std::int32_t> cached_pid{0};
  static std::atomic<std::uint64_t> cached_start_time{0};
  const std::uint64_t generation = detail::fork_generation();
  if (cached_generation.load(std::memory_order_acquire) == generation) {
    return detail::ProcessIdentity{cached_pid.load(std::memory_order_relaxed),
                                   cached_start_time.load(std::memory_order_relaxed)};
  }
  const std::int32_t pid = ::getpid();
  const auto fields = read_stat(pid);
  if (!fields)
    throw Error("cannot read /proc/self/stat; ferry needs /proc to track the processes holding shared memory");
  cached_pid.store(pid, std::memory_order_relaxed);
  cached_start_time.store(fields->start_time, std::memory_order_relaxed);
  cached_generation.store(generation, std::memory_order_release);
  return detail::ProcessIdentity{pid, fields->start_time};
}

std::optional<detail::ProcessIdentity> detail::identify_process(std::int32_t pid) {
  if (pid <= 0) return std::nullopt;
  const auto fields = read_stat(pid);
  if (!fields) return std::nullopt;
  return detail::ProcessIdentity{pid, fields->start_time};
}

bool detail::process_alive(const detail::ProcessIdentity& process) noexcept {
  if (process.pid <= 0) return false;
  // kill(pid, 0) tells whether the pid exists at all (EPERM: it does, another user's).
  if (::kill(process.pid, 0) != 0 && errno == ESRCH) return false;
  std::optional<StatFields> fields;
  try {
    fields = read_stat(process.pid);
  } catch (...) {
    return true;  // exists but cannot be inspected: never reclaim from a live process
  }
  // Gone between the two calls, or hidden from us (/proc mounted with hidepid): only the
  // first is a death, and a second kill() tells them apart.
  if (!fields) return !(::kill(process.pid, 0) != 0 && errno == ESRCH);
  if (fields->start_time != process.start_time) return false;  // the pid was reused
  return fields->state != 'Z' && fields->state != 'X';         // zombie or dead: its memory is gone
}

}  // namespace ferry
