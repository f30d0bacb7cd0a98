#!/usr/bin/env bash
# `ferry top` on a real terminal: a tmux pane of 120x30 running it next to two fake
# introspection servers (one busy, one stalled). Checks the live table (aligned, fitted to
# the width, the stalled end first and highlighted, rates), that a resize re-lays it out,
# and that q, Ctrl-C and SIGTERM each quit with status 0, leave the alternate screen and
# restore the terminal's settings exactly (stty -g before and after).
# With PIPELINE_BINARY (introspected_pipeline.cpp), also a real three-process pipeline whose
# sink stalls: its relay's send end must show as STALLED, first.
# Usage: top_in_tmux_test.sh FERRY_BINARY FAKE_SERVER_BINARY [PIPELINE_BINARY]   (exit 77: skipped)
set -euo pipefail
ferry=$1
fake=$2
pipeline=${3:-}
if ! command -v tmux >/dev/null; then
  echo "SKIPPED: tmux is not installed (scripts/install-deps installs it)"
  exit 77
fi

work=$(mktemp -d)
# Each tmux server gets a socket of its own: `kill-server` returns before the server has
# gone, and a new session on the same socket can reach the dying one ("server exited
# unexpectedly").
socket=
sockets=()
use_socket() {
  socket="ferry-top-test-$$-$1"
  sockets+=("$socket")
}
server_pids=()
cleanup() {
  for used in "${sockets[@]}"; do tmux -L "$used" kill-server 2>/dev/null || true; done
  for pid in "${server_pids[@]}"; do
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  exec 3>&-  # the pipeline's stdin: it exits when it closes
  [[ -n ${pipeline_pid:-} ]] && { kill -KILL "$pipeline_pid" 2>/dev/null || true; wait "$pipeline_pid" 2>/dev/null || true; }
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  echo "---- screen ----"
  tmux -L "$socket" capture-pane -p -t top 2>/dev/null || true
  exit 1
}

start_server() {  # start_server NAME ARGS...: starts a fake server, waits until it listens
  local name=$1
  shift
  "$fake" "$@" >"$work/$name.out" &
  server_pids+=($!)
  eval "${name}_pid=$!"
  for _ in $(seq 100); do
    grep -q ready "$work/$name.out" && return 0
    sleep 0.05
  done
  fail "the fake server $name did not start"
}
start_server busy serve --advance --label batches
start_server stalled serve --stalled --label stuck

# Waits (up to 10 s) until the pane shows a line matching the regex $1.
wait_for_screen() {
  for _ in $(seq 100); do
    tmux -L "$socket" capture-pane -p -t top | grep -qE "$1" && return 0
    sleep 0.1
  done
  fail "the screen never showed /$1/"
}
alternate_on() { tmux -L "$socket" display -p -t top '#{alternate_on}'; }
ferry_pid() { ps -o pid= --ppid "$(tmux -L "$socket" display -p -t top '#{pane_pid}')" | tr -d ' '; }

# run_top HOW: runs `ferry top` in a fresh pane, checks its screen, quits it HOW (q, C-c, TERM).
run_top() {
  local how=$1
  use_socket "$how"
  rm -f "$work/rc" "$work/before" "$work/after"
  cat >"$work/inner.sh" <<INNER
stty -g >"$work/before"
"$ferry" top --interval 0.5
echo \$? >"$work/rc"
stty -g >"$work/after"
echo "back at the shell"
sleep 60
INNER
  tmux -L "$socket" -f /dev/null new-session -d -s top -x 120 -y 30 "bash $work/inner.sh"
  wait_for_screen "^ferry top .* STALLED"
  wait_for_screen "^ *${stalled_pid} .*STALLED"
  [[ $(alternate_on) == 1 ]] || fail "ferry top is not on the alternate screen"
  local screen
  screen=$(tmux -L "$socket" capture-pane -p -t top)
  # The table: header, then the stalled end first, the busy end (with a rate) before idle ones.
  local header first
  header=$(grep -n "MSG/S" <<<"$screen" | head -1 | cut -d: -f1)
  [[ -n $header ]] || fail "no table header"
  first=$(sed -n "$((header + 1))p" <<<"$screen")
  [[ $first =~ ^\ *${stalled_pid}\ +fake_server\ +1\ +send\ +results\ .*STALLED$ ]] ||
    fail "the stalled end is not first: '$first'"
  grep -qE "^ *${busy_pid} +fake_server +0 +send +batches .* [0-9.]+k? +[0-9.]+ [KM]?i?B/s " <<<"$screen" ||
    fail "no rate for the busy end"
  local busy_line idle_line
  busy_line=$(grep -nE "^ *${busy_pid} +fake_server +0 " <<<"$screen" | cut -d: -f1)
  idle_line=$(grep -nE "^ *${busy_pid} +fake_server +1 " <<<"$screen" | cut -d: -f1)
  ((busy_line < idle_line)) || fail "the busy end is not above the idle one"
  # Columns aligned: the MSG/S header ends where each rate ends.
  local column
  column=$(awk -v h="$header" 'NR==h {print index($0, "MSG/S") + 4}' <<<"$screen")
  grep -E "^ *${busy_pid} " <<<"$screen" | while IFS= read -r line; do
    local cell=${line:column-1:1}
    [[ $cell != " " ]] || fail "MSG/S column not right-aligned in '$line'"
  done
  # The stalled line is highlighted (escape sequences in the pane's cells).
  tmux -L "$socket" capture-pane -e -p -t top | grep -E "STALLED" | tail -1 | grep -q $'\e\[' ||
    fail "the stalled line is not highlighted"
  if [[ $how == q ]]; then
    # A narrower terminal: the table is laid out again without the peer column.
    tmux -L "$socket" resize-window -t top -x 70 -y 30
    for _ in $(seq 50); do
      screen=$(tmux -L "$socket" capture-pane -p -t top)
      grep -q "MSG/S" <<<"$screen" && ! grep -q "PEER" <<<"$screen" && break
      sleep 0.1
    done
    grep -q "PEER" <<<"$screen" && fail "the table did not follow the resize"
    awk 'length($0) > 70 { exit 1 }' <<<"$screen" || fail "a line is wider than the terminal"
    tmux -L "$socket" send-keys -t top q
  elif [[ $how == C-c ]]; then
    tmux -L "$socket" send-keys -t top C-c
  else
    kill -TERM "$(ferry_pid)"
  fi
  for _ in $(seq 50); do
    [[ -s $work/after ]] && break
    sleep 0.1
  done
  [[ -s $work/after ]] || fail "ferry top did not exit on $how"
  [[ $(cat "$work/rc") == 0 ]] || fail "ferry top exited with $(cat "$work/rc") on $how"
  cmp -s "$work/before" "$work/after" || fail "terminal settings not restored after $how"
  wait_for_screen "back at the shell"
  [[ $(alternate_on) == 0 ]] || fail "still on the alternate screen after $how"
  tmux -L "$socket" kill-server
  echo "ok: ferry top quits on $how and restores the terminal"
}

run_top q
run_top C-c
run_top TERM

if [[ -n $pipeline ]]; then
  mkfifo "$work/pipeline.in"
  FERRY_INTROSPECT=1 "$pipeline" 50 --stall <"$work/pipeline.in" >"$work/pipeline.out" &
  pipeline_pid=$!
  exec 3>"$work/pipeline.in"
  for _ in $(seq 200); do
    grep -q ready "$work/pipeline.out" && break
    sleep 0.05
  done
  read -r _ source_pid relay_pid sink_pid <"$work/pipeline.out" || fail "the pipeline did not start"
  use_socket pipeline
  tmux -L "$socket" -f /dev/null new-session -d -s top -x 120 -y 30 "$ferry top --interval 0.5; sleep 60"
  wait_for_screen "^ *${relay_pid} .* send .*unix_socket.* STALLED"
  screen=$(tmux -L "$socket" capture-pane -p -t top)
  header=$(grep -n "MSG/S" <<<"$screen" | head -1 | cut -d: -f1)
  sed -n "$((header + 1))p" <<<"$screen" | grep -q STALLED || fail "the stalled relay is not first"
  for pid in "$source_pid" "$sink_pid"; do
    grep -qE "^ *$pid " <<<"$screen" || fail "pid $pid of the pipeline is not shown"
  done
  tmux -L "$socket" send-keys -t top q
  for _ in $(seq 50); do
    [[ $(alternate_on) == 0 ]] && break
    sleep 0.1
  done
  [[ $(alternate_on) == 0 ]] || fail "ferry top did not quit on q over the pipeline"
  tmux -L "$socket" kill-server
  echo "ok: ferry top shows the real pipeline's stalled relay first"
fi
