"""ferry.Selector, ferry.select, ferry.Distributor and ferry.Broadcast over real transports
and real worker processes."""

import os
import signal
import threading
import time
import unittest

import ferry



def produce(rank, out, count):
    for i in range(count):
        out.send({"rank": rank, "i": i})


def consume_all(rank, jobs, results):
    for job in jobs:
        results.send({"rank": rank, "job": job})


def take_one_then_die(rank, jobs, ready):
    ready.send(next(iter(jobs)))
    os.kill(os.getpid(), signal.SIGKILL)


class SelectTest(unittest.TestCase):
    def test_select_yields_every_message_with_its_index_until_every_stream_ends(self):
        pairs = [ferry.channel(t) for t in ("shm_ring", "unix_socket", "pipe")]
        group = ferry.spawn(produce, nprocs=3, join=False, args=(ferry.per_rank([tx for tx, _ in pairs]), 50))
        seen = {}
        for index, message in ferry.select([rx for _, rx in pairs]):
            self.assertEqual(message["rank"], index)
            seen.setdefault(index, []).append(message["i"])
        group.join()
        self.assertEqual(seen, {rank: list(range(50)) for rank in range(3)})

    def test_select_mixes_threads_and_duplex_ends(self):
        local_tx, local_rx = ferry.channel("in_process")
        mine, theirs = ferry.duplex("unix_socket")
        thread = threading.Thread(target=lambda: (local_tx.send("thread"), local_tx.close()))
        thread.start()
        theirs.send("duplex")
        theirs.close()
        self.assertEqual(sorted(ferry.select([local_rx, mine])), [(0, "thread"), (1, "duplex")])
        thread.join()

    def test_select_raises_peer_died_for_a_killed_sender(self):
        tx, rx = ferry.channel()
        jobs_tx, jobs_rx = ferry.channel()
        group = ferry.spawn(take_one_then_die, args=(jobs_rx, tx), join=False)
        jobs_tx.send("one")
        with self.assertRaises(ferry.PeerDied):
            for _ in ferry.select([rx]):
                pass
        with self.assertRaises(ferry.WorkerFailed):
            group.join(timeout=60)

    def test_select_timeout(self):
        tx, rx = ferry.channel()
        with self.assertRaises(TimeoutError):
            next(ferry.select([rx], timeout=0.05))

    def test_selector_methods(self):
        (tx0, rx0), (tx1, rx1) = ferry.channel(), ferry.channel()
        selector = ferry.Selector()
        self.assertEqual((selector.add(rx0), selector.add(rx1)), (0, 1))
        self.assertEqual(len(selector), 2)
        self.assertIsNone(selector.try_wait())
        self.assertIsNone(selector.wait_for(0.05))
        tx1.send("b")
        self.assertEqual(selector.wait(), 1)
        self.assertIs(selector.receiver(1), rx1)
        self.assertEqual(rx1.recv(), "b")
        selector.remove(1)
        self.assertNotIn(1, selector)
        self.assertIn(0, selector)
        tx0.close()
        self.assertEqual(selector.wait(timeout=10), 0)  # an ended stream stays ready
        selector.remove(0)
        with self.assertRaisesRegex(ferry.ChannelClosed, "Selector is empty"):
            selector.wait()

    def test_a_waiting_selector_lets_other_threads_run(self):
        tx, rx = ferry.channel()
        selector = ferry.Selector()
        selector.add(rx)
        threading.Timer(0.2, lambda: tx.send(1)).start()
        started = time.monotonic()
        self.assertEqual(selector.wait(timeout=10), 0)  # the timer thread needed the GIL
        self.assertLess(time.monotonic() - started, 5)


class DistributorTest(unittest.TestCase):
    def test_each_message_reaches_exactly_one_worker(self):
        jobs = [ferry.channel() for _ in range(3)]
        results_tx, results_rx = ferry.channel()
        # One results channel would be one end for three workers: each gets its own.
        backs = [ferry.channel() for _ in range(3)]
        del results_tx, results_rx
        group = ferry.spawn(consume_all, nprocs=3, join=False,
                            args=(ferry.per_rank([rx for _, rx in jobs]), ferry.per_rank([tx for tx, _ in backs])))
        pool = ferry.Distributor(max_in_flight=4)
        ids = [pool.add(tx) for tx, _ in jobs]
        self.assertEqual(len(set(ids)), 3)
        self.assertEqual(len(pool), 3)
        for job in range(300):
            pool.send(job)
        self.assertTrue(pool.send_for(300, timeout=30))
        stats = pool.stats()
        self.assertEqual(sum(s["sent"] for s in stats), 301)
        self.assertEqual({s["transport"] for s in stats}, {"shm_ring"})
        pool.close()
        received = sorted(message["job"] for _, message in ferry.select([rx for _, rx in backs]))
        self.assertEqual(received, list(range(301)))
        group.join()

    def test_add_takes_the_sender_over(self):
        tx, rx = ferry.channel()
        pool = ferry.Distributor()
        pool.add(tx, max_in_flight=1)
        self.assertFalse(tx.is_open)
        pool.send("x")
        self.assertEqual(rx.recv(), "x")

    def test_send_for_gives_up_when_every_consumer_is_full(self):
        tx, rx = ferry.channel()
        pool = ferry.Distributor(max_in_flight=1)
        pool.add(tx)
        pool.send("first")
        started = time.monotonic()
        self.assertFalse(pool.send_for("second", timeout=0.1))
        self.assertGreaterEqual(time.monotonic() - started, 0.09)
        self.assertEqual(rx.recv(), "first")
        self.assertTrue(pool.send_for("second", timeout=10))
        self.assertEqual(rx.recv(), "second")

    def test_no_consumer_is_channel_closed(self):
        with self.assertRaisesRegex(ferry.ChannelClosed, "no consumer"):
            ferry.Distributor().send(1)

    def test_a_killed_consumers_messages_come_back_from_take_undelivered(self):
        jobs_tx, jobs_rx = ferry.channel()
        ready_tx, ready_rx = ferry.channel()
        group = ferry.spawn(take_one_then_die, args=(jobs_rx, ready_tx), join=False)
        pool = ferry.Distributor(max_in_flight=8, liveness_check_interval=0.001)
        pool.add(jobs_tx)
        for job in range(5):
            pool.send({"job": job})
        self.assertEqual(ready_rx.recv(), {"job": 0})
        with self.assertRaises(ferry.WorkerFailed):
            group.join(timeout=60)
        deadline = time.monotonic() + 10
        undelivered = []
        while time.monotonic() < deadline and len(undelivered) < 4:
            undelivered += pool.take_undelivered()
            time.sleep(0.01)
        # The one it took may or may not have been counted as delivered before it died.
        self.assertIn([m["job"] for m in undelivered], ([1, 2, 3, 4], [0, 1, 2, 3, 4]))
        self.assertEqual(len(pool), 0)

    def test_close_ends_every_stream_and_later_sends_raise(self):
        pairs = [ferry.channel() for _ in range(2)]
        pool = ferry.Distributor()
        for tx, _ in pairs:
            pool.add(tx)
        pool.send("only")
        selector = ferry.Selector()
        for _, rx in pairs:
            selector.add(rx)
        # Read before closing: close() waits (close_linger) for the receiver to map what it
        # was sent, and here the receiver is this thread.
        self.assertEqual(selector.receiver(selector.wait(timeout=10)).recv(), "only")
        pool.close()
        self.assertFalse(pool.is_open)
        self.assertEqual(list(ferry.select([rx for _, rx in pairs], timeout=10)), [])
        with self.assertRaises(ferry.ChannelClosed):
            pool.send("late")

    def test_close_from_another_thread_keeps_take_undelivered(self):
        # A Unix socket carries the message's descriptors itself: closing does not wait for
        # this thread's receiver to map them (over a ring or pipe it would, up to close_linger).
        tx, rx = ferry.channel("unix_socket")
        pool = ferry.Distributor(max_in_flight=1)
        pool.add(tx)
        pool.send("one")
        closer = threading.Thread(target=pool.close)
        closer.start()
        closer.join(10)
        self.assertFalse(closer.is_alive())
        self.assertEqual(rx.recv(), "one")
        self.assertEqual(pool.take_undelivered(), [])


class BroadcastTest(unittest.TestCase):
    def test_every_consumer_gets_every_message_and_the_same_tensor_pages(self):
        pairs = [ferry.channel(t) for t in ("shm_ring", "unix_socket", "pipe")]
        fan = ferry.Broadcast(max_in_flight=4)
        for tx, _ in pairs:
            fan.add(tx)
        tensor = ferry.empty((4,), "float32")
        self.assertEqual(fan.send({"t": tensor, "n": 1}), 3)
        self.assertEqual(fan.send_for({"n": 2}, timeout=10), 3)
        for _, rx in pairs:
            first = rx.recv()
            self.assertEqual(first["n"], 1)
            self.assertEqual(first["t"].shape, (4,))
            self.assertEqual(rx.recv(), {"n": 2})
        self.assertEqual([s["sent"] for s in fan.stats()], [2, 2, 2])
        fan.close()
        for _, rx in pairs:
            with self.assertRaises(ferry.ChannelClosed):
                rx.recv_for(10)

    def test_a_full_consumer_misses_a_message_after_send_for(self):
        (tx0, rx0), (tx1, rx1) = ferry.channel(), ferry.channel()
        fan = ferry.Broadcast(max_in_flight=1)
        fan.add(tx0)
        fan.add(tx1)
        self.assertEqual(fan.send(1), 2)
        self.assertEqual(rx0.recv(), 1)  # consumer 1 does not read: it stays full
        self.assertEqual(fan.send_for(2, timeout=0.1), 1)
        self.assertEqual([s["skipped"] for s in fan.stats()], [0, 1])
        self.assertEqual(rx0.recv(), 2)
        self.assertEqual(rx1.recv(), 1)

    def test_with_block_closes(self):
        tx, rx = ferry.channel()
        with ferry.Broadcast() as fan:
            fan.add(tx)
            fan.send("x")
            self.assertEqual(rx.recv(), "x")  # before close(): see the Distributor's close test
        with self.assertRaises(ferry.ChannelClosed):
            rx.recv_for(10)


if __name__ == "__main__":
    unittest.main()
