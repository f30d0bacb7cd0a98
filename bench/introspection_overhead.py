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

Usage: bench/introspection_overhead.py [--rounds N] [--filter REGEX] [--min-time S]
                                       [--bench PATH] [--baseline PATH]
  --baseline  a ferry_bench built without introspection's per-message code (for example
              with the introspecting() branches of channels/src/ends/frame_channel.cpp
              taken out), run with introspection off as a third side: off / baseline
"""
import argparse
import json
import os
import re
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
RING_64 = "BM_RingRoundTripBytes/bytes:64/spinning:1"


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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--filter", default=DEFAULT_FILTER)
    parser.add_argument("--min-time", default="0.2")
    parser.add_argument("--bench", default=DEFAULT_BENCH)
    parser.add_argument("--baseline", default=None)
    args = parser.parse_args()
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
        goal = 1.02 if name == RING_64 else 1.01
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
