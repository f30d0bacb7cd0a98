"""ferry.snapshot() and the introspection socket from Python."""

import json
import os
import socket
import unittest

import ferry


def ask(pid, request=b"snapshot\n"):
    """The whole reply of `pid`'s introspection server to `request`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(5)
        client.connect(f"\0ferry-introspect.{pid}")
        client.sendall(request)
        reply = b""
        while True:
            chunk = client.recv(65536)
            if not chunk:
                return reply
            reply += chunk


def end_labelled(snapshot, label, direction):
    return next(end for end in snapshot["ends"] if end["label"] == label and end["direction"] == direction)


class SnapshotTest(unittest.TestCase):
    def tearDown(self):
        ferry.disable_introspection()

    def test_counts_equal_what_was_sent(self):
        ferry.enable_introspection()
        tx, rx = ferry.channel("shm_ring", name="numbers")
        try:
            for i in range(25):
                tx.send({"i": i, "text": "x" * i})
            for i in range(10):
                self.assertEqual(rx.recv()["i"], i)
            now = ferry.snapshot()
            self.assertEqual(now["version"], 1)
            self.assertEqual(now["pid"], os.getpid())
            self.assertEqual(now["role"], "main")
            self.assertIsNone(now["rank"])
            sent = end_labelled(now, "numbers", "send")
            received = end_labelled(now, "numbers", "recv")
            self.assertEqual(sent["messages"], 25)
            self.assertEqual(received["messages"], 10)
            self.assertEqual(sent["transport"], "shm_ring")
            self.assertEqual(sent["state"], "open")
            self.assertGreater(sent["bytes"], received["bytes"])
            self.assertIsNone(received["in_flight"])
            self.assertIn("bytes_in_use", now["shared_memory"])
        finally:
            tx.close()
            rx.close()

    def test_fanouts_and_in_process_channels_are_labelled(self):
        pool = ferry.Distributor(name="pool")
        tx, rx = ferry.channel("pipe")
        local_tx, local_rx = ferry.channel("in_process", name="local")
        try:
            pool.add(tx)
            pool.send(1)
            local_tx.send(2)
            now = ferry.snapshot()
            self.assertEqual([fanout["label"] for fanout in now["fanouts"]], ["pool"])
            local = end_labelled(now, "local", "send")
            self.assertEqual(local["transport"], "in_process")
            self.assertEqual(local["messages"], 1)
            self.assertEqual(local["in_flight"], 1)
            self.assertEqual(local["peer_pid"], os.getpid())
        finally:
            rx.close()
            pool.close()
            local_tx.close()
            local_rx.close()

    def test_the_name_must_be_a_str(self):
        with self.assertRaises(TypeError):
            ferry.channel("pipe", name=3)

    def test_the_server_answers_on_its_socket(self):
        tx, rx = ferry.channel("pipe", name="served")
        try:
            tx.send(1)  # not counted: introspection is off
            self.assertFalse(ferry.introspection_enabled())
            self.assertEqual(end_labelled(ferry.snapshot(), "served", "send")["messages"], 0)
            ferry.enable_introspection()
            self.assertTrue(ferry.introspection_enabled())
            tx.send(2)
            reply = ask(os.getpid())
            self.assertTrue(reply.endswith(b"\n"))
            document = json.loads(reply)
            self.assertEqual(document["pid"], os.getpid())
            self.assertEqual(end_labelled(document, "served", "send")["messages"], 1)
            self.assertIn("error", json.loads(ask(os.getpid(), b"what\n")))
            ferry.disable_introspection()
            with self.assertRaises(OSError):
                ask(os.getpid())
        finally:
            tx.close()
            rx.close()


if __name__ == "__main__":
    unittest.main()
