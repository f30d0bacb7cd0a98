"""ferry.channel/duplex options and names, ferry.share, NumPy scalars, error messages in
Python's terms, the CUDA refusal, __version__, stubs and docstrings."""

import inspect
import os
import re
import threading
import time
import unittest

try:
    import numpy as np
except ImportError:  # this interpreter lacks it: every test here needs it
    raise unittest.SkipTest("needs numpy (python3-numpy on Debian)")
try:
    import torch
except ImportError:  # this interpreter lacks it: every test here needs it
    raise unittest.SkipTest("needs torch (python3-torch on Debian)")

import ferry


def touch_first_element(rank, rx):
    tensor = torch.from_dlpack(rx.recv())
    tensor[0] = 42.0


class ChannelTest(unittest.TestCase):
    def test_transports_have_cpp_names_and_default_to_shm_ring(self):
        self.assertEqual(ferry.channel()[0].transport, "shm_ring")
        for name in ("shm_ring", "unix_socket", "pipe", "in_process"):
            with self.subTest(transport=name):
                tx, rx = ferry.channel(name)
                self.assertEqual((tx.transport, rx.transport), (name, name))
                tx.send({"n": 1})
                self.assertEqual(rx.recv(), {"n": 1})
        self.assertEqual(ferry.channel("unix")[0].transport, "unix_socket")
        with self.assertRaisesRegex(ValueError, "'shm_ring', 'unix_socket', 'pipe' or 'in_process'"):
            ferry.channel("carrier_pigeon")

    def test_options_are_keyword_arguments_with_cpp_names(self):
        tx, rx = ferry.channel("shm_ring", ring_capacity=4096, ring_spin=0, peer_check_interval=0.01,
                               close_linger=1.0, limits={"max_body_bytes": 1 << 16})
        got = []
        reader = threading.Thread(target=lambda: got.append(rx.recv()))
        reader.start()
        tx.send(b"x" * 20000)  # larger than the 4 KiB ring: streams through it while the reader reads
        reader.join(10)
        self.assertEqual(got, [b"x" * 20000])
        with self.assertRaises(ferry.Error):
            tx.send(b"x" * (1 << 17))  # above the receiver's limit: refused before sending
        tx, rx = ferry.channel("in_process", queue_capacity=1)
        tx.send(1)
        with self.assertRaisesRegex(TypeError, "no option 'ring_size'.*ring_capacity"):
            ferry.channel(ring_size=1)
        with self.assertRaisesRegex(TypeError, "limits has no 'max_bytes'"):
            ferry.channel(limits={"max_bytes": 1})
        with self.assertRaisesRegex(ValueError, "close_linger"):
            ferry.channel(close_linger=-1)

    def test_duplex_call_and_call_for(self):
        for transport in ("shm_ring", "unix_socket", "pipe", "in_process"):
            with self.subTest(transport=transport):
                a, b = ferry.duplex(transport)
                server = threading.Thread(target=lambda: [b.send(x + 1) for x in b])
                server.start()
                self.assertEqual(a.call(1), 2)
                self.assertEqual(a.call_for(2, timeout=10), 3)
                a.close()
                server.join(10)
                self.assertFalse(server.is_alive())

    def test_call_for_times_out_and_the_late_reply_is_kept(self):
        a, b = ferry.duplex("unix_socket")
        started = time.monotonic()
        with self.assertRaises(TimeoutError):
            a.call_for("ping", timeout=0.1)
        self.assertLess(time.monotonic() - started, 5)
        self.assertEqual(b.recv(), "ping")
        b.send("late")
        self.assertEqual(a.recv(), "late")

    def test_closing_one_duplex_half_ends_one_direction(self):
        a, b = ferry.duplex("unix_socket")
        a.sender.close()
        with self.assertRaises(ferry.ChannelClosed):
            b.recv_for(10)
        b.send("still")
        self.assertEqual(a.recv(), "still")


def connect_and_exchange(rank, address, kind):
    if kind == "receiver":  # served by the listener's accept_sender
        rx = ferry.connect_receiver(address, timeout=30, transport="unix_socket")
        assert rx.recv() == "to receiver"
    elif kind == "sender":
        tx = ferry.connect_sender(address, timeout=30, transport="unix_socket")
        tx.send("from sender")
        tx.close()
    else:
        end = ferry.connect_duplex(address, timeout=30, transport="unix_socket")
        assert end.call("ping") == "pong"
        end.close()


class ListenerTest(unittest.TestCase):
    def test_a_listener_serves_every_kind_whatever_order_clients_connect_in(self):
        address = f"unix:@ferry-api-test-{os.getpid()}"
        with ferry.listen(address, transport="unix_socket") as listener:
            listener.serve_sender()
            listener.serve_receiver()
            listener.serve_duplex()
            clients = [ferry.spawn(connect_and_exchange, args=(address, kind), join=False)
                       for kind in ("duplex", "sender", "receiver")]  # the reverse of the accepts below
            time.sleep(0.3)  # all three have connected and wait; none was refused
            tx = listener.accept_sender(timeout=30)
            tx.send("to receiver")
            rx = listener.accept_receiver(timeout=30)
            self.assertEqual(rx.recv(), "from sender")
            end = listener.accept_duplex(timeout=30)
            self.assertIsInstance(end, ferry.Duplex)
            self.assertEqual(end.recv(), "ping")
            end.send("pong")
            for client in clients:
                client.join(timeout=60)

    def test_an_undeclared_kind_is_refused(self):
        address = f"unix:@ferry-api-test-refused-{os.getpid()}"
        errors = []

        def connect():
            try:
                ferry.connect_sender(address, timeout=10)
            except ferry.Error as error:
                errors.append(error)

        with ferry.listen(address) as listener:
            listener.serve_sender()
            client = threading.Thread(target=connect)
            client.start()
            with self.assertRaises(TimeoutError):  # the handshake runs (and refuses) inside accept
                listener.accept_sender(timeout=1)
            client.join(10)
        self.assertEqual([type(e) for e in errors], [ferry.TypeMismatch])


class ShareTest(unittest.TestCase):
    def test_a_shared_torch_tensor_is_the_same_object_and_later_sends_carry_its_pages(self):
        tensor = torch.arange(8, dtype=torch.float32)
        self.assertIs(ferry.share(tensor), tensor)
        self.assertTrue(torch.equal(tensor, torch.arange(8, dtype=torch.float32)))
        self.assertIs(ferry.share(tensor), tensor)  # shared once
        tx, rx = ferry.channel()
        group = ferry.spawn(touch_first_element, args=(rx,), join=False)
        tx.send(tensor)
        group.join(timeout=60)
        self.assertEqual(float(tensor[0]), 42.0)  # the worker wrote the same pages

    def test_an_unshared_tensor_is_copied_on_send(self):
        tensor = torch.zeros(4)
        tx, rx = ferry.channel()
        group = ferry.spawn(touch_first_element, args=(rx,), join=False)
        tx.send(tensor)
        group.join(timeout=60)
        self.assertEqual(float(tensor[0]), 0.0)

    def test_a_shared_numpy_array_is_the_same_object_in_ferry_memory(self):
        array = np.arange(6, dtype=np.int64).reshape(2, 3)
        self.assertIs(ferry.share(array), array)
        np.testing.assert_array_equal(array, np.arange(6).reshape(2, 3))
        self.assertTrue(ferry._ferry._in_ferry_memory(array.__array_interface__["data"][0], array.nbytes))
        tx, rx = ferry.channel()
        tx.send(array)
        received = np.asarray(rx.recv())
        np.testing.assert_array_equal(received, array)
        with self.assertRaisesRegex(ValueError, "ascontiguousarray"):
            ferry.share(np.zeros((4, 4))[:, 1])

    def test_views_and_requires_grad(self):
        base = torch.randn(4, 4, requires_grad=True)
        self.assertIs(ferry.share(base), base)
        self.assertTrue(base.requires_grad)
        view = torch.randn(6)[2:5]
        values = view.clone()
        ferry.share(view)
        self.assertTrue(torch.equal(view, values))
        with self.assertRaisesRegex(TypeError, "torch tensor or a NumPy array"):
            ferry.share([1, 2])


class ConversionTest(unittest.TestCase):
    def test_numpy_scalars_arrive_as_numbers(self):
        tx, rx = ferry.channel("unix_socket")
        tx.send({"f": np.float32(1.5), "i": np.int64(-3), "u": np.uint8(7), "b": np.bool_(True),
                 "d": np.float64(0.25), "array": np.zeros(2, np.float32), "zero_dim": np.array(2.0)})
        got = rx.recv()
        self.assertEqual((got["f"], got["i"], got["u"], got["b"], got["d"]), (1.5, -3, 7, True, 0.25))
        self.assertIs(type(got["f"]), float)
        self.assertIs(type(got["i"]), int)
        self.assertIs(type(got["b"]), bool)
        self.assertIsInstance(got["array"], ferry.Tensor)
        self.assertIsInstance(got["zero_dim"], ferry.Tensor)  # a 0-dim array stays a tensor

    def test_a_cuda_tensor_is_refused_naming_its_device_and_what_to_do(self):
        class CudaTensor:  # what a CUDA torch tensor shows ferry (Debian's torch has no CUDA)
            device = "cuda:1"

            def __dlpack_device__(self):
                return (2, 1)

            def __dlpack__(self, stream=None):
                raise AssertionError("not reached")

        with self.assertRaises(TypeError) as caught:
            ferry.channel()[0].send({"x": CudaTensor()})
        self.assertIn("cuda:1", str(caught.exception))
        self.assertIn(".cpu()", str(caught.exception))
        self.assertNotIn("device type", str(caught.exception))


class ErrorTextTest(unittest.TestCase):
    def test_messages_name_python_apis(self):
        tx, rx = ferry.channel("unix_socket")
        rx.close()
        with self.assertRaises(ferry.ChannelClosed) as caught:
            tx.send(1)
        text = str(caught.exception)
        self.assertIn("join() of the group ferry.spawn returned", text)
        self.assertNotRegex(text, r"\w::\w")

    def test_fork_with_threads_is_refused_in_python_terms(self):
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait)
        thread.start()
        try:
            with self.assertRaises(ferry.SpawnError) as caught:
                ferry.spawn(print, start_method="fork")
        finally:
            stop.set()
            thread.join()
        text = str(caught.exception)
        self.assertIn("start_method='spawn'", text)
        self.assertIn("fork_with_threads=True", text)
        self.assertNotRegex(text, r"\w::\w")

    def test_a_thread_ending_as_spawn_starts_is_not_counted(self):
        # The thread wakes while spawn checks for threads: it must get the GIL to end.
        thread = threading.Thread(target=time.sleep, args=(0.02,))
        thread.start()
        group = ferry.spawn(print, start_method="fork", join=False)
        group.join(timeout=60)
        thread.join()


class PackageTest(unittest.TestCase):
    def test_version(self):
        self.assertRegex(ferry.__version__, r"^\d+\.\d+\.\d+$")

    def test_every_public_name_has_a_docstring(self):
        def text_of(value):  # the docstring without the signature lines pybind11 writes
            doc = inspect.getdoc(value) or ""
            return "\n".join(line for line in doc.splitlines() if not re.match(r"^\w+\(.*\)( -> .*)?$", line)).strip()

        for name in ferry.__all__:
            obj = getattr(ferry, name)
            with self.subTest(name=name):
                self.assertTrue(text_of(obj), f"ferry.{name} has no docstring")
            if inspect.isclass(obj):
                for member, value in vars(obj).items():
                    if member.startswith("_") or not callable(value) and not isinstance(value, property):
                        continue
                    with self.subTest(name=f"{name}.{member}"):
                        self.assertTrue(text_of(value), f"ferry.{name}.{member} has no docstring")

    def test_stubs_and_py_typed_ship_with_the_package_and_name_every_public_name(self):
        folder = os.path.dirname(ferry.__file__)
        self.assertTrue(os.path.isfile(os.path.join(folder, "py.typed")))
        with open(os.path.join(folder, "__init__.pyi")) as stub:
            text = stub.read()
        for name in ferry.__all__:
            with self.subTest(name=name):
                self.assertRegex(text, rf"(class|def) {name}\b|^{name}\b", f"the stubs lack ferry.{name}")


if __name__ == "__main__":
    unittest.main()
