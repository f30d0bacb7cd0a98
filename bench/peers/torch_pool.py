"""torch.multiprocessing side of the fan-out comparison (bench/fanout_bench.cpp's
fanout/distributor rows): one producer puts tensors on one torch.multiprocessing.Queue
that CONSUMERS processes share, each taking items until it gets None; every item is taken
once. The timed part runs from the first put until every consumer has taken its last item.

Usage: /usr/bin/python3 torch_pool.py [ITEMS] [CONSUMERS] [BYTES]
Prints one JSON object: {"torch/pool/<consumers>/<bytes>": microseconds per item}
The items are the same float32 tensor in shared memory (share_memory_() before the loop),
as fanout/distributor sends the same 64 tensors in turn, so neither copies bytes per item.
"""
import json
import sys
import time

import torch
import torch.multiprocessing as mp


def consume(queue, done):
    taken = 0
    while True:
        item = queue.get()
        if item is None:
            break
        del item
        taken += 1
    done.put(taken)


def main():
    items = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    consumers = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    nbytes = int(sys.argv[3]) if len(sys.argv) > 3 else 1 << 20
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    done = ctx.Queue()
    workers = [ctx.Process(target=consume, args=(queue, done)) for _ in range(consumers)]
    for worker in workers:
        worker.start()
    tensors = [torch.empty(nbytes // 4, dtype=torch.float32).share_memory_() for _ in range(64)]
    for i in range(64):  # warm up: every consumer has seen the storages' fds once
        queue.put(tensors[i])
    start = time.perf_counter()
    for i in range(items):
        queue.put(tensors[i % 64])
    for _ in range(consumers):
        queue.put(None)
    taken = sum(done.get() for _ in range(consumers))
    elapsed = time.perf_counter() - start
    for worker in workers:
        worker.join()
    if taken != items + 64:
        raise SystemExit(f"consumers took {taken} items of {items + 64}")
    print(json.dumps({f"torch/pool/{consumers}/{nbytes}": elapsed / items * 1e6}))


if __name__ == "__main__":
    main()
