"""torch.multiprocessing side of bench/peers/compare: round trips parent -> child -> parent
of tensors through torch.multiprocessing queues, with one sharing strategy.

Usage: /usr/bin/python3 torch_roundtrip.py STRATEGY ITERATIONS_SCALE [PIN]
PIN (default 1): 1 pins the parent to the first allowed CPU and the child to the last, as
ferry_roundtrip does with the same argument; 0 leaves both to the scheduler.
Prints one JSON object: {"torch/<strategy>/<case>/<bytes>": [microseconds, ...], ...}

Cases (the tensor is float32; the timed part starts before the tensor is created, so
what torch must do to get a tensor into shared memory is counted):
  same        the same tensor sent again and again
  new         a new private tensor (torch.empty) each time: torch copies it into shared memory
  ten_small   a message (list) of the same 10 tensors of 4 KiB each
"""
import json
import os
import sys
import time

import torch
import torch.multiprocessing as mp

SIZES = [4096, 1 << 20, 64 << 20, 256 << 20]
# Untimed round trips before each case, as many as ferry_roundtrip.cpp does: the first warms
# up the connection; in the new-tensor cases ferry's caching allocator recycles blocks from
# the third on (torch has no such cache: the count changes nothing for it).
WARM_UP = 3


def pin_to(last):
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) >= 2:
        os.sched_setaffinity(0, {allowed[-1] if last else allowed[0]})


def echo(inbox, outbox, pin):
    if pin:
        pin_to(True)
    while True:
        item = inbox.get()
        if item is None:
            break
        outbox.put(item)
        del item


def iterations_for(size, scale):
    base = 200 if size <= (1 << 20) else (8 if size <= (64 << 20) else 4)
    return max(2, int(base * scale))


def main():
    strategy = sys.argv[1]
    scale = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    pin = (sys.argv[3] != "0") if len(sys.argv) > 3 else True
    mp.set_sharing_strategy(strategy)
    context = mp.get_context("fork")
    inbox, outbox = context.Queue(), context.Queue()
    child = context.Process(target=echo, args=(inbox, outbox, pin), daemon=True)
    child.start()
    if pin:
        pin_to(False)
    results = {}

    def measure(name, make, count):
        samples = []
        for _ in range(count + WARM_UP):
            start = time.perf_counter()
            message = make()
            inbox.put(message)
            back = outbox.get()
            samples.append((time.perf_counter() - start) * 1e6)
            del back, message
        results[name] = samples[WARM_UP:]

    for size in SIZES:
        count = iterations_for(size, scale)
        same = torch.zeros(size // 4, dtype=torch.float32)
        same.share_memory_()
        measure(f"torch/{strategy}/same/{size}", lambda: same, count)
        measure(f"torch/{strategy}/new/{size}", lambda: torch.empty(size // 4, dtype=torch.float32), count)
        del same
    small = [torch.zeros(1024, dtype=torch.float32) for _ in range(10)]
    for tensor in small:
        tensor.share_memory_()
    measure(f"torch/{strategy}/ten_small/40960", lambda: small, iterations_for(4096, scale))

    inbox.put(None)
    child.join(timeout=10)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
