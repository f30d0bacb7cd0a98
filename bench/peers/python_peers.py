"""Python to Python: ferry against torch.multiprocessing, interleaved in one run.

Per-item transfer cost of one message from a producer process to a consumer process, in
lockstep (the consumer acknowledges each item over a plain pipe, outside the timed part):
from before the producer makes the item to the moment the consumer's receive returned it.
Cases:
  batch    a new [64, 3, 224, 224] float32 batch per step: ferry.empty (ferry's caching
           allocator) against torch's DataLoader way (a new storage made shared with
           _new_shared, then mp.Queue.put); neither side fills it
  dict64   a dict of 64 new small tensors (1024 float32 each) per step, made as above
  small    a 64-byte dict of scalars (pickled, 64 bytes), one per step
  small_stream  the same dicts, 100 per step sent back to back: the step's time / 100
  spawn    ferry.spawn of 4 workers to the last of their first messages, against
           torch.multiprocessing.spawn with an mp.SimpleQueue, same start method
The small cases' floor (a reference, not a contender) follows the transfer rounds: the same
dicts pickled and written on a plain pipe to a consumer blocked in os.read, which shows what
waking a sleeping Python process for a message costs this machine.
Each round runs every case for ferry, then for torch (the order alternates between rounds;
the spawn rounds come first, before any queue's feeder thread runs);
each round gives p50 and p99 per case and side, and the report gives the median over the
rounds and the ratio torch / ferry of those medians. The consumer does not call
torch.from_dlpack (ferry's consumer gets ferry.Tensor views; a view costs about 7 us each).

Usage: PYTHONPATH=build/release/python /usr/bin/python3 bench/peers/python_peers.py
       [--rounds 5] [--steps 50] [--cases batch,dict64,small,small_stream,spawn] [--start-methods fork,spawn]
"""
import argparse
import json
import os
import pickle
import statistics
import struct
import sys
import time

import torch
import torch.multiprocessing as mp

import ferry

BATCH_SHAPE = (64, 3, 224, 224)
SMALL_TENSORS = 64
SMALL_NUMEL = 1024
SMALL_MESSAGE = {"step": 123456, "loss": 0.125, "rank": 3, "ok": True}  # 64 bytes pickled
WARM_UP = 3


# ---- consumers: receive, stamp, acknowledge --------------------------------------------------
def _ack(fd):
    os.write(fd, struct.pack("d", time.perf_counter()))


def ferry_consumer(rank, rx, ack_fd):
    for message in rx:
        if message.get("more") is None:  # the last item of a step
            _ack(ack_fd)
        del message


def torch_consumer(queue, ack_fd):
    while True:
        message = queue.get()
        if message is None:
            break
        if message.get("more") is None:
            _ack(ack_fd)
        del message


def _wait_ack(fd):
    return struct.unpack("d", os.read(fd, 8))[0]


# ---- producers: one item per step ---------------------------------------------------------
def ferry_item(case):
    if case == "batch":
        return {"images": ferry.empty(BATCH_SHAPE, "float32")}
    if case == "dict64":
        return {f"t{i}": ferry.empty((SMALL_NUMEL,), "float32") for i in range(SMALL_TENSORS)}
    return dict(SMALL_MESSAGE)


def torch_shared(numel):
    return torch.empty(0).new(torch.FloatStorage._new_shared(numel))  # as default_collate in a worker


def torch_item(case):
    if case == "batch":
        numel = 1
        for extent in BATCH_SHAPE:
            numel *= extent
        return {"images": torch_shared(numel).view(BATCH_SHAPE)}
    if case == "dict64":
        return {f"t{i}": torch_shared(SMALL_NUMEL) for i in range(SMALL_TENSORS)}
    return dict(SMALL_MESSAGE)


STREAM = 100  # items per step of the small_stream case


def items_per_step(case):
    return STREAM if case == "small_stream" else 1


def timed_steps(send, make, ack_read, steps, stream=1):
    """Per-item microseconds of each step: from before the first item of the step was made
    to the consumer's receipt of its last, divided by the step's items."""
    samples = []
    more = dict(SMALL_MESSAGE, more=True)
    for step in range(steps + WARM_UP):
        start = time.perf_counter()
        for _ in range(stream - 1):
            send(dict(more))
        send(make())
        received = _wait_ack(ack_read)
        if step >= WARM_UP:
            samples.append((received - start) * 1e6 / stream)
    return samples


class FerryPeer:
    def __init__(self):
        self.ack_read, ack_write = os.pipe()
        self.tx, rx = ferry.channel("shm_ring")
        self.group = ferry.spawn(ferry_consumer, args=(rx, ack_write), join=False)
        os.close(ack_write)

    def run(self, case, steps):
        return timed_steps(self.tx.send, lambda: ferry_item(case), self.ack_read, steps, items_per_step(case))

    def close(self):
        self.tx.close()
        self.group.join(timeout=60)
        os.close(self.ack_read)


class TorchPeer:
    def __init__(self):
        self.ack_read, ack_write = os.pipe()
        context = mp.get_context("fork")
        self.queue = context.Queue()
        self.process = context.Process(target=torch_consumer, args=(self.queue, ack_write), daemon=True)
        self.process.start()
        os.close(ack_write)

    def run(self, case, steps):
        return timed_steps(self.queue.put, lambda: torch_item(case), self.ack_read, steps, items_per_step(case))

    def close(self):
        self.queue.put(None)
        self.process.join(timeout=60)
        os.close(self.ack_read)


class RawPipePeer:
    """The floor of the small cases (not a contender): the same 64-byte dict pickled and
    written on a plain pipe by the producer and read and unpickled by a consumer process
    blocked in os.read, the cheapest way a Python process wakes another for a message."""

    def __init__(self):
        self.ack_read, ack_write = os.pipe()
        data_read, self.data_write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.ack_read)
            os.close(self.data_write)
            raw_pipe_consumer(data_read, ack_write)
            os._exit(0)
        os.close(ack_write)
        os.close(data_read)

    def send(self, message):
        body = pickle.dumps(message)
        os.write(self.data_write, struct.pack("<I", len(body)) + body)

    def run(self, case, steps):
        return timed_steps(self.send, lambda: dict(SMALL_MESSAGE), self.ack_read, steps, items_per_step(case))

    def close(self):
        os.write(self.data_write, struct.pack("<I", 0))
        os.waitpid(self.pid, 0)
        os.close(self.data_write)
        os.close(self.ack_read)


def raw_pipe_consumer(data_read, ack_fd):
    with os.fdopen(data_read, "rb", buffering=1 << 16) as data:
        while True:
            size = struct.unpack("<I", data.read(4))[0]
            if size == 0:
                return
            message = pickle.loads(data.read(size))
            if message.get("more") is None:
                _ack(ack_fd)
            del message


# ---- spawn to first message -----------------------------------------------------------------
def ferry_first_message(rank, tx):
    tx.send(rank)


def torch_first_message(rank, queue):
    queue.put(rank)


def ferry_spawn_time(start_method):
    pairs = [ferry.channel("shm_ring") for _ in range(4)]
    start = time.perf_counter()
    group = ferry.spawn(ferry_first_message, nprocs=4, join=False, start_method=start_method,
                        args=(ferry.per_rank([tx for tx, _ in pairs]),))
    for _, rx in pairs:
        rx.recv()
    elapsed = (time.perf_counter() - start) * 1e6
    group.join(timeout=60)
    return elapsed


def torch_spawn_time(start_method):
    queue = mp.get_context(start_method).SimpleQueue()
    start = time.perf_counter()
    context = mp.start_processes(torch_first_message, args=(queue,), nprocs=4, join=False, start_method=start_method)
    for _ in range(4):
        queue.get()
    elapsed = (time.perf_counter() - start) * 1e6
    context.join(timeout=60)
    return elapsed


def percentile(samples, fraction):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--cases", default="batch,dict64,small,small_stream,spawn")
    parser.add_argument("--start-methods", default="fork,spawn")
    parser.add_argument("--spawns", type=int, default=3, help="spawns per round and start method")
    options = parser.parse_args()
    cases = options.cases.split(",")
    transfer_cases = [case for case in cases if case != "spawn"]
    rows = {}  # name -> list of per-round figures
    floors = {}  # small cases over a raw pipe: name -> list of per-round figures

    # Spawns first: the fork start method refuses while this process runs other threads,
    # and torch's queues run a feeder thread each.
    if "spawn" in cases:
        for round_index in range(options.rounds):
            sides = [("ferry", ferry_spawn_time), ("torch", torch_spawn_time)]
            for method in options.start_methods.split(","):
                for side, measure in sides[::-1] if round_index % 2 else sides:
                    times = [measure(method) for _ in range(options.spawns)]
                    rows.setdefault(f"spawn-{method}/{side}/median", []).append(statistics.median(times))
    if transfer_cases:
        ferry_peer = FerryPeer()
        torch_peer = TorchPeer()
        for round_index in range(options.rounds):
            order = [("ferry", ferry_peer), ("torch", torch_peer)]
            for case in transfer_cases:
                steps = options.steps * 20 if case == "small" else options.steps
                for side, peer in order[::-1] if round_index % 2 else order:
                    samples = peer.run(case, steps)
                    rows.setdefault(f"{case}/{side}/p50", []).append(percentile(samples, 0.5))
                    rows.setdefault(f"{case}/{side}/p99", []).append(percentile(samples, 0.99))
        ferry_peer.close()
        torch_peer.close()
        floor_cases = [case for case in transfer_cases if case in ("small", "small_stream")]
        if floor_cases:  # after torch's feeder threads: fork() here copies no other thread
            floor_peer = RawPipePeer()
            for _ in range(options.rounds):
                for case in floor_cases:
                    samples = floor_peer.run(case, options.steps * 20 if case == "small" else options.steps)
                    floors.setdefault(f"{case}/p50", []).append(percentile(samples, 0.5))
                    floors.setdefault(f"{case}/p99", []).append(percentile(samples, 0.99))
            floor_peer.close()

    report = {}
    print(f"{'case':<24}{'ferry us':>12}{'torch us':>12}{'torch/ferry':>13}   (medians over {options.rounds} rounds)")
    for name in sorted({key.rsplit("/", 2)[0] + "/" + key.rsplit("/", 1)[1] for key in rows}):
        case, stat = name.split("/")
        ferry_value = statistics.median(rows[f"{case}/ferry/{stat}"])
        torch_value = statistics.median(rows[f"{case}/torch/{stat}"])
        ratio = torch_value / ferry_value
        report[f"{case}/{stat}"] = {"ferry_us": ferry_value, "torch_us": torch_value, "torch_over_ferry": ratio,
                                    "ferry_rounds": rows[f"{case}/ferry/{stat}"],
                                    "torch_rounds": rows[f"{case}/torch/{stat}"]}
        print(f"{case + ' ' + stat:<24}{ferry_value:>12.1f}{torch_value:>12.1f}{ratio:>13.2f}")
    for name in sorted(floors):
        floor = statistics.median(floors[name])
        case, stat = name.split("/")
        torch_value = report[name]["torch_us"]
        print(f"floor: {case + ' ' + stat:<17}{floor:>12.1f} us over a raw pipe (pickle, os.write, os.read); "
              f"torch / floor {torch_value / floor:.2f}")
        report[name]["raw_pipe_us"] = floor
        report[name]["raw_pipe_rounds"] = floors[name]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
