"""The ferry package on its own, in one process: conversions of every message type,
what is copied and what is not, errors, waiting without the GIL, iteration and `with`."""

import copy
import os
import threading
import time
import unittest

import numpy as np
import torch

import ferry

try:
    import _testcapi  # CPython's test hooks: makes allocations fail on demand
except ImportError:
    _testcapi = None


class Ends:
    """A connected pair over a Unix socket, closed at the end of the test."""

    def __init__(self, transport="unix"):
        self.tx, self.rx = ferry._channel(transport)

    def round_trip(self, message):
        self.tx.send(message)
        return self.rx.recv()


class MessagesTest(unittest.TestCase):
    def test_str_subclass_keys_of_one_text_are_refused_before_sending(self):
        class Key(str):
            def __eq__(self, other):
                return self is other

            def __hash__(self):
                return id(self)

        with self.assertRaises(ValueError):
            Ends().tx.send({Key("a"): 1, Key("a"): 2})
        self.assertEqual(Ends().round_trip({Key("a"): 1, "b": 2}), {"a": 1, "b": 2})

    def test_received_keys_are_reused_across_messages_and_never_mixed_up(self):
        ends = Ends("shm_ring")
        first = ends.round_trip({"step": 1, "loss": 0.5})
        second = ends.round_trip({"step": 2, "loss": 0.25})
        self.assertEqual(second, {"step": 2, "loss": 0.25})
        # The same key text arrives as the same str object (decoded and hashed once).
        self.assertEqual([id(key) for key in first], [id(key) for key in second])
        # Many keys (more than the cache holds, so slots are taken over), keys of one length
        # that differ in one byte, a prefix of another, non-ASCII keys and keys longer than
        # the cache keeps: every message arrives exactly as sent, twice over.
        keys = [f"k{i}" for i in range(2000)] + ["ab", "ac", "a", "abc", "schlüssel", "ключ", "x" * 47, "y" * 300]
        for _ in range(2):
            for start in range(0, len(keys), 250):
                message = {key: index for index, key in enumerate(keys[start:start + 250])}
                self.assertEqual(list(ends.round_trip(message).items()), list(message.items()))

    def test_every_value_kind_round_trips_and_dicts_keep_their_order(self):
        message = {"none": None, "yes": True, "no": False, "int": -(2**63), "big": 2**63 - 1, "float": 0.25,
                   "text": "résumé ✓", "bytes": b"\x00\xff", "array": bytearray(b"ab"), "list": [1, [2, [3]]],
                   "tuple": (1, "two"), "nested": {"z": 1, "a": {"deep": [None]}}}
        for transport in ("unix", "in_process"):  # decoded from a frame; converted from the Value handed over
            with self.subTest(transport=transport):
                received = Ends(transport).round_trip(message)
                self.assertEqual(list(received), list(message))
                expected = dict(message, array=b"ab", tuple=[1, "two"])
                self.assertEqual(received, expected)
                self.assertIs(type(received["yes"]), bool)
                self.assertIs(type(received["int"]), int)

    def test_every_transport_carries_messages(self):
        for transport in ("pipe", "unix", "shm_ring", "in_process"):
            with self.subTest(transport=transport):
                self.assertEqual(Ends(transport).round_trip({"k": [1.5, "x"]}), {"k": [1.5, "x"]})

    def test_what_value_cannot_hold_is_refused_before_sending(self):
        ends = Ends()
        with self.assertRaisesRegex(TypeError, "cannot send an object of type object"):
            ends.tx.send(object())
        with self.assertRaisesRegex(TypeError, "str keys"):
            ends.tx.send({1: "a"})
        with self.assertRaises(OverflowError):
            ends.tx.send(2**63)
        deep = None
        for _ in range(64):
            deep = [deep]
        with self.assertRaisesRegex(ValueError, "nested deeper than 64"):
            ends.tx.send(deep)
        cycle = []
        cycle.append(cycle)
        with self.assertRaisesRegex(ValueError, "contains itself"):
            ends.tx.send(cycle)
        ends.tx.send("still open")  # nothing of the refused messages went out
        self.assertEqual(ends.rx.recv(), "still open")


class TensorTest(unittest.TestCase):
    def test_tensors_are_made_by_ferry_only(self):
        tensor = ferry.empty((4,), "float32")
        for make in (lambda: type(tensor)(), lambda: copy.copy(tensor), lambda: copy.deepcopy(tensor)):
            with self.assertRaises(TypeError):
                make()

    def test_empty_is_shared_memory_that_torch_and_numpy_view_writably(self):
        tensor = ferry.empty((2, 3), torch.float32)
        self.assertTrue(tensor.is_shared)
        self.assertEqual((tensor.shape, tensor.strides, tensor.dtype), ((2, 3), (3, 1), "float32"))
        self.assertEqual(tensor.__dlpack_device__(), (1, 0))
        as_torch = torch.from_dlpack(tensor)
        as_numpy = np.asarray(tensor)
        self.assertTrue(as_numpy.flags.writeable)
        as_torch.fill_(1.0)
        as_numpy[1, 2] = 5.0
        self.assertEqual(as_torch[1, 2].item(), 5.0)
        self.assertEqual(as_torch.data_ptr(), tensor.data_ptr)
        self.assertEqual(ferry.empty(4, np.int16).dtype, "int16")
        self.assertEqual(ferry.empty([1], "bool").dtype, "bool")

    def test_a_torch_view_of_ferry_memory_is_sent_without_a_copy(self):
        ends = Ends()
        tensor = ferry.empty((4, 4), "int32")
        view = torch.from_dlpack(tensor)[1:, ::2]
        received = ends.round_trip({"view": view, "numpy": np.asarray(tensor).T})["view"]
        self.assertTrue(received.shares_storage_with(tensor))
        self.assertEqual(received.data_ptr, view.data_ptr())
        self.assertEqual((received.shape, received.strides, received.storage_offset), ((3, 2), (4, 2), 4))

    def test_other_tensors_are_copied_once_into_shared_memory(self):
        ends = Ends()
        source = torch.arange(20, dtype=torch.float64).reshape(4, 5)[:, 1:4]
        received = ends.round_trip(source)
        self.assertTrue(received.is_shared)
        self.assertNotEqual(received.data_ptr, source.data_ptr())
        self.assertTrue(torch.equal(torch.from_dlpack(received), source))
        array = np.arange(10, dtype=np.uint8)[::3]
        self.assertTrue(np.array_equal(np.asarray(ends.round_trip(array)), array))
        grad = torch.ones(3, requires_grad=True)
        self.assertTrue(torch.equal(torch.from_dlpack(ends.round_trip(grad)), torch.ones(3)))

    def test_every_dtype_travels_from_torch(self):
        ends = Ends()
        for dtype in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                      torch.bfloat16, torch.float32, torch.float64):
            with self.subTest(dtype=dtype):
                source = (torch.arange(6) % 2 if dtype == torch.bool else torch.arange(6)).to(dtype).reshape(2, 3).t()
                received = ends.round_trip(source)
                self.assertEqual("torch." + received.dtype, str(dtype))
                if dtype == torch.bool:
                    self.assertTrue(np.array_equal(np.asarray(received), source.numpy()))
                else:
                    self.assertTrue(torch.equal(torch.from_dlpack(received), source))

    def test_what_dlpack_and_numpy_cannot_say_is_refused_clearly(self):
        with self.assertRaisesRegex(ferry.Error, "DLPack 0.6 has no bool type"):
            torch.from_dlpack(ferry.empty(3, "bool"))
        with self.assertRaisesRegex(TypeError, "no bfloat16"):
            np.asarray(ferry.empty(3, "bfloat16"))
        with self.assertRaisesRegex(ValueError, "no dtype 'complex64'"):
            ferry.empty(3, "complex64")
        with self.assertRaisesRegex(ValueError, "negative stride"):
            Ends().tx.send(np.arange(4)[::-1])

    def test_the_storage_lives_while_a_torch_view_does(self):
        ends = Ends()
        source = ferry.empty(1000, "int64")
        torch.from_dlpack(source).fill_(3)
        ends.tx.send(source)
        received = ends.rx.recv()
        as_torch = torch.from_dlpack(received)
        del received, source
        ferry.empty(1000, "int64")  # would reuse a freed block of the same size
        self.assertTrue(bool((as_torch == 3).all()))


class EndsTest(unittest.TestCase):
    def test_iteration_stops_at_the_end_of_the_stream_and_recv_raises_channel_closed(self):
        ends = Ends()
        with ends.tx as tx:
            for step in range(3):
                tx.send({"step": step})
        self.assertEqual([message["step"] for message in ends.rx], [0, 1, 2])
        with self.assertRaises(StopIteration):  # and again, once ended
            next(ends.rx)
        with self.assertRaises(StopIteration):
            ends.rx.__next__()
        with self.assertRaisesRegex(ferry.ChannelClosed, "stream ended"):
            ends.rx.recv()
        with self.assertRaises(ferry.ChannelClosed):
            ends.tx.send(1)

    def test_recv_for_times_out(self):
        ends = Ends()
        start = time.monotonic()
        with self.assertRaises(TimeoutError):
            ends.rx.recv_for(0.05)
        self.assertGreaterEqual(time.monotonic() - start, 0.05)
        ends.tx.send(7)
        self.assertEqual(ends.rx.recv_for(1.0), 7)

    def test_closing_the_receiver_fails_the_senders_next_send(self):
        ends = Ends()
        with ends.rx:
            pass
        self.assertFalse(ends.rx.is_open)
        with self.assertRaises(ferry.ChannelClosed):
            ends.tx.send(1)

    def test_exception_classes_follow_the_cpp_hierarchy(self):
        self.assertTrue(issubclass(ferry.PeerDied, ferry.ChannelClosed))
        self.assertTrue(issubclass(ferry.TypeMismatch, ferry.ProtocolError))
        self.assertTrue(issubclass(ferry.ChannelClosed, ferry.Error))
        self.assertTrue(issubclass(ferry.ProtocolError, ferry.Error))

    @unittest.skipIf(_testcapi is None, "CPython's _testcapi (allocation failures on demand) is not installed")
    def test_python_out_of_memory_while_building_a_message_is_a_ferry_error_and_the_next_one_arrives(self):
        ends = Ends()
        message = {f"key {i}": f"value {i}" for i in range(2000)}
        receives = {"recv": ends.rx.recv, "next": lambda: next(ends.rx)}  # next(): the type's own tp_iternext
        for (how, receive), start in [(way, start) for way in receives.items() for start in (5, 500)]:
            with self.subTest(start=start, receive=how):
                ends.tx.send(message)
                failure = None
                _testcapi.set_nomemory(start, start + 1)  # nothing else between here and the receive
                try:
                    receive()
                except ferry.Error as error:
                    failure = error
                except MemoryError:  # the failed allocation was made outside the message's building
                    failure = "MemoryError outside ferry's builder"
                finally:
                    _testcapi.remove_mem_hooks()
                self.assertIsInstance(failure, ferry.Error, "the message was built although an allocation failed, "
                                                            "or the allocation that failed was not the builder's")
                self.assertIn("could not build a received message in Python: Python is out of memory", str(failure))
        ends.tx.send({"after": 1})
        self.assertEqual(ends.rx.recv(), {"after": 1})

    def test_another_thread_runs_while_one_waits_in_recv(self):
        ends = Ends()
        received = []
        # recv_for, not recv: were the GIL held while waiting, this thread would give up
        # after 5 s and the checks below would fail instead of hanging.
        waiter = threading.Thread(target=lambda: received.append(ends.rx.recv_for(5.0)))
        waiter.start()
        counted = 0
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:  # pure Python: runs only while this thread has the GIL
            counted += 1
        self.assertTrue(waiter.is_alive())
        self.assertGreater(counted, 10000, "the main thread barely ran while the other waited in recv")
        ends.tx.send("wake")
        waiter.join(5)
        self.assertEqual(received, ["wake"])


class EndpointsTest(unittest.TestCase):
    def address(self):
        return f"unix:@ferry-test-{os.getpid()}-{self.id()}"

    def test_listen_accept_and_connect_both_ways(self):
        address = self.address()
        with ferry.listen(address) as listener:
            self.assertEqual(listener.address, address)
            replies = []

            def client():
                rx = ferry.connect_receiver(address)
                tx = ferry.connect_sender(address)
                tx.send({"echo": rx.recv()})
                replies.append(True)

            thread = threading.Thread(target=client)
            thread.start()
            tx = listener.accept_sender(timeout=10)  # waits without the GIL: the client thread runs
            rx = listener.accept_receiver(timeout=10)
            tx.send([1, "two"])
            self.assertEqual(rx.recv(), {"echo": [1, "two"]})
            thread.join(10)
            self.assertEqual(replies, [True])

    def test_tensors_travel_by_address_over_every_transport(self):
        for transport in ("unix", "shm_ring", "pipe"):
            with self.subTest(transport=transport):
                address = self.address() + transport
                with ferry.listen(address, transport=transport) as listener:
                    received = []
                    thread = threading.Thread(
                        target=lambda: received.append(ferry.connect_receiver(address, transport=transport).recv()))
                    thread.start()
                    tensor = ferry.empty((3,), "int64")
                    torch.from_dlpack(tensor).copy_(torch.tensor([1, 2, 3]))
                    listener.accept_sender(timeout=10).send({"t": tensor})
                    thread.join(10)
                    self.assertTrue(torch.equal(torch.from_dlpack(received[0]["t"]), torch.tensor([1, 2, 3])))

    def test_a_held_address_and_a_silent_listener_are_errors(self):
        address = self.address()
        with ferry.listen(address) as listener:
            with self.assertRaisesRegex(ferry.AddressInUse, "in use"):
                ferry.listen(address)
            with self.assertRaises(TimeoutError):
                listener.accept_sender(timeout=0.05)
        with self.assertRaises(ferry.Error):
            ferry.connect_receiver(address, timeout=0.1)  # nobody listens any more


if __name__ == "__main__":
    unittest.main()
