"""What python_trainer.py's trainer executes per batch, counted by callgrind (a loaded
machine does not change the counts): ferry's receive (ferry_python_loader -> a ferry.Receiver,
the dict of ferry.Tensor, dropping it) against the raw floor (raw_floor.py: a socket read and
unpickling the same dict without tensors).

Each side's trainer runs twice under valgrind --tool=callgrind, receiving --few and --many
batches from an unpaced producer; per batch = (count(many) - count(few)) / (many - few), so
start-up and imports cancel. Every thread of the trainer is counted, the producer not.
--cache-sim adds callgrind's cache simulation (last level 32 MiB) with the trainer writing
64 MiB before each batch, as the loader's 36.75 MiB fill does in python_trainer.py: then the
last-level read misses per batch count the distinct cache lines of code and data a batch
reads from memory, which is what a cold trainer pays for beyond its instructions (the
flush, a ctypes.memset, adds the same few hundred instructions and lines of code to both
sides; its millions of instructions and written lines are left out).

Usage: PYTHONPATH=build/release/python /usr/bin/python3 bench/peers/trainer_instructions.py
       [--few 20] [--many 120] [--cache-sim] [--loader build/release/bench/ferry_python_loader]
"""
import argparse
import ctypes
import os
import socket
import subprocess
import sys
import tempfile

from raw_floor import produce_raw, raw_batches

FLUSH_BYTES = 64 << 20


def consume(batches, flush):
    """The trainer's loop of python_trainer.py, without torch: take each batch, read two of
    its entries, drop it."""
    scratch = (ctypes.c_char * FLUSH_BYTES)() if flush else None
    for batch in batches:
        images = batch["images"]
        sent = batch["sent_ns"]
        del batch, images, sent
        if flush:
            ctypes.memset(scratch, 1, FLUSH_BYTES)  # evicts the caches as the loader's fill does, reading nothing


def run_consumer(side, batches, flush, loader):
    if side == "ferry":
        import ferry
        address = f"unix:@ferry-trainer-instructions-{os.getpid()}"
        child = subprocess.Popen([loader, address, str(batches), "0"])
        consume(ferry.connect_receiver(address), flush)
        if child.wait() != 0:
            raise RuntimeError("ferry_python_loader failed")
        return
    ours, theirs = socket.socketpair()
    pid = os.fork()  # the producer: callgrind writes its counts to another file
    if pid == 0:
        ours.close()
        produce_raw(theirs, batches, 0.0)
        os._exit(0)
    theirs.close()
    consume(raw_batches(ours), flush)
    os.waitpid(pid, 0)


def counts(side, batches, cache_sim, loader, folder):
    """The trainer's event totals (callgrind's names -> counts)."""
    out = os.path.join(folder, f"{side}.{batches}")
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p"]
    if cache_sim:
        command += ["--cache-sim=yes", "--LL=33554432,16,64"]
    command += [sys.executable, os.path.abspath(__file__), "--consume", side, "--batches", str(batches), "--loader", loader]
    if cache_sim:
        command.append("--flush")
    trainer = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    if trainer.wait() != 0:
        raise RuntimeError(f"the {side} trainer under callgrind failed")
    names, totals = [], []
    with open(f"{out}.{trainer.pid}") as profile:
        for line in profile:
            if line.startswith("events:"):
                names = line.split()[1:]
            elif line.startswith("summary:"):
                totals = [int(value) for value in line.split()[1:]]
    return dict(zip(names, totals))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--few", type=int, default=20)
    parser.add_argument("--many", type=int, default=120)
    parser.add_argument("--cache-sim", action="store_true")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--loader", default=os.path.join(root, "build", "release", "bench", "ferry_python_loader"))
    parser.add_argument("--consume", choices=("ferry", "raw"), help=argparse.SUPPRESS)
    parser.add_argument("--batches", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--flush", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.consume:
        run_consumer(args.consume, args.batches, args.flush, args.loader)
        return 0
    per_batch = {}
    with tempfile.TemporaryDirectory() as folder:
        for side in ("ferry", "raw"):
            few = counts(side, args.few, args.cache_sim, args.loader, folder)
            many = counts(side, args.many, args.cache_sim, args.loader, folder)
            per_batch[side] = {name: (many[name] - few[name]) / (args.many - args.few) for name in many}
    rows = [("instructions", ["Ir"])]
    if args.cache_sim:
        rows = [("last-level misses, code", ["ILmr"]), ("last-level misses, data read", ["DLmr"]),
                 ("last-level misses, code + data read", ["ILmr", "DLmr"])]
    print(f"per batch, callgrind, {args.many} - {args.few} batches"
          f"{', caches flushed before each batch' if args.cache_sim else ''}")
    print(f"{'':<38}{'ferry':>10}{'raw floor':>11}{'ratio':>8}")
    for label, events in rows:
        ours = sum(per_batch["ferry"][event] for event in events)
        floor = sum(per_batch["raw"][event] for event in events)
        print(f"{label:<38}{ours:>10.0f}{floor:>11.0f}{ours / floor:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
