"""A C++ loader feeding a Python trainer, against torch's own ways of feeding one.

Every step a new image batch (float32 [64, 3, 224, 224], 36.75 MiB, filled anew), ten small
float32 tensors [64] and 64 file names reach the trainer, which views the images as a torch
tensor. Three feeders and a raw floor, interleaved in rounds in one run:
  ferry        ferry_python_loader (C++, listening) -> ferry.connect_receiver, a Unix
               socket (no copy)
  dataloader   torch.utils.data.DataLoader(num_workers=1, batch_size=None): the worker's
               batch is moved into shared memory (a copy) and passed through its queue
  mp_queue     a torch.multiprocessing producer process putting the same dict on a Queue
Each feeder runs three times per round. Paced (the producer waits --pace-ms before each batch, so
the trainer is idle when it comes): the transfer latency, from just before the producer
hands the filled batch over to the trainer holding a torch view of it (CLOCK_MONOTONIC),
and the trainer's CPU time per batch (time.process_time, every thread of the trainer), in
two parts: "get + release" is the feeder's own cost (waiting for the batch and being woken,
receiving it, making the dict of tensors, and dropping it again at the end of the step:
for ferry, recv, the conversion to a dict of ferry.Tensor and the release of its blocks);
"view" is torch.from_dlpack of the images, which only ferry needs (the torch feeders hand
over torch tensors) and which is the user's cost, not ferry's. Queued: the same "get +
release" for a busy trainer (it sleeps --step-ms after each batch, the producer runs
unpaced ahead of it), so the batch is waiting when asked for and no wake-up is counted.
Unpaced: batches per second, where filling 36.75 MiB per batch is part of every feeder's
cost.
The raw floor (not a feeder: it moves no image) is the cheapest Python way to receive the
rest of the message: a producer process writes the pickled dict (the step, the 64 names,
ten 256-byte strings for the small tensors, the send time) on a socket pair, and the
trainer reads it (one recv of a length, one of the body) and unpickles it. Its CPU columns
show what waking, one socket read and making 64 strings cost this machine's trainer.

Usage: PYTHONPATH=build/release/python /usr/bin/python3 bench/peers/python_trainer.py
       [--steps N] [--rounds R] [--pace-ms MS] [--step-ms MS]
       [--loader build/release/bench/ferry_python_loader]
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

import torch
import torch.multiprocessing as mp

import ferry
from raw_floor import produce_raw, raw_batches

SHAPE = (64, 3, 224, 224)


def make_batch(step):
    images = torch.empty(SHAPE, dtype=torch.float32).fill_(float(step))
    small = [torch.full((64,), float(i)) for i in range(10)]
    names = [f"train/{step}/{i}.jpg" for i in range(64)]
    return {"step": step, "images": images, "small": small, "names": names, "sent_ns": time.monotonic_ns()}


class Batches(torch.utils.data.Dataset):
    def __init__(self, steps, pace):
        self.steps = steps
        self.pace = pace

    def __len__(self):
        return self.steps

    def __getitem__(self, step):
        time.sleep(self.pace)
        return make_batch(step)


def produce(queue, steps, pace, done):
    for step in range(steps):
        time.sleep(pace)
        queue.put(make_batch(step))
    queue.put(None)
    done.wait()  # the consumer fetches each tensor's fd from this process: stay until it is done


def consume(batches, to_images, step=0.0, check_shape=True):
    """Per batch after the first two (warm-up): latency (us), CPU (us) of getting and releasing
    the batch, CPU (us) of viewing its images; and the wall seconds of the whole loop. `step`:
    seconds the trainer sleeps after each batch (its training step, costing no CPU here)."""
    latencies, feeder_cpu, view_cpu = [], [], []
    clock = time.process_time_ns
    wall_start = time.monotonic()
    iterator = iter(batches)
    index = 0
    while True:
        start = clock()
        try:
            batch = next(iterator)
        except StopIteration:
            break
        got = clock()
        images = to_images(batch["images"])
        arrived = time.monotonic_ns()
        viewed = clock()
        assert not check_shape or images.shape == SHAPE
        sent = batch["sent_ns"]
        released = clock()
        del batch, images
        end = clock()
        time.sleep(step)
        if index >= 2:
            latencies.append((arrived - sent) / 1000)
            feeder_cpu.append((got - start + end - released) / 1000)
            view_cpu.append((viewed - got) / 1000)
        index += 1
    return latencies, feeder_cpu, view_cpu, time.monotonic() - wall_start


def run_ferry(loader, steps, pace, step=0.0):
    address = f"unix:@ferry-python-bench-{os.getpid()}"
    child = subprocess.Popen([loader, address, str(steps), str(int(pace * 1000))])
    rx = ferry.connect_receiver(address)  # waits for the loader to listen
    result = consume(rx, torch.from_dlpack, step)
    if child.wait() != 0:
        raise RuntimeError("ferry_python_loader failed")
    return result


def run_dataloader(steps, pace, step=0.0):
    loader = torch.utils.data.DataLoader(Batches(steps, pace), batch_size=None, num_workers=1)
    return consume(loader, lambda images: images, step)


def run_mp_queue(steps, pace, step=0.0):
    context = mp.get_context("fork")
    queue = context.Queue(maxsize=2)
    done = context.Event()
    producer = context.Process(target=produce, args=(queue, steps, pace, done))
    producer.start()
    result = consume(iter(queue.get, None), lambda images: images, step)
    done.set()
    producer.join()
    return result


def run_raw_floor(steps, pace, step=0.0):
    ours, theirs = socket.socketpair()
    producer = mp.get_context("fork").Process(target=produce_raw, args=(theirs, steps, pace))
    producer.start()
    theirs.close()
    result = consume(raw_batches(ours), lambda images: images, step, check_shape=False)
    producer.join()
    ours.close()
    return result


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pace-ms", type=float, default=100.0)
    parser.add_argument("--step-ms", type=float, default=150.0, help="the busy trainer's step (queued CPU column)")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--loader", default=os.path.join(root, "build", "release", "bench", "ferry_python_loader"))
    args = parser.parse_args()
    cases = {"ferry": lambda pace, step=0.0: run_ferry(args.loader, args.steps, pace, step),
             "dataloader": lambda pace, step=0.0: run_dataloader(args.steps, pace, step),
             "mp_queue": lambda pace, step=0.0: run_mp_queue(args.steps, pace, step),
             "raw floor": lambda pace, step=0.0: run_raw_floor(args.steps, pace, step)}
    results = {name: {"latency": [], "cpu": [], "queued": [], "view": [], "wall": 0.0, "batches": 0} for name in cases}
    for _ in range(args.rounds):
        for name, run in cases.items():
            result = results[name]
            latencies, cpu, view, _ = run(args.pace_ms / 1000)
            result["latency"] += latencies
            result["cpu"] += cpu
            result["view"] += view
            _, _, _, wall = run(0.0)
            result["wall"] += wall
            # Busy trainer: the producer runs ahead while the trainer "trains" for a step, so
            # each batch is waiting when the trainer asks for it (no wake-up in the cost).
            _, queued, _, _ = run(0.0, args.step_ms / 1000)
            result["queued"] += queued
            result["batches"] += args.steps
    print(f"{args.rounds} rounds of {args.steps} batches, interleaved; torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs")
    print("trainer CPU per batch (us): get + release = waiting and waking, receiving, the dict of tensors, "
          "dropping it (p50, mean); queued = the same when the batch is already waiting (a busy trainer, p50); "
          "view = torch.from_dlpack (p50)")
    print(f"{'feeder':<12}{'p50 us':>10}{'p99 us':>10}{'batches/s':>11}{'get+release':>13}{'mean':>8}"
          f"{'queued':>8}{'view':>8}")
    for name, result in results.items():
        print(f"{name:<12}{statistics.median(result['latency']):>10.0f}{percentile(result['latency'], 0.99):>10.0f}"
              f"{result['batches'] / result['wall']:>11.1f}{statistics.median(result['cpu']):>13.0f}"
              f"{statistics.mean(result['cpu']):>8.0f}{statistics.median(result['queued']):>8.0f}"
              f"{statistics.median(result['view']):>8.0f}")
    ferry_p50 = statistics.median(results["ferry"]["latency"])
    best_torch = min(statistics.median(results[name]["latency"]) for name in ("dataloader", "mp_queue"))
    print(f"p50 transfer latency, best torch feeder / ferry: {best_torch / ferry_p50:.0f}x")
    ferry_cpu = statistics.median(results["ferry"]["cpu"])
    ferry_queued = statistics.median(results["ferry"]["queued"])
    print(f"ferry trainer CPU per batch (recv + dict of ferry.Tensor + release), p50: {ferry_cpu:.0f} us waiting, "
          f"{ferry_queued:.0f} us queued (goal < 50 us: {'met' if max(ferry_cpu, ferry_queued) < 50 else 'NOT met'}); "
          f"torch.from_dlpack adds {statistics.median(results['ferry']['view']):.0f} us")
    floor_cpu = statistics.median(results["raw floor"]["cpu"])
    floor_queued = statistics.median(results["raw floor"]["queued"])
    print(f"raw floor (socket read + unpickling the same dict without tensors), p50: {floor_cpu:.0f} us waiting, "
          f"{floor_queued:.0f} us queued; ferry / floor: {ferry_cpu / floor_cpu:.2f}x waiting, "
          f"{ferry_queued / floor_queued:.2f}x queued")


if __name__ == "__main__":
    sys.exit(main())
