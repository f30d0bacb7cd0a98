"""Runs torch.multiprocessing (both sharing strategies) and ferry (every transport) on the
same round trips, interleaved in rounds, and prints one table of medians and p99.

The round trip is parent -> child -> parent (the child sends the message back); the
timed part starts before the tensor is created, so what each system must do to get a
tensor into shared memory is counted. See torch_roundtrip.py and ferry_roundtrip.cpp.

By default every run pins its parent to the first CPU and its child to the last (torch and
ferry alike), as latency-sensitive pipelines do: left to the scheduler, two processes that
take turns may share one CPU, where no one can spin (on the development VM a ring round
trip then costs two futex wake-ups). --no-pin measures them unpinned.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCH = [sys.executable, os.path.join(ROOT, "bench", "peers", "torch_roundtrip.py")]
FERRY = os.path.join(ROOT, "build", "release", "bench", "ferry_roundtrip")
STRATEGIES = ["file_descriptor", "file_system"]
TRANSPORTS = ["pipe", "unix_socket", "shm_ring"]
# ferry case -> the torch case it answers
TORCH_CASE = {"same": "same", "new_shared": "new", "new_private": "new", "ten_small": "ten_small"}
LABEL = {
    "same": "same tensor again",
    "new": "new private tensor (torch copies it into shared memory)",
    "new_shared": "new tensor, allocated in shared memory from the start",
    "new_private": "new private tensor (ferry moves it into shared memory)",
    "ten_small": "10 tensors of 4 KiB in one message (same tensors)",
}


def human(n):
    n = int(n)
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def p99(samples):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def run_json(command):
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return None, done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
    return json.loads(done.stdout.strip().splitlines()[-1]), None


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=float, default=0.5, help="iterations per round, relative")
    parser.add_argument("--no-pin", action="store_true",
                        help="leave both processes of every run to the scheduler (default: the parent on the "
                             "first CPU, the child on the last, for torch and ferry alike)")
    args = parser.parse_args()

    samples, skipped = {}, {}
    for round_index in range(args.rounds):
        print(f"compare: round {round_index + 1} of {args.rounds}", file=sys.stderr)
        pin = "0" if args.no_pin else "1"
        runs = [("torch/" + s, TORCH + [s, str(args.scale), pin]) for s in STRATEGIES]
        runs += [("ferry/" + t, [FERRY, t, str(args.scale), pin]) for t in TRANSPORTS]
        # Interleave: torch, ferry, torch, ferry ... so both see the same machine state.
        order = [runs[0], runs[2], runs[1], runs[3]] + runs[4:]
        for label, command in order:
            if label in skipped:
                continue
            result, error = run_json(command)
            if result is None:
                skipped[label] = error
                print(f"compare: skipping {label}: {error}", file=sys.stderr)
                continue
            for name, values in result.items():
                samples.setdefault(name, []).extend(values)

    medians = {name: statistics.median(values) for name, values in samples.items()}
    print(f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}; "
          f"torch {torch_version()}; {args.rounds} interleaved rounds; "
          f"{'processes left to the scheduler' if args.no_pin else 'parent pinned to the first CPU, child to the last'}; "
          f"times in microseconds.\n")
    print("| case | size | system | median | p99 | best torch / this |")
    print("|---|---|---|---:|---:|---:|")
    cases = sorted({tuple(n.split("/")[2:]) for n in samples}, key=lambda c: (c[0] != "same", c[0], int(c[1])))
    goals = []
    for case, size in cases:
        system_rows = [n for n in samples if n.split("/")[2:] == [case, size]]
        torch_case = TORCH_CASE.get(case, case)
        torch_best = min((medians[f"torch/{s}/{torch_case}/{size}"] for s in STRATEGIES
                          if f"torch/{s}/{torch_case}/{size}" in medians), default=None)
        for name in sorted(system_rows, key=lambda n: (not n.startswith("torch"), n)):
            ratio = "" if name.startswith("torch") or torch_best is None else f"{torch_best / medians[name]:.0f}x"
            system = name.split("/")[0] + " " + name.split("/")[1]
            print(f"| {LABEL.get(case, case)} | {human(size)} | {system} | {medians[name]:.1f} | "
                  f"{p99(samples[name]):.1f} | {ratio} |")
            if name.startswith("ferry") and torch_best is not None:
                goals.append((name, torch_best / medians[name]))
    print()
    # Issue 6's goals: a repeated tensor of any size over the ring; a new 64 MiB tensor and a
    # message of ten small tensors over ferry's best transport for the case.
    ratios = dict(goals)
    judged = [(f"same tensor again, {human(n.split('/')[3])}, shm_ring", n) for n in ratios
              if n.split("/")[2] == "same" and n.split("/")[1] == "shm_ring"]
    for case, size, label in (("new_shared", str(64 << 20), "new 64 MiB tensor"), ("ten_small", "40960", "ten small tensors")):
        rows = [n for n in ratios if n.split("/")[2:] == [case, size]]
        if rows:
            best = max(rows, key=lambda n: ratios[n])
            judged.append((f"{label}, best ferry transport ({best.split('/')[1]})", best))
    for label, name in sorted(judged, key=lambda j: j[1]):
        ratio = ratios[name]
        print(f"goal >= 100x faster than torch's best: {label}: {ratio:.0f}x {'met' if ratio >= 100 else 'NOT met'}")
    for label, error in skipped.items():
        print(f"not measured: {label} ({error})")


def torch_version():
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    return done.stdout.strip() or "?"


if __name__ == "__main__":
    main()
