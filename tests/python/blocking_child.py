"""A child process for blocking_test.py: sets up one blocking call of the ferry package,
prints "ready", enters the call and waits there until the parent's SIGINT (Ctrl-C).

Usage: blocking_child.py SCENARIO TRANSPORT ADDRESS
Prints, on stdout, one line "ready" before the call, then one line of JSON once the call
ended: {"outcome": "KeyboardInterrupt" | "returned" | "<exception type>", "at": <time.monotonic()
when it ended>, "entered": <time.monotonic() when the call began>}.
"""

import json
import os
import sys
import time

import ferry


def fill(tx):
    """Sends until the transport is full (send_for with no wait refuses), returns the count."""
    sent = 0
    while tx.send_for(b"x" * 4096, 0):
        sent += 1
    while tx.send_for(None, 0):  # the smallest message: leaves less room than any frame needs
        sent += 1
    return sent


def prepare(scenario, transport, address):
    """The blocking call of `scenario`, and what must stay alive while it waits."""
    if scenario == "recv":
        tx, rx = ferry._channel(transport)
        return rx.recv, (tx, rx)
    if scenario == "recv_for_none":
        tx, rx = ferry._channel(transport)
        return (lambda: rx.recv_for(None)), (tx, rx)
    if scenario == "iterate":
        tx, rx = ferry._channel(transport)
        return (lambda: next(iter(rx))), (tx, rx)
    if scenario == "send":
        tx, rx = ferry._channel(transport)
        fill(tx)
        return (lambda: tx.send(b"y" * 4096)), (tx, rx)
    if scenario == "send_for":
        tx, rx = ferry._channel(transport)
        fill(tx)
        return (lambda: tx.send_for(b"y" * 4096, 3600)), (tx, rx)
    if scenario == "close":
        tx, rx = ferry._channel(transport)
        fill(tx)
        return tx.close, (tx, rx)
    if scenario == "accept_sender":
        listener = ferry.listen(address, transport=transport)
        return listener.accept_sender, (listener,)
    if scenario == "accept_receiver":
        listener = ferry.listen(address, transport=transport)
        return (lambda: listener.accept_receiver(timeout=None)), (listener,)
    if scenario == "connect_sender":  # nobody listens: it retries until the deadline
        return (lambda: ferry.connect_sender(address, transport=transport)), ()
    if scenario == "connect_receiver":
        return (lambda: ferry.connect_receiver(address, timeout=None, transport=transport)), ()
    raise SystemExit(f"unknown scenario {scenario}")


def main():
    scenario, transport, address = sys.argv[1:4]
    call, keep = prepare(scenario, transport, address)  # noqa: F841 (kept alive during the call)
    print("ready", flush=True)
    entered = time.monotonic()
    try:
        call()
        outcome = "returned"
    except KeyboardInterrupt:
        outcome = "KeyboardInterrupt"
    except Exception as error:  # reported to the parent, which fails the test
        outcome = f"{type(error).__name__}: {error}"
    at = time.monotonic()
    print(json.dumps({"outcome": outcome, "at": at, "entered": entered}), flush=True)
    # Leave at once: closing a Sender whose receiver (in this process) never reads would
    # wait its close linger (10 s) for room.
    os._exit(0)


if __name__ == "__main__":
    main()
