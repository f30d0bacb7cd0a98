"""ferry.spawn with real worker processes over real transports: the README's four-worker
program on every transport and start method, per_rank, handing ends over, and every way
a worker can fail (WorkerFailed names rank, pid and cause)."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

try:
    import torch
except ImportError:  # this interpreter lacks it: every test here needs it
    raise unittest.SkipTest("needs torch (python3-torch on Debian)")

import ferry

TRANSPORTS = ("shm_ring", "unix_socket", "pipe")
START_METHODS = ("fork", "spawn")


# Workers are module-level functions: the spawn start method imports them by name.
def work(rank, jobs, results):
    for job in jobs:  # iteration ends at the end of the stream
        x = torch.from_dlpack(job["x"])
        results.send({"rank": rank, "sum": float(x.sum())})


def raise_value_error(rank):
    if rank == 1:
        raise ValueError(f"bad input in worker {rank}")
    time.sleep(30)


def exit_with_three(rank):
    sys.exit(3)


def kill_myself(rank, ready):
    ready.send(os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)


def echo_rank(rank, out, value):
    out.send({"rank": rank, "value": value})


def send_then_return(rank, out):
    out.send(rank)  # the end is closed cleanly when the function returns


def spawn_grandchild(rank, out, start_method):
    inner_tx, inner_rx = ferry.channel()
    ferry.spawn(send_then_return, args=(inner_tx,), start_method=start_method)
    out.send({"rank": rank, "grandchild": inner_rx.recv()})


def serve_duplex(rank, end):
    for request in end:
        end.send(request * 2)


def four_worker_program(transport, start_method):
    """The README's Python example, returning what the collector saw."""
    pairs = [ferry.channel(transport=transport) for _ in range(4)]
    backs = [ferry.channel(transport) for _ in range(4)]
    group = ferry.spawn(work, nprocs=4, join=False, start_method=start_method,
                        args=(ferry.per_rank([rx for _, rx in pairs]),
                              ferry.per_rank([tx for tx, _ in backs])))
    pool = ferry.Distributor(max_in_flight=2)
    for tx, _ in pairs:
        pool.add(tx)
    x = ferry.share(torch.randn(1024))
    for _ in range(100):
        pool.send({"x": x})
    pool.close()
    seen = [(index, message) for index, message in ferry.select([rx for _, rx in backs])]
    group.join()
    return float(x.sum()), seen


class FourWorkerProgramTest(unittest.TestCase):
    def test_every_transport_and_start_method_delivers_every_job_once(self):
        for transport in TRANSPORTS:
            for start_method in START_METHODS:
                with self.subTest(transport=transport, start_method=start_method):
                    expected, seen = four_worker_program(transport, start_method)
                    self.assertEqual(len(seen), 100)
                    for index, message in seen:
                        self.assertEqual(message["rank"], index)  # results come back on the rank's own channel
                        self.assertAlmostEqual(message["sum"], expected, places=3)
                    self.assertGreater(len({index for index, _ in seen}), 1)  # the pool spread the jobs


class WorkerFailedTest(unittest.TestCase):
    def test_a_worker_that_raises_names_rank_pid_type_and_traceback(self):
        for start_method in START_METHODS:
            with self.subTest(start_method=start_method):
                group = ferry.spawn(raise_value_error, nprocs=3, join=False, start_method=start_method)
                pids = group.pids
                with self.assertRaises(ferry.WorkerFailed) as caught:
                    group.join(timeout=60)
                failure = caught.exception
                self.assertIsInstance(failure, ferry.Error)
                self.assertEqual((failure.rank, failure.world_size, failure.cause), (1, 3, "exception"))
                self.assertEqual(failure.pid, pids[1])
                self.assertEqual(failure.exception_type, "ValueError")
                self.assertIn("Traceback (most recent call last)", failure.traceback)
                self.assertIn("raise_value_error", failure.traceback)
                self.assertIn("ValueError: bad input in worker 1", str(failure))
                self.assertIn(f"worker 1 of 3 (pid {pids[1]})", str(failure))
                self.assertEqual(failure.terminated_siblings, 2)  # the others were stopped
                self.assertEqual(group.running, 0)

    def test_a_worker_that_exits_non_zero(self):
        for start_method in START_METHODS:
            with self.subTest(start_method=start_method):
                with self.assertRaises(ferry.WorkerFailed) as caught:
                    ferry.spawn(exit_with_three, start_method=start_method)
                self.assertEqual((caught.exception.cause, caught.exception.exit_code), ("exit_code", 3))
                self.assertIsNone(caught.exception.signal)
                self.assertIn("exited with status 3", str(caught.exception))

    def test_a_sigkilled_worker(self):
        tx, rx = ferry.channel()
        group = ferry.spawn(kill_myself, args=(tx,), join=False)
        pid = rx.recv()
        with self.assertRaises(ferry.WorkerFailed) as caught:
            group.join(timeout=60)
        failure = caught.exception
        self.assertEqual((failure.cause, failure.signal, failure.pid), ("signal", signal.SIGKILL, pid))
        self.assertIn("was killed by SIGKILL", str(failure))
        with self.assertRaises(ferry.ChannelClosed):  # its end died with it
            rx.recv()

    def test_join_with_a_timeout_returns_false_while_workers_run(self):
        tx, rx = ferry.channel()
        group = ferry.spawn(serve_duplex, args=(ferry.Duplex(tx, rx),), join=False)
        started = time.monotonic()
        self.assertFalse(group.join(timeout=0.2))
        self.assertLess(time.monotonic() - started, 5)
        group.terminate()
        self.assertEqual(group.running, 0)


class HandoverTest(unittest.TestCase):
    def test_per_rank_gives_each_worker_its_element_and_shared_values_to_all(self):
        for start_method in START_METHODS:
            with self.subTest(start_method=start_method):
                pairs = [ferry.channel() for _ in range(3)]
                ferry.spawn(echo_rank, nprocs=3, start_method=start_method,
                            args=(ferry.per_rank([tx for tx, _ in pairs]), {"shared": [1, 2]}))
                for rank, (_, rx) in enumerate(pairs):
                    self.assertEqual(rx.recv(), {"rank": rank, "value": {"shared": [1, 2]}})
                    with self.assertRaises(ferry.ChannelClosed):  # the worker's end closed cleanly
                        rx.recv()

    def test_per_rank_of_the_wrong_length_and_shared_ends_are_refused_before_any_start(self):
        tx, rx = ferry.channel()
        with self.assertRaisesRegex(ferry.SpawnError, r"per_rank of 1 values, but nprocs is 2"):
            ferry.spawn(send_then_return, nprocs=2, args=(ferry.per_rank([tx]),))
        with self.assertRaisesRegex(ferry.SpawnError, r"ferry.per_rank\(\[\.\.\.\]\)"):
            ferry.spawn(send_then_return, nprocs=2, args=(tx,))
        with self.assertRaisesRegex(ferry.SpawnError, r"workers 0 and 1"):
            ferry.spawn(send_then_return, nprocs=2, args=(ferry.per_rank([tx, tx]),))
        local_tx, _ = ferry.channel("in_process")
        with self.assertRaisesRegex(ferry.SpawnError, r"in_process"):
            ferry.spawn(send_then_return, args=(local_tx,))
        tx.send(1)
        self.assertEqual(rx.recv(), 1)
        with self.assertRaisesRegex(ferry.SpawnError, r"already carried messages.*start_method='fork'"):
            ferry.spawn(send_then_return, args=(tx,), start_method="spawn")
        ferry.spawn(send_then_return, args=(tx,))  # fork hands over a used end
        self.assertEqual(rx.recv(), 0)

    def test_a_worker_spawns_workers_of_its_own(self):
        for start_method in START_METHODS:
            with self.subTest(start_method=start_method):
                tx, rx = ferry.channel()
                ferry.spawn(spawn_grandchild, args=(tx, start_method), start_method=start_method)
                self.assertEqual(rx.recv(), {"rank": 0, "grandchild": 0})

    def test_the_parent_lets_go_of_handed_ends(self):
        tx, rx = ferry.channel()
        ferry.spawn(send_then_return, args=(tx,))
        self.assertEqual(rx.recv(), 0)
        with self.assertRaises(ferry.ChannelClosed):  # not held open by the parent's copy
            rx.recv_for(10)

    def test_duplex_ends_are_handed_over(self):
        for start_method in START_METHODS:
            with self.subTest(start_method=start_method):
                mine, theirs = ferry.duplex("unix_socket")
                group = ferry.spawn(serve_duplex, args=(theirs,), join=False, start_method=start_method)
                self.assertEqual(mine.call(21), 42)
                self.assertEqual(mine.call_for(5, timeout=30), 10)
                mine.close()
                group.join(timeout=60)

    def test_forked_workers_drop_ends_they_were_not_given(self):
        kept_tx, kept_rx = ferry.channel()
        out_tx, out_rx = ferry.channel()
        ferry.spawn(send_then_return, args=(out_tx,))
        self.assertEqual(out_rx.recv(), 0)
        kept_tx.close()  # only the parent held the sender: the stream ends now
        with self.assertRaises(ferry.ChannelClosed):
            kept_rx.recv_for(10)


class WorkersNeverOutliveTheParentTest(unittest.TestCase):
    def test_workers_die_with_a_killed_parent(self):
        program = textwrap.dedent("""
            import os, sys, time
            import ferry

            def sleep(rank, out):
                out.send(os.getpid())
                time.sleep(60)

            if __name__ == "__main__":
                tx, rx = ferry.channel()
                group = ferry.spawn(sleep, args=(tx,), join=False, start_method=sys.argv[1])
                print(rx.recv(), flush=True)
                time.sleep(60)
        """)
        with tempfile.TemporaryDirectory() as folder:
            script = os.path.join(folder, "parent.py")  # a file: the spawn start method imports its functions
            with open(script, "w") as file:
                file.write(program)
            for start_method in START_METHODS:
                with self.subTest(start_method=start_method):
                    self._check_workers_die_with_parent(script, start_method)

    def _check_workers_die_with_parent(self, script, start_method):
        parent = subprocess.Popen([sys.executable, script, start_method], stdout=subprocess.PIPE, text=True)
        worker = int(parent.stdout.readline())
        parent.kill()
        parent.wait()
        parent.stdout.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(worker):
            time.sleep(0.02)
        self.assertFalse(_alive(worker), "the worker outlived its parent")


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


if __name__ == "__main__":
    unittest.main()
