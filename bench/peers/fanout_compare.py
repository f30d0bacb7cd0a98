"""A queue shared by 4 consumers: torch.multiprocessing.Queue (torch_pool.py) against
ferry's Distributor (bench/fanout_bench.cpp, fanout/distributor/<transport>/4/<bound>),
interleaved in rounds, the same 1 MiB tensors (64 in turn, in shared memory), per-item
cost as medians over the rounds and the ratio torch / ferry.

Usage: /usr/bin/python3 bench/peers/fanout_compare.py [--rounds N] [--items N]
Needs build/release/bench/ferry_bench (cmake --build --preset release --target ferry_bench)
and Debian's python3-torch for /usr/bin/python3.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCH = [sys.executable, os.path.join(ROOT, "bench", "peers", "torch_pool.py")]
FERRY = os.path.join(ROOT, "build", "release", "bench", "ferry_bench")
CONSUMERS = 4
BYTES = 1 << 20


def torch_round(items):
    out = subprocess.run(TORCH + [str(items), str(CONSUMERS), str(BYTES)], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])[f"torch/pool/{CONSUMERS}/{BYTES}"]


def ferry_round():
    out = subprocess.run([FERRY, f"--benchmark_filter=fanout/distributor/.*/{CONSUMERS}/", "--benchmark_format=json",
                          "--benchmark_min_time=0.5"], check=True, capture_output=True, text=True).stdout
    rows = {}
    for bench in json.loads(out)["benchmarks"]:
        # fanout/distributor/<transport>/4/<bound>/real_time, nanoseconds per message
        parts = bench["name"].split("/")
        rows[f"ferry/{parts[2]}/bound {parts[4]}"] = bench["real_time"] / 1000.0
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--items", type=int, default=2000)
    args = parser.parse_args()
    if not os.path.exists(FERRY):
        raise SystemExit(f"{FERRY} is missing: cmake --build --preset release --target ferry_bench")
    samples = {}
    for _ in range(args.rounds):
        samples.setdefault("torch.multiprocessing.Queue", []).append(torch_round(args.items))
        for name, us in ferry_round().items():
            samples.setdefault(name, []).append(us)
    torch_us = statistics.median(samples["torch.multiprocessing.Queue"])
    print(f"{CONSUMERS} consumers, {BYTES >> 20} MiB tensors, median of {args.rounds} interleaved rounds")
    print(f"{'':34} {'us per item':>12} {'torch / this':>13}")
    for name, values in samples.items():
        us = statistics.median(values)
        print(f"{name:34} {us:12.2f} {torch_us / us:12.0f}x")


if __name__ == "__main__":
    main()
