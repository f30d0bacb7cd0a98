#include "usage.hpp"

namespace ferry::cli {

std::string usage_text() {
  return R"(Usage: ferry [--timeout SECONDS] COMMAND [ARGS]

Shows the ferry processes of this user that run with introspection on (started with
FERRY_INTROSPECT=1, or calling ferry::enable_introspection() / ferry.enable_introspection()).

Commands:
  ps                   One line per process: pid, program, role (and rank), channel ends,
                       listeners, workers, shared memory in use and mapped.
  top                  Live view, refreshed every second: per channel end, messages/s,
                       bytes/s, messages in total and in flight, % of time blocked, state.
                       Stalled ends (send ends blocked now for room, no message in the
                       last interval: the consumer does not keep up) come first, marked
                       STALLED; then the busiest. Keys: q or Ctrl-C quits.
      --interval SECONDS   refresh period (default 1)
      --once               print one frame as text (rates over one interval) and exit
      -n N                 print N frames as text, one per interval, and exit
                           (without a terminal on stdout, top prints one frame and exits)
  show PID             Everything one process reports: its ends, listeners, shared memory,
                       CUDA, workers and fan-outs with their consumers.
      --json               the process's snapshot as received (JSON, schema version 1)
  metrics              Every process's counters in Prometheus' text exposition format,
                       each sample labelled pid="..." (ends also end, label, transport,
                       direction): for a node exporter's textfile collector or a scrape.
  help                 This text (also -h, --help).

Options:
  --timeout SECONDS    How long a process has to answer (default 2); a hung process is
                       reported, never waited for longer.

Only processes of your own user are shown (root sees all). A process that holds another
process's introspection socket name is reported and ignored. ps, top and metrics report
processes they cannot read on stderr and go on.

Exit codes:
  0  success
  1  failure (for example /proc/net/unix unreadable)
  2  bad command line (or `ferry top` without a terminal and without --once / -n)
  3  show: no such process, or introspection is off in it
  4  show: permission refused (the process belongs to another user)
  5  show: the process did not answer properly (timed out, sent garbage, or its socket
     name is held by another process)
)";
}

}  // namespace ferry::cli
