#!/usr/bin/env python3
"""Introspection's cost: runs the latency table's round trips of ferry_bench with
FERRY_INTROSPECT=1 ("on") and without ("off"), and optionally a baseline ferry_bench without
introspection's per-message code, alternated over several rounds in one run (the order
rotates each round, so that a drift of the machine hits every side alike). Prints per row
the median over rounds of each side and the ratios on / off and off / baseline. Rows that
time single round trips are judged on their median single round trip (counter rtt_p50_ns),
which a peer preempted now and then on a shared machine does not inflate; the others on
real time.

Goals: with introspection on, the 64 B ring round trip at most 2% slower than off and every
other row at most 1%; off, nothing measurable against the baseline (while off, a send or
recv reads the on/off flag once and touches no counter). Run it on an idle machine: where
the load average exceeds the CPUs, the rows whose ends sleep (pipe, socket, a
futex-sleeping ring) vary between runs by more than these goals.

Timings on a shared machine move by more than 1-2% between runs; --instructions counts
instead, with callgrind (valgrind), the instructions per message of the latency table's
sends and receives, each in one thread without its waits (ferry_hot_path one-thread
TRANSPORT PAYLOAD), on and off: a count that load does not move. A pipe's or a socket's
count stops at the kernel, whose time the round trip pays on top, so its on / off bounds
the row's share from above.

--alternated times instead in one process, with blocks of messages alternated between on
and off (ferry_introspection_alternated): the ring's 64 B and 4 KiB round trips (an echo
thread) and its one-thread rows. Pairs of neighbouring blocks share the machine's drift,
which whole runs alternated do not; a process's own placement (its CPUs, its addresses)
still moves its ratio by about 1%, so each row is judged by the median over --runs
processes of each one's median ratio on / off.

Usage: bench/introspection_overhead.py [--rounds N] [--filter REGEX] [--min-time S]
                                       [--bench PATH] [--baseline PATH]
       bench/introspection_overhead.py --alternated [--runs N] [--pairs N] [--alternated-bench PATH]
       bench/introspection_overhead.py --instructions [--messages N] [--hot-path PATH]
                                       [--baseline PATH] [--rows LATENCY_JSON]
  --rows      with --instructions: for each ferry row of a latency table's results
              (docs/latency.json), what introspection adds to it: the counted instructions
              of its counterpart at the rate this machine runs the one-thread ring rows of
              the same results, plus two clock readings per blocking wait, as a share of
              the row's time; judged against the goals instead of the one-thread counts
  --baseline  a ferry_bench (with --instructions: a ferry_hot_path) built without introspection's per-message code (for example
              with the introspecting() branches of channels/src/ends/frame_channel.cpp
              taken out), run with introspection off as a third side: off / baseline
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_BENCH = os.path.join(ROOT, "build", "release", "bench", "ferry_bench")
# The latency table's ferry rows (scripts/latency-table): the ring's round trips, the
# transports' 64 B and tensor round trips.
DEFAULT_FILTER = (r"^(BM_RingRoundTripBytes/bytes:64/spinning:[01]|BM_RingRoundTripSharedTensor/bytes:4096/same_storage:1"
                  r"|roundtrip/ferry/(pipe|unix_socket|shm_ring)/(bytes/64|tensor_same/4096))(/|$)")

DEFAULT_ALTERNATED = os.path.join(ROOT, "build", "release", "bench", "ferry_introspection_alternated")
# ferry_introspection_alternated's rows, with the latency-table row each stands for and its goal.
ALTERNATED_ROWS = [(["round-trip", "64"], "BM_RingRoundTripBytes/bytes:64/spinning:1", 0.02),
                   (["round-trip", "4096"], "BM_RingRoundTripBytes/bytes:4096/spinning:1", 0.01),
                   (["one-thread", "ring", "64"], "BM_RingSendRecvOneThread/bytes:64", 0.01),
                   (["one-thread", "ring", "tensor"], "BM_RingSendRecvOneThreadSharedTensor/bytes:4096", 0.01)]
ALTERNATED_LINE = re.compile(r"on/off ([0-9.]+) \[([0-9.]+), ([0-9.]+)\]")

DEFAULT_HOT_PATH = os.path.join(ROOT, "build", "release", "bench", "ferry_hot_path")
# ferry_hot_path one-thread TRANSPORT PAYLOAD: the sends and receives of the table's rows
# (the ring's 64 B rows carry the 2% goal, every other row 1%).
ONE_THREAD_MODES = [("ring", "64"), ("ring", "4096"), ("ring", "65536"), ("ring", "1048576"), ("ring", "tensor"),
                    ("ring", "tensor-new"), ("in-process", "64"), ("in-process", "tensor"), ("pipe", "64"),
                    ("pipe", "tensor"), ("pipe", "tensor-new"), ("socket", "64"), ("socket", "tensor"),
                    ("socket", "tensor-new")]


def base_name(name):
    name = re.sub(r"(_median|_mean|_stddev|_cv)$", "", name)
    return re.sub(r"(/(iterations|repeats):\d+|/manual_time|/real_time)+$", "", name)


def figures(path):
    """Per row: its median single round trip (rtt_p50_ns) when reported, else real time, in ns."""
    with open(path) as results:
        benchmarks = json.load(results)["benchmarks"]
    out = {}
    for bench in benchmarks:
        aggregate = bench.get("aggregate_name")
        if aggregate is not None and aggregate != "median":
            continue
        scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}[bench.get("time_unit", "ns")]
        value = bench["rtt_p50_ns"] if "rtt_p50_ns" in bench else bench["real_time"] * scale
        name = base_name(bench["name"])
        if bench.get("aggregate_name") == "median" or name not in out:
            out[name] = value
    return out


def run_once(bench, filter_, min_time, introspect):
    """One run of `bench`; `introspect`: with FERRY_INTROSPECT=1."""
    environment = dict(os.environ)
    environment.pop("FERRY_INTROSPECT", None)
    if introspect:
        environment["FERRY_INTROSPECT"] = "1"
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [bench, f"--benchmark_filter={filter_}", f"--benchmark_min_time={min_time}",
                   "--benchmark_repetitions=3", "--benchmark_report_aggregates_only=true",
                   f"--benchmark_out={out.name}", "--benchmark_out_format=json"]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=environment)
        return figures(out.name)


def ratio_text(numerator, denominator, goal):
    """`numerator / denominator` against `goal` (None: no goal), and whether it is over."""
    ratio = numerator / denominator
    over = goal is not None and ratio > goal
    return f"{ratio:8.3f}{'  over' if over else ''}", over


def instructions_per_message(hot_path, transport, payload, messages, introspect):
    """Instructions per message sent and received, counted by callgrind between
    ferry_hot_path's start and stop of its measured loop."""
    environment = dict(os.environ)
    environment.pop("FERRY_INTROSPECT", None)
    if introspect:
        environment["FERRY_INTROSPECT"] = "1"
    with tempfile.TemporaryDirectory() as folder:
        # One dump per thread: only the main thread's is counted (out.1-01), not the
        # introspection server's ticks, which fall into the measured loop or not.
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
                   f"--callgrind-out-file={folder}/out", hot_path, "one-thread", transport, payload, str(messages)]
        try:
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           env=environment, timeout=600)
        except subprocess.CalledProcessError as error:
            sys.exit(f"introspection_overhead: {' '.join(command)} failed:\n{error.stderr[-2000:]}")
        except subprocess.TimeoutExpired:
            sys.exit(f"introspection_overhead: {' '.join(command)} did not finish in 600 s")
        counted = 0
        for dump in glob.glob(f"{folder}/out.1-01"):  # the measured loop's dump, main thread
            with open(dump) as text:
                counted += sum(int(line.split()[1]) for line in text if line.startswith("totals:"))
        if counted == 0:
            sys.exit(f"introspection_overhead: callgrind counted nothing in {hot_path} (built without valgrind/callgrind.h?)")
        return counted / messages


# The latency table's ferry rows, each with its one-thread counterpart: (row pattern, transport,
# payload (a byte size: the counted size at or below it), messages per iteration, blocking
# waits per iteration whose two clock readings the one-thread count lacks). A pipe's
# reader polls, and a socket's reads the clock around its recvmsg, on every message: their
# one-thread counts hold their waits' clock readings already. A ring end that spins
# (ring_spin above zero, the stream's default too) reads no clock of its own; a sleeping
# one (spinning:0) and a Selector's wait do. A ring stream's iteration is a batch (4096
# messages up to 4 KiB, 64 above) and its acknowledgement.
ROW_COUNTERPARTS = [
    (r"^BM_RingRoundTripBytes/bytes:(?P<n>\d+)/spinning:1", "ring", "{n}", 2, 0),
    (r"^BM_RingRoundTripBytesDefaultSpin/bytes:(?P<n>\d+)", "ring", "{n}", 2, 0),
    (r"^BM_RingRoundTripBytes/bytes:(?P<n>\d+)/spinning:0", "ring", "{n}", 2, 2),
    (r"^BM_RingRoundTripViaSelector", "ring", "64", 2, 2),
    (r"^BM_RingRoundTripSharedTensor/bytes:\d+/same_storage:1", "ring", "tensor", 2, 0),
    (r"^BM_RingRoundTripSharedTensor/bytes:\d+/same_storage:0", "ring", "tensor-new", 2, 0),
    (r"^BM_RingSendRecvOneThread/bytes:(?P<n>\d+)", "ring", "{n}", 1, 0),
    (r"^BM_RingSendRecvOneThreadSharedTensor/", "ring", "tensor", 1, 0),
    (r"^BM_RingStreamBytes/bytes:(?P<n>\d{1,4})/spinning:\d", "ring", "{n}", 4097, 0),
    (r"^BM_RingStreamBytes/bytes:(?P<n>\d{5,})/spinning:\d", "ring", "{n}", 65, 0),
    (r"^BM_InProcessRoundTripBytes/", "in-process", "64", 2, 0),
    (r"^BM_UnixSocketRoundTripBytes/", "socket", "64", 2, 0),
    (r"^roundtrip/ferry/pipe/bytes/", "pipe", "64", 2, 0),
    (r"^roundtrip/ferry/pipe/tensor_same/", "pipe", "tensor", 2, 0),
    (r"^roundtrip/ferry/pipe/tensor_new/", "pipe", "tensor-new", 2, 0),
    (r"^roundtrip/ferry/unix_socket(_duplex)?/bytes/", "socket", "64", 2, 0),
    (r"^roundtrip/ferry/unix_socket(_duplex)?/tensor_same/", "socket", "tensor", 2, 0),
    (r"^roundtrip/ferry/unix_socket(_duplex)?/tensor_new/", "socket", "tensor-new", 2, 0),
]
# The 64 B ring round trip (the 2% goal): both ends spinning, or the default spin.
RING_64_ROWS = r"^BM_RingRoundTripBytes(/bytes:64/spinning:1|DefaultSpin/bytes:64)$"
# The rows that time a counted mode's own loop: they rate its instructions (ns per instruction).
RATING_ROWS = {("ring", "64"): "BM_RingSendRecvOneThread/bytes:64",
               ("ring", "tensor"): "BM_RingSendRecvOneThreadSharedTensor/bytes:4096"}


def counted_payload(transport, payload):
    """The counted mode for a row's payload: a tensor payload, or the largest counted size at or below it."""
    if payload.startswith("tensor"):
        return payload
    sizes = sorted(int(p) for t, p in ONE_THREAD_MODES if t == transport and not p.startswith("tensor"))
    return str(max([n for n in sizes if n <= int(payload)] or sizes[:1]))


def clock_read_ns(hot_path):
    output = subprocess.run([hot_path, "clock"], check=True, capture_output=True, text=True, timeout=60).stdout
    found = re.search(r"clock: ([0-9.]+) ns", output)
    if found is None:
        sys.exit(f"introspection_overhead: {hot_path} clock printed no reading: {output!r}")
    return float(found.group(1))


def row_estimates(counts, latency_json, hot_path):
    """Per latency-table row of `latency_json`: what introspection adds to its iteration,
    the counted instructions at the rate this machine runs ferry's one-thread send and
    receive (from the same results) plus two clock readings per blocking wait, as a share
    of the row's time (its median single round trip where reported)."""
    times = figures(latency_json)
    rates = {mode: times[row] / counts[mode][0] for mode, row in RATING_ROWS.items() if row in times}
    if not rates:
        sys.exit(f"introspection_overhead: {latency_json} has no BM_RingSendRecvOneThread rows to rate instructions by")
    slowest = max(rates.values())
    clock = clock_read_ns(hot_path)
    print(f"\nrows of {os.path.relpath(latency_json)}: ns per instruction "
          + ", ".join(f"{t} {p} {rate:.3f}" for (t, p), rate in rates.items())
          + f" (other modes: the slower, {slowest:.3f}); {clock:.1f} ns per clock reading")
    print(f"{'row':62} {'time (ns)':>11} {'added (ns)':>10} {'share':>7} {'goal':>5}")
    failed = False
    skipped = []
    for name in sorted(times):
        rule = next((r for r in ROW_COUNTERPARTS if re.match(r[0], name)), None)
        if rule is None or times[name] <= 0:
            ferry_row = not re.search(r"(^|/)(raw|BM_Raw)", name) and not name.startswith("Alloc")
            if ferry_row:
                why = ("no time: not run here" if rule else
                       "the ring alone, no channel end: nothing counted" if name.startswith("BM_RingFrame") else
                       "no one-thread counterpart")
                skipped.append(f"{name} ({why})")
            continue
        pattern, transport, payload, messages, waits = rule
        mode = (transport, counted_payload(transport, payload.format(**re.match(pattern, name).groupdict())))
        off, on = counts[mode]
        # A one-thread row is its mode's own loop: rated by its own time (its share is then
        # its instructions' on / off); another row at its mode's rate, or the slower one.
        per_instruction = times[name] / off if name.startswith("BM_RingSendRecvOneThread") else rates.get(mode, slowest)
        added = messages * (on - off) * per_instruction + waits * 2 * clock
        share = added / times[name]
        goal = 0.02 if re.match(RING_64_ROWS, name) else 0.01
        over = share > goal
        failed |= over
        print(f"{name:62} {times[name]:11.0f} {added:10.1f} {share:6.2%} {goal:5.0%}{'  over' if over else ''}")
    for row in skipped:
        print(f"not judged: {row}")
    return failed


def count_instructions(args):
    """--instructions: per one-thread mode, instructions per message off, on (and baseline)."""
    if shutil.which("valgrind") is None:
        sys.exit("introspection_overhead: --instructions needs valgrind (apt-get install valgrind)")
    for path in (args.hot_path, args.baseline):
        if path is not None and not os.path.exists(path):
            sys.exit(f"introspection_overhead: {path} is missing; build ferry_hot_path first")
    header = f"{'one-thread send + recv (instructions)':40} {'off':>8} {'on':>8} {'on-off':>7} {'on/off':>8}"
    if args.baseline:
        header += f" {'baseline':>8} {'off/base':>8}"
    print(header)
    counts = {}
    for transport, payload in ONE_THREAD_MODES:
        # A message of 64 KiB or more takes long under callgrind; fewer give the same count.
        large = payload.isdigit() and int(payload) >= 65536
        messages = max(1, args.messages // 10) if large else args.messages
        off = instructions_per_message(args.hot_path, transport, payload, messages, False)
        on = instructions_per_message(args.hot_path, transport, payload, messages, True)
        counts[(transport, payload)] = (off, on)
        on_off, _ = ratio_text(on, off, None)
        line = f"{transport + ' ' + payload:40} {off:8.0f} {on:8.0f} {on - off:7.0f} {on_off}"
        if args.baseline:
            base = instructions_per_message(args.baseline, transport, payload, messages, False)
            off_base, _ = ratio_text(off, base, None)
            line += f" {base:8.0f} {off_base}"
        print(line, flush=True)
    if args.rows is None:
        print("\n(no --rows: the goals are judged on a latency table's rows, whose time a pipe's or a socket's"
              " instructions are a small part of)")
        return 0
    return 1 if row_estimates(counts, args.rows, args.hot_path) else 0


def alternated(args):
    """--alternated: each row's on / off from blocks alternated in one process, over several
    processes (rows in turn, so that a drift of the machine hits every row alike)."""
    if not os.path.exists(args.alternated_bench):
        sys.exit(f"introspection_overhead: {args.alternated_bench} is missing; build ferry_introspection_alternated")
    ratios = {row: [] for _, row, _ in ALTERNATED_ROWS}
    for run in range(args.runs):
        for arguments, row, _ in ALTERNATED_ROWS:
            command = [args.alternated_bench, *arguments, str(args.pairs)]
            try:
                output = subprocess.run(command, check=True, capture_output=True, text=True, timeout=600).stdout
            except subprocess.CalledProcessError as error:
                sys.exit(f"introspection_overhead: {' '.join(command)} failed:\n{error.stderr[-2000:]}")
            except subprocess.TimeoutExpired:
                sys.exit(f"introspection_overhead: {' '.join(command)} did not finish in 600 s")
            match = ALTERNATED_LINE.search(output)
            if match is None:
                sys.exit(f"introspection_overhead: {' '.join(command)} printed no ratio: {output!r}")
            ratios[row].append(float(match.group(1)))
        print(f"run {run + 1}/{args.runs} done", file=sys.stderr)
    print(f"{'row':30} {'stands for':50} {'on/off':>7} {'runs from-to':>15} {'goal':>5}")
    failed = False
    for arguments, row, goal in ALTERNATED_ROWS:
        ratio = statistics.median(ratios[row])
        over = ratio > 1 + goal
        failed |= over
        print(f"{' '.join(arguments):30} {row:50} {ratio:7.4f} {min(ratios[row]):7.4f}-{max(ratios[row]):.4f}"
              f" {goal:5.0%}{'  over' if over else ''}")
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--filter", default=DEFAULT_FILTER)
    parser.add_argument("--min-time", default="0.2")
    parser.add_argument("--bench", default=DEFAULT_BENCH)
    parser.add_argument("--baseline", default=None)
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--hot-path", default=DEFAULT_HOT_PATH)
    parser.add_argument("--rows", default=None)
    parser.add_argument("--alternated", action="store_true")
    parser.add_argument("--pairs", type=int, default=100)  # even: as many of each order
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--alternated-bench", default=DEFAULT_ALTERNATED)
    args = parser.parse_args()
    if args.alternated:
        if args.pairs < 2 or args.pairs % 2 != 0 or args.runs < 1:
            parser.error("--pairs must be even, from 2, and --runs 1 or more")
        return alternated(args)
    if args.instructions:
        if args.messages <= 0:
            parser.error("--messages must be positive")
        return count_instructions(args)
    for path in (args.bench, args.baseline):
        if path is not None and not os.path.exists(path):
            sys.exit(f"introspection_overhead: {path} is missing; build ferry_bench first")
    # Each side: (binary, FERRY_INTROSPECT=1 or not).
    sides = {"off": (args.bench, False), "on": (args.bench, True)}
    if args.baseline:
        sides["baseline"] = (args.baseline, False)
    order = list(sides)
    samples = {side: {} for side in sides}
    for round_ in range(args.rounds):
        for side in order[round_ % len(order):] + order[:round_ % len(order)]:
            bench, introspect = sides[side]
            for name, value in run_once(bench, args.filter, args.min_time, introspect).items():
                samples[side].setdefault(name, []).append(value)
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    header = f"{'row (median ns over rounds)':62} {'off':>9} {'on':>9} {'on/off':>8} {'goal':>5}"
    if args.baseline:
        header += f" {'baseline':>9} {'off/base':>8}"
    print(header)
    failed = False
    for name in sorted(samples["off"]):
        if any(name not in samples[side] for side in sides):
            continue
        median = {side: statistics.median(samples[side][name]) for side in sides}
        goal = 1.02 if re.match(RING_64_ROWS, name) else 1.01
        on_off, over = ratio_text(median["on"], median["off"], goal)
        failed |= over
        line = f"{name:62} {median['off']:9.0f} {median['on']:9.0f} {on_off} {goal:5.2f}"
        if args.baseline:
            off_base, _ = ratio_text(median["off"], median["baseline"], None)
            line += f" {median['baseline']:9.0f} {off_base}"
        print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
