"""Ends and ferry.Tensor through multiprocessing (Process arguments, Queue, Pool) in the
fork, spawn and forkserver contexts, and one process per end after os.fork()."""

import faulthandler
import multiprocessing
import os
import pickle
import signal
import unittest
from multiprocessing.reduction import ForkingPickler

try:
    import numpy as np
except ImportError:  # the tests read tensors through NumPy
    raise unittest.SkipTest("this interpreter lacks numpy (python3-numpy)")

import ferry

CONTEXTS = ("fork", "spawn", "forkserver")
TRANSPORTS = ("pipe", "unix", "shm_ring")
REFUSED = 3  # a forked child's exit status when its use of an end was refused


# ---- what the children run (module level: the spawn context imports it) ---------------------

def echo_doubled(receiver, sender):
    for message in receiver:
        sender.send(message * 2)
    sender.close()


def consume_from_queue(queue, done):
    sender = queue.get()
    tensor = queue.get()
    array = np.asarray(tensor)
    total = float(array.sum())
    array[:] = 7  # seen by the parent: the same pages
    sender.send({"sum": total, "pid": os.getpid()})
    sender.close()
    done.put("done")


def sum_and_mark(tensor):
    array = np.asarray(tensor)
    total = float(array.sum())
    array[0] = -1
    return total


def send_once(sender, message):
    sender.send(message)
    sender.close()
    return os.getpid()


def new_tensor_of_threes(count):
    tensor = ferry.empty(count, "float32")
    np.asarray(tensor)[:] = 3
    return tensor


def in_child(body):
    """Forks; the child runs body() and exits 0, REFUSED on EndOwnedElsewhere, 1 otherwise."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            body()
            status = 0
        except ferry.EndOwnedElsewhere:
            status = REFUSED
        finally:
            os._exit(status)
    return pid


def exit_status(pid):
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


class WithWatchdog(unittest.TestCase):
    """A test that hangs fails (with every thread's traceback) instead of stalling ctest."""

    def setUp(self):
        faulthandler.dump_traceback_later(60, exit=True)

    def tearDown(self):
        faulthandler.cancel_dump_traceback_later()


class MultiprocessingTest(WithWatchdog):
    def test_ends_move_as_process_arguments(self):
        for method in CONTEXTS:
            with self.subTest(start_method=method):
                context = multiprocessing.get_context(method)
                to_child, child_in = ferry._channel("unix")
                child_out, from_child = ferry._channel("shm_ring")
                process = context.Process(target=echo_doubled, args=(child_in, child_out))
                process.start()
                for i in range(5):
                    to_child.send(i)
                to_child.close()
                self.assertEqual(list(from_child), [0, 2, 4, 6, 8])
                process.join(30)
                self.assertEqual(process.exitcode, 0)
                # The ends moved: this process's copies are refused.
                with self.assertRaises(ferry.EndOwnedElsewhere):
                    child_out.send(1)
                with self.assertRaises(ferry.EndOwnedElsewhere):
                    child_in.recv_for(0.1)

    def test_ends_and_tensors_travel_through_a_queue(self):
        for method in CONTEXTS:
            with self.subTest(start_method=method):
                context = multiprocessing.get_context(method)
                queue, done = context.Queue(), context.Queue()
                sender, receiver = ferry._channel("pipe")
                tensor = ferry.empty(16, "float32")
                np.asarray(tensor)[:] = 1
                process = context.Process(target=consume_from_queue, args=(queue, done))
                process.start()
                queue.put(sender)
                queue.put(tensor)
                report = receiver.recv_for(30)
                self.assertEqual(report["sum"], 16.0)
                self.assertEqual(done.get(timeout=30), "done")
                process.join(30)
                self.assertEqual(process.exitcode, 0)
                self.assertTrue((np.asarray(tensor) == 7).all())  # written by the child, no copy
                with self.assertRaises(ferry.EndOwnedElsewhere):
                    sender.send(1)

    def test_ends_and_tensors_travel_through_a_pool(self):
        for method in CONTEXTS:
            with self.subTest(start_method=method):
                context = multiprocessing.get_context(method)
                tensors = []
                for i in range(4):
                    tensor = ferry.empty(8, "float32")
                    np.asarray(tensor)[:] = i
                    tensors.append(tensor)
                with context.Pool(2) as pool:
                    self.assertEqual(pool.map(sum_and_mark, tensors), [0.0, 8.0, 16.0, 24.0])
                    sender, receiver = ferry._channel("unix")
                    worker = pool.apply(send_once, (sender, "hello"))
                    self.assertNotEqual(worker, os.getpid())
                    self.assertEqual(receiver.recv_for(30), "hello")
                    back = pool.apply(new_tensor_of_threes, (5,))
                for tensor in tensors:
                    self.assertEqual(np.asarray(tensor)[0], -1)  # the workers wrote the same pages
                self.assertIsInstance(back, ferry.Tensor)
                self.assertEqual(np.asarray(back).tolist(), [3.0] * 5)  # outlives the pool's workers

    def test_a_pickled_end_is_refused_where_it_was_and_works_where_it_lands(self):
        sender, receiver = ferry._channel("unix")
        pickled = ForkingPickler.dumps(sender)
        with self.assertRaises(ferry.EndOwnedElsewhere) as refused:
            sender.send(1)
        self.assertIn("pickled", str(refused.exception))
        landed = pickle.loads(pickled)
        landed.send(5)
        self.assertEqual(receiver.recv_for(10), 5)

    def test_a_used_end_is_not_pickled_and_stays_usable(self):
        sender, receiver = ferry._channel("unix")
        sender.send(1)
        with self.assertRaises(ferry.Error) as refused:
            ForkingPickler.dumps(sender)
        self.assertIn("fresh end", str(refused.exception))
        sender.send(2)
        self.assertEqual([receiver.recv(), receiver.recv()], [1, 2])

    def test_an_in_process_end_is_not_pickled(self):
        sender, _ = ferry._channel("in_process")
        with self.assertRaises(ferry.Error):
            ForkingPickler.dumps(sender)


class ForkTest(WithWatchdog):
    def test_two_forked_senders_on_one_end_one_is_refused_nothing_is_mixed(self):
        for transport in TRANSPORTS:
            with self.subTest(transport=transport):
                sender, receiver = ferry._channel(transport)

                def send_all(base):
                    for i in range(50):
                        sender.send(base + i)
                    sender.close()

                first = in_child(lambda: send_all(0))
                second = in_child(lambda: send_all(1000))
                got = list(receiver)
                statuses = sorted([exit_status(first), exit_status(second)])
                self.assertEqual(statuses, [0, REFUSED])
                self.assertEqual(len(got), 50)
                self.assertIn(got, [list(range(50)), list(range(1000, 1050))])

    def test_the_second_user_gets_a_message_naming_the_handovers(self):
        sender, receiver = ferry._channel("unix")
        sender.send(1)
        read, write = os.pipe()

        def report():
            try:
                sender.send(2)
            except ferry.EndOwnedElsewhere as error:
                os.write(write, f"{error.owner} {error.owner_alive}|{error}".encode())
                raise

        child = in_child(report)
        self.assertEqual(exit_status(child), REFUSED)
        os.close(write)
        owner, message = os.read(read, 4096).decode().split("|", 1)
        os.close(read)
        self.assertEqual(owner, f"{os.getpid()} True")
        for advice in ("multiprocessing.Process", "end.detach()", "end.adopt()"):
            self.assertIn(advice, message)
        sender.close()  # the child's copy did not end the stream
        self.assertEqual(list(receiver), [1])

    def test_detach_and_adopt_hand_an_end_over(self):
        sender, receiver = ferry._channel("shm_ring")
        sender.send(1)

        def take_over():
            sender.adopt()
            sender.send(2)
            sender.close()

        child = in_child(take_over)
        self.assertEqual(exit_status(child), 0)
        with self.assertRaises(ferry.EndOwnedElsewhere):
            sender.send(3)
        sender.detach()
        self.assertEqual(list(receiver), [1, 2])

    def test_a_killed_child_that_took_the_receiver_does_not_block_the_parents_sender(self):
        for transport in TRANSPORTS:
            with self.subTest(transport=transport):
                sender, receiver = ferry._channel(transport)
                read, write = os.pipe()

                def take_and_wait():
                    receiver.recv()
                    os.write(write, b"x")
                    signal.pause()

                child = in_child(take_and_wait)
                sender.send(0)
                self.assertEqual(os.read(read, 1), b"x")
                os.close(read)
                os.close(write)
                os.kill(child, signal.SIGKILL)
                self.assertEqual(exit_status(child), -signal.SIGKILL)
                with self.assertRaises(ferry.ChannelClosed):
                    while True:  # fills the transport, then learns that the reader died
                        sender.send(b"x" * 4096)

    def test_an_in_process_end_is_refused_in_a_forked_child(self):
        sender, receiver = ferry._channel("in_process")
        self.assertEqual(exit_status(in_child(lambda: sender.send(1))), REFUSED)
        sender.send(2)
        self.assertEqual(receiver.recv(), 2)


if __name__ == "__main__":
    unittest.main()
