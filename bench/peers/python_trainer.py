"""A C++ loader feeding a Python trainer, against torch's own ways of feeding one.

Every step a new image batch (float32 [64, 3, 224, 224], 36.75 MiB, filled anew), ten small
float32 tensors [64] and 64 file names reach the trainer, which views the images as a torch
tensor. Three feeders, interleaved in rounds in one run:
  ferry        ferry_python_loader (C++, listening) -> ferry.connect_receiver, a Unix
               socket (no copy)
  dataloader   torch.utils.data.DataLoader(num_workers=1, batch_size=None): the worker's
               batch is moved into shared memory (a copy) and passed through its queue
  mp_queue     a torch.multiprocessing producer process putting the same dict on a Queue
Each feeder runs twice per round. Paced (the producer waits --pace-ms before each batch, so
the trainer is idle when it comes): the transfer latency, from just before the producer
hands the filled batch over to the trainer holding a torch view of it (CLOCK_MONOTONIC),
and the trainer's CPU time per batch (time.process_time over the loop, every thread of the
trainer, pacing waits included, which cost no CPU). Unpaced: batches per second, where
filling 36.75 MiB per batch is part of every feeder's cost.

Usage: PYTHONPATH=build/release/python /usr/bin/python3 bench/peers/python_trainer.py
       [--steps N] [--rounds R] [--loader build/release/bench/ferry_python_loader]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.multiprocessing as mp

import ferry

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


def consume(batches, to_images):
    """Latencies (us) of every batch after the first two (warm-up), CPU and wall seconds."""
    latencies = []
    cpu_start, wall_start = time.process_time(), time.monotonic()
    for index, batch in enumerate(batches):
        images = to_images(batch["images"])
        arrived = time.monotonic_ns()
        assert images.shape == SHAPE
        if index >= 2:
            latencies.append((arrived - batch["sent_ns"]) / 1000)
        del batch, images
    return latencies, time.process_time() - cpu_start, time.monotonic() - wall_start


def run_ferry(loader, steps, pace):
    address = f"unix:@ferry-python-bench-{os.getpid()}"
    child = subprocess.Popen([loader, address, str(steps), str(int(pace * 1000))])
    rx = ferry.connect_receiver(address)  # waits for the loader to listen
    result = consume(rx, torch.from_dlpack)
    if child.wait() != 0:
        raise RuntimeError("ferry_python_loader failed")
    return result


def run_dataloader(steps, pace):
    loader = torch.utils.data.DataLoader(Batches(steps, pace), batch_size=None, num_workers=1)
    return consume(loader, lambda images: images)


def run_mp_queue(steps, pace):
    context = mp.get_context("fork")
    queue = context.Queue(maxsize=2)
    done = context.Event()
    producer = context.Process(target=produce, args=(queue, steps, pace, done))
    producer.start()
    result = consume(iter(queue.get, None), lambda images: images)
    done.set()
    producer.join()
    return result


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pace-ms", type=float, default=100.0)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--loader", default=os.path.join(root, "build", "release", "bench", "ferry_python_loader"))
    args = parser.parse_args()
    cases = {"ferry": lambda pace: run_ferry(args.loader, args.steps, pace), "dataloader": lambda pace: run_dataloader(args.steps, pace),
             "mp_queue": lambda pace: run_mp_queue(args.steps, pace)}
    results = {name: {"latency": [], "cpu": 0.0, "wall": 0.0, "batches": 0} for name in cases}
    for _ in range(args.rounds):
        for name, run in cases.items():
            result = results[name]
            latencies, cpu, _ = run(args.pace_ms / 1000)
            result["latency"] += latencies
            result["cpu"] += cpu
            _, _, wall = run(0.0)
            result["wall"] += wall
            result["batches"] += args.steps
    print(f"{args.rounds} rounds of {args.steps} batches, interleaved; torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'feeder':<12}{'p50 us':>10}{'p99 us':>10}{'batches/s':>11}{'trainer CPU us/batch':>22}")
    for name, result in results.items():
        print(f"{name:<12}{statistics.median(result['latency']):>10.0f}{percentile(result['latency'], 0.99):>10.0f}"
              f"{result['batches'] / result['wall']:>11.1f}{1e6 * result['cpu'] / result['batches']:>22.0f}")
    ferry_p50 = statistics.median(results["ferry"]["latency"])
    best_torch = min(statistics.median(results[name]["latency"]) for name in ("dataloader", "mp_queue"))
    print(f"p50 transfer latency, best torch feeder / ferry: {best_torch / ferry_p50:.0f}x")


if __name__ == "__main__":
    sys.exit(main())
