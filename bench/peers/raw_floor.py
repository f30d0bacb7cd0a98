"""The raw floor of bench/peers/python_trainer.py: the cheapest Python way to receive the
trainer's message without its tensors. A producer writes the pickled dict (the step, the 64
file names, ten 256-byte strings in place of the small tensors, the send time) on a socket,
each behind its length; the trainer reads a length, then the body, and unpickles it."""
import pickle
import socket
import struct
import time


def produce_raw(sock, steps, pace):
    """Writes `steps` messages on `sock`, sleeping `pace` seconds before each, then a 0 length."""
    for step in range(steps):
        time.sleep(pace)
        body = pickle.dumps({"step": step, "images": None, "small": [bytes(256) for _ in range(10)],
                             "names": [f"train/{step}/{i}.jpg" for i in range(64)], "sent_ns": time.monotonic_ns()})
        sock.sendall(struct.pack("<Q", len(body)) + body)
    sock.sendall(struct.pack("<Q", 0))


def raw_batches(sock):
    """The messages read from `sock` until the 0 length."""
    while True:
        size = struct.unpack("<Q", sock.recv(8, socket.MSG_WAITALL))[0]
        if size == 0:
            return
        yield pickle.loads(sock.recv(size, socket.MSG_WAITALL))
