#include "discovery.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#include "cli_error.hpp"

namespace ferry::cli {
namespace {

// /proc/net/unix's Flags column: __SO_ACCEPTCON, set on listening sockets (the accepted
// connections of a listener show its name too).
constexpr unsigned long listening_flag = 0x10000;
constexpr unsigned long stream_type = 1;  // SOCK_STREAM in the Type column

// The pid of "@ferry-introspect.<digits>", or 0.
pid_t pid_of_name(std::string_view path) {
  if (path.empty() || path.front() != '@') return 0;
  path.remove_prefix(1);
  if (!path.starts_with(introspection_name_prefix)) return 0;
  path.remove_prefix(introspection_name_prefix.size());
  if (path.empty() || path.size() > 10 || path.front() == '0') return 0;
  long pid = 0;
  auto [end, error] = std::from_chars(path.data(), path.data() + path.size(), pid);
  if (error != std::errc() || end != path.data() + path.size() || pid <= 0 || pid > 0x7fffffff) return 0;
  return static_cast<pid_t>(pid);
}

// The pid a line of /proc/net/unix names, when it is a listening stream socket of ours; 0 otherwise.
// Line: "Num: RefCount Protocol Flags Type St Inode Path".
pid_t pid_of_line(const std::string& line) {
  std::istringstream fields(line);
  std::string num, refcount, protocol, flags, type, state, inode, path;
  if (!(fields >> num >> refcount >> protocol >> flags >> type >> state >> inode >> path)) return 0;
  std::string rest;
  if (fields >> rest) return 0;  // a name with spaces is not ours
  unsigned long flag_bits = 0;
  unsigned long type_value = 0;
  if (std::from_chars(flags.data(), flags.data() + flags.size(), flag_bits, 16).ec != std::errc()) return 0;
  if (std::from_chars(type.data(), type.data() + type.size(), type_value, 16).ec != std::errc()) return 0;
  if ((flag_bits & listening_flag) == 0 || type_value != stream_type) return 0;
  return pid_of_name(path);
}

}  // namespace

std::string introspection_socket_name(pid_t pid) {
  return std::string(introspection_name_prefix) + std::to_string(pid);
}

std::vector<pid_t> parse_introspectable_pids(std::string_view proc_net_unix) {
  std::vector<pid_t> pids;
  std::istringstream lines{std::string(proc_net_unix)};
  std::string line;
  while (std::getline(lines, line)) {
    if (pid_t pid = pid_of_line(line); pid > 0) pids.push_back(pid);
  }
  std::sort(pids.begin(), pids.end());
  pids.erase(std::unique(pids.begin(), pids.end()), pids.end());
  return pids;
}

std::vector<pid_t> discover_introspectable_pids() {
  std::ifstream file("/proc/net/unix");
  if (!file) {
    throw CliError(ExitCode::failure,
                   std::string("cannot read /proc/net/unix (") + std::strerror(errno) + "): is /proc mounted?");
  }
  std::ostringstream text;
  text << file.rdbuf();
  return parse_introspectable_pids(text.str());
}

}  // namespace ferry::cli
