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
    return prepare_fan(scenario, transport)


def sleep_for_ever(rank):
    """A worker that never finishes (it dies with this process: workers never outlive it)."""
    while True:
        time.sleep(60)


def full_fanout(kind, transport, window):
    """A Distributor or Broadcast whose one consumer is full: one message in flight (never
    received) with a window of 1; with a larger window (a Broadcast), its transport filled."""
    tx, rx = ferry.channel(transport)
    fan = kind(max_in_flight=window)
    fan.add(tx)
    if window == 1:
        fan.send(b"in flight")
    else:  # send_for with no wait: False (Distributor) or 0 reached (Broadcast) once full
        while fan.send_for(b"x" * 4096, 0):
            pass
        while fan.send_for(None, 0):
            pass
    return fan, rx


def prepare_fan(scenario, transport):
    """The scenarios of Selector, fan-outs, WorkerGroup.join and Duplex.call_for."""
    if scenario == "select_wait":
        tx, rx = ferry.channel(transport)
        selector = ferry.Selector()
        selector.add(rx)
        return selector.wait, (tx, rx, selector)
    if scenario == "select_iterate":
        tx, rx = ferry.channel(transport)
        return (lambda: next(ferry.select([rx]))), (tx, rx)
    if scenario == "broadcast_send_transport":
        fan, rx = full_fanout(ferry.Broadcast, transport, 1 << 20)
        return (lambda: fan.send(b"y" * 4096)), (fan, rx)
    for kind in (ferry.Distributor, ferry.Broadcast):
        name = kind.__name__.lower()
        if scenario == f"{name}_send":
            fan, rx = full_fanout(kind, transport, 1)
            return (lambda: fan.send(b"y" * 4096)), (fan, rx)
        if scenario == f"{name}_send_for":
            fan, rx = full_fanout(kind, transport, 1)
            return (lambda: fan.send_for(b"y" * 4096, 3600)), (fan, rx)
    if scenario == "join":
        group = ferry.spawn(sleep_for_ever, nprocs=2, join=False)
        return group.join, (group,)
    if scenario == "call_for_reply":  # the other end never replies
        a, b = ferry.duplex(transport)
        return (lambda: a.call_for("request", None)), (a, b)
    if scenario == "call_for_room":  # the other end never reads
        a, b = ferry.duplex(transport)
        fill(a.sender)
        return (lambda: a.call_for(b"y" * 4096, 3600)), (a, b)
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
