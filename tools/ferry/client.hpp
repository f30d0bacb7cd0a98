// The client side of the introspection protocol. Contract: for each pid, connect to the
// abstract socket "\0ferry-introspect.<pid>", check with SO_PEERCRED that the listener is
// that very process (another process could have bound the name first) and belongs to this
// user (or that this is root), send "snapshot\n", and read the reply until the server
// closes. Every pid is asked at once and one deadline bounds them all: a hung process costs
// `timeout`, never more, and never hangs the tool. A reply is returned as received; it is
// not parsed here (snapshot.hpp does).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "cli_error.hpp"

namespace ferry::cli {

/// Why a process's reply could not be had.
struct FetchProblem {
  ExitCode code = ExitCode::failure;  ///< no_such_process, permission or bad_reply
  std::string message;                ///< a sentence naming the pid and what to do
};

/// What one pid answered: its reply, or the problem.
struct FetchResult {
  pid_t pid = 0;
  std::string reply;
  std::optional<FetchProblem> problem;
};

/// Replies larger than this are refused (a server cannot make the tool exhaust memory).
inline constexpr std::size_t max_reply_bytes = 64u << 20;

/// The default time a process has to answer.
inline constexpr std::chrono::milliseconds default_fetch_timeout{2000};

/// Asks every pid of `pids` for a snapshot, concurrently; results in the order of `pids`.
std::vector<FetchResult> fetch_snapshots(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout);

}  // namespace ferry::cli
