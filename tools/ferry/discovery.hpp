// Discovery of processes with introspection on. Contract: such a process listens on the
// abstract Unix stream socket "\0ferry-introspect.<pid>", which /proc/net/unix lists as
// "@ferry-introspect.<pid>". Discovery only reads that table: it leaves nothing on disk and
// finds nothing of a process killed by SIGKILL (the kernel drops the socket with it). The
// pid in a name is a claim only: client.hpp checks it against the server's credentials.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

namespace ferry::cli {

/// The prefix of the abstract socket names (without the leading NUL or '@').
inline constexpr std::string_view introspection_name_prefix = "ferry-introspect.";

/// The abstract socket name (without the leading NUL) that process `pid` listens on.
std::string introspection_socket_name(pid_t pid);

/// The pids named by listening "@ferry-introspect.<pid>" stream sockets in `proc_net_unix`
/// (the text of /proc/net/unix), ascending, each once. Malformed lines and names are ignored.
std::vector<pid_t> parse_introspectable_pids(std::string_view proc_net_unix);

/// Reads /proc/net/unix and parses it; throws CliError when it cannot be read.
std::vector<pid_t> discover_introspectable_pids();

}  // namespace ferry::cli
