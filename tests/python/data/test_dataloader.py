"""ferry.data.DataLoader against torch's DataLoader, with real worker processes: the same
batches in the same order, failures (a dataset that raises, a worker or the trainer killed,
timeouts), small /dev/shm and descriptor limits, persistent workers and restarts."""

import collections
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import unittest

try:
    import numpy as np
    import torch
except ImportError as missing:
    raise unittest.SkipTest(f"the DataLoader tests need numpy and torch: {missing.name} is not installed")

from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset, IterableDataset, get_worker_info

import ferry

from ferry.data import DataLoader

Pair = collections.namedtuple("Pair", "left right")


class Samples(Dataset):
    """Every kind of element default_collate handles, and the worker that made it."""

    def __init__(self, size=203):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        info = get_worker_info()
        return {
            "image": torch.arange(12, dtype=torch.uint8).reshape(3, 4) + index % 200,
            "float": torch.full((5,), index / 7, dtype=torch.float32),
            "half": torch.tensor([index], dtype=torch.bfloat16),
            "mask": torch.tensor([index % 2 == 0, index % 3 == 0]),
            "array": np.full((2, 2), index, dtype=np.int16),
            "label": index,
            "weight": index / 3,
            "name": f"sample-{index}",
            "pair": Pair(torch.tensor(index), (index, str(index))),
            "random": torch.rand(2),  # seeded per worker as torch seeds it
            "worker": (info.id, info.num_workers, info.seed, type(info.dataset).__name__),
        }


class Stream(IterableDataset):
    """A replica per worker, sharded with get_worker_info() as torch's docs show, of uneven lengths."""

    def __init__(self, size):
        self.size = size

    def __iter__(self):
        info = get_worker_info()
        first, step, extra = (info.id, info.num_workers, 3 * info.id) if info else (0, 1, 0)
        for index in range(first, self.size + extra, step):
            yield torch.tensor([index, info.seed % 1000]), index * 0.5


class RaisesAt(Dataset):
    def __init__(self, bad):
        self.bad = bad

    def __len__(self):
        return 100

    def __getitem__(self, index):
        if index == self.bad:
            raise ValueError(f"no sample at index {index}")
        return torch.tensor(index)


class Slow(Dataset):
    def __init__(self, delay, size=10_000):
        self.delay = delay
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        time.sleep(self.delay)
        return torch.tensor(index)


class SlowAt(Dataset):
    def __init__(self, slow_index, delay, size):
        self.slow_index, self.delay, self.size = slow_index, delay, size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        if index == self.slow_index:
            time.sleep(self.delay)
        return torch.tensor(index)


def failing_init(worker_id):
    if worker_id == 1:
        raise OSError(f"worker {worker_id} cannot open its shard")


def assert_same(test, expected, actual, where="batch"):
    """Equal structure, types, dtypes, shapes and values."""
    test.assertIs(type(actual), type(expected), where)
    if isinstance(expected, torch.Tensor):
        test.assertEqual(actual.dtype, expected.dtype, where)
        test.assertEqual(actual.requires_grad, expected.requires_grad, where)
        test.assertEqual(actual.shape, expected.shape, where)
        test.assertTrue(torch.equal(actual, expected), f"{where}: {actual} != {expected}")
    elif isinstance(expected, np.ndarray):
        test.assertEqual(actual.dtype, expected.dtype, where)
        np.testing.assert_array_equal(actual, expected, where)
    elif isinstance(expected, dict):
        test.assertEqual(list(actual), list(expected), where)
        for key in expected:
            assert_same(test, expected[key], actual[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        test.assertEqual(len(actual), len(expected), where)
        for index, (e, a) in enumerate(zip(expected, actual)):
            assert_same(test, e, a, f"{where}[{index}]")
    else:
        test.assertEqual(actual, expected, where)


def loaders(dataset, **options):
    """torch's and ferry's loader, each with its own generator seeded alike where one is asked for."""
    made = []
    for kind in (TorchDataLoader, DataLoader):
        arguments = dict(options)
        if arguments.pop("seeded", False):
            arguments["generator"] = torch.Generator().manual_seed(1234)
        made.append(kind(dataset, **arguments))
    return made


def memfd_segments(pid="self"):
    """The (device, inode) of every ferry segment `pid` maps."""
    found = set()
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith("/memfd:ferry"):
                found.add((fields[3], fields[4]))
    return found


def in_memfd(address):
    """True when `address` lies in a ferry memfd mapping of this process."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith("/memfd:ferry"):
                low, high = (int(x, 16) for x in fields[0].split("-"))
                if low <= address < high:
                    return True
    return False


def unix_sockets():
    with open("/proc/net/unix") as table:
        return table.readlines()


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def is_gone(pid):
    """True when `pid` exited (a zombie whose new parent does not reap it counts as gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return any(line.startswith("State:") and "Z" in line for line in status)
    except FileNotFoundError:
        return True


def run_script(body, timeout=120):
    """Runs `body` in a new interpreter with this process's sys.path; returns (code, output)."""
    source = "import sys\nsys.path[:0] = " + repr(sys.path) + "\n" + textwrap.dedent(body)
    completed = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=timeout)
    return completed.returncode, completed.stdout + completed.stderr


class SameBatchesTest(unittest.TestCase):
    def test_map_style_shuffled_with_a_generator_gives_torchs_batches_both_ways_of_drop_last(self):
        for drop_last in (False, True):
            with self.subTest(drop_last=drop_last):
                theirs, ours = loaders(Samples(), batch_size=16, shuffle=True, num_workers=2, drop_last=drop_last,
                                       seeded=True)
                self.assertEqual(len(ours), len(theirs))
                self.assertEqual(len(ours), 12 if drop_last else 13)
                expected, actual = list(theirs), list(ours)
                self.assertEqual(len(actual), len(expected))
                assert_same(self, expected, actual)
                workers = {int(worker) for batch in actual for worker in batch["worker"][0]}
                self.assertEqual(workers, {0, 1})  # both workers made batches

    def test_iterable_datasets_that_shard_themselves_give_torchs_batches_both_ways_of_drop_last(self):
        for drop_last in (False, True):
            with self.subTest(drop_last=drop_last):
                theirs, ours = loaders(Stream(50), batch_size=4, num_workers=2, drop_last=drop_last, seeded=True)
                expected, actual = list(theirs), list(ours)
                self.assertGreater(len(actual), 10)
                assert_same(self, expected, actual)

    def test_without_batching_and_with_a_batch_sampler_and_a_collate_fn(self):
        def collate(samples):  # a user collate: tensors and arrays made on the heap, moved as handles
            floats = torch.stack([s["float"] for s in samples])
            return {"pair": Pair(floats, [s["name"] for s in samples]),
                    "arrays": np.stack([s["array"] for s in samples]),
                    "masks": torch.stack([s["mask"] for s in samples]),
                    "leaf": floats.sum(1).detach().requires_grad_(),
                    "again": floats}  # the same tensor twice

        cases = {
            "batch_size=None": dict(batch_size=None, num_workers=2, seeded=True),
            "batch_sampler": dict(batch_sampler=[[3, 1, 4], [1, 5], [9, 2, 6, 5]], num_workers=2, seeded=True),
            "collate_fn": dict(batch_size=8, num_workers=2, collate_fn=collate, shuffle=True, seeded=True),
            "prefetch_factor=1, 3 workers": dict(batch_size=5, num_workers=3, prefetch_factor=1, seeded=True),
        }
        for name, options in cases.items():
            with self.subTest(name):
                theirs, ours = loaders(Samples(40), **options)
                assert_same(self, list(theirs), list(ours))

    def test_spawned_and_forkserver_workers_give_torchs_batches(self):
        # torch's forked workers give the batches its spawned ones would (the same seeds); one
        # worker each, since every started interpreter imports torch.
        expected = list(loaders(Samples(20), batch_size=4, num_workers=1, seeded=True)[0])
        for method in ("spawn", "forkserver"):
            with self.subTest(method):
                ours = loaders(Samples(20), batch_size=4, num_workers=1, multiprocessing_context=method,
                               seeded=True)[1]
                assert_same(self, expected, list(ours))

    def test_an_iterator_made_on_a_thread_that_ended_keeps_its_workers(self):
        made = []
        maker = threading.Thread(target=lambda: made.append(iter(DataLoader(Samples(40), batch_size=4,
                                                                              num_workers=2))))
        maker.start()
        maker.join()  # the kernel's parent-death signal would follow this thread
        time.sleep(0.3)
        self.assertEqual([int(v) for batch in made[0] for v in batch["label"]], list(range(40)))

    def test_the_trainer_views_the_workers_memory_without_a_copy(self):
        batch = next(iter(DataLoader(Samples(), batch_size=16, num_workers=2)))
        for key in ("image", "float", "half", "mask"):
            self.assertTrue(in_memfd(batch[key].data_ptr()), key)
        self.assertIsInstance(batch["array"], torch.Tensor)  # default_collate made it a tensor
        self.assertTrue(in_memfd(batch["array"].data_ptr()))

    def test_out_of_order_yields_a_slow_batch_after_those_ready_before_it(self):
        ours = DataLoader(SlowAt(0, 0.5, 48), batch_size=4, num_workers=2, in_order=False)
        order = [int(batch[0]) // 4 for batch in ours]
        self.assertEqual(sorted(order), list(range(12)))
        self.assertGreater(order.index(0), 0)  # batch 0 (worker 0's, slow) came after others
        in_order = DataLoader(SlowAt(0, 0.2, 48), batch_size=4, num_workers=2)
        self.assertEqual([int(batch[0]) // 4 for batch in in_order], list(range(12)))


class FailureTest(unittest.TestCase):
    def test_a_dataset_exception_is_raised_in_the_trainer_with_the_worker_and_its_traceback(self):
        messages = []
        for kind in (TorchDataLoader, DataLoader):
            iterator = iter(kind(RaisesAt(37), batch_size=4, num_workers=2))
            seen = []
            with self.assertRaises(ValueError) as raised:
                for batch in iterator:
                    seen.extend(batch.tolist())
            self.assertEqual(seen, list(range(36)))  # every batch before the failing one, in order
            self.assertEqual([v for batch in iterator for v in batch.tolist()], list(range(40, 100)))  # then on
            messages.append(str(raised.exception))
        for message in messages:
            self.assertIn("Caught ValueError in DataLoader worker process 1", message)
            self.assertIn("no sample at index 37", message)
            self.assertIn('raise ValueError(f"no sample at index {index}")', message)

    def test_a_failing_worker_init_fn_is_raised_in_the_trainer_like_torchs(self):
        for kind in (TorchDataLoader, DataLoader):
            with self.subTest(kind.__module__):
                loader = kind(Samples(40), batch_size=4, num_workers=2, worker_init_fn=failing_init)
                with self.assertRaisesRegex(OSError, "(?s)Caught OSError in DataLoader worker process 1.*"
                                                     "worker 1 cannot open its shard"):
                    list(loader)

    def test_a_worker_killed_mid_epoch_is_a_runtime_error_naming_it_and_the_signal_within_a_second(self):
        iterator = iter(DataLoader(Slow(0.002), batch_size=4, num_workers=2))
        next(iterator)
        victim = iterator._workers.pids()[1]
        os.kill(victim, signal.SIGKILL)
        began = time.monotonic()
        with self.assertRaisesRegex(RuntimeError, rf"DataLoader worker 1 \(pid {victim}\) was killed by signal 9 "
                                                  r"\(SIGKILL\)"):
            for _ in iterator:
                pass
        self.assertLess(time.monotonic() - began, 1.0)

    def test_a_worker_killed_while_the_trainer_waits_on_another_is_found_within_a_second(self):
        iterator = iter(DataLoader(Slow(0.5, 100), batch_size=1, num_workers=2, prefetch_factor=1))
        victim = iterator._workers.pids()[1]  # the trainer waits on worker 0's first batch
        os.kill(victim, signal.SIGKILL)
        began = time.monotonic()
        with self.assertRaisesRegex(RuntimeError, "DataLoader worker 1 .* killed by signal 9"):
            next(iterator)
        self.assertLess(time.monotonic() - began, 1.0)

    def test_a_stranger_saying_hello_on_the_listener_is_refused(self):
        from ferry.data import _plumbing

        def impostor(address, transport, worker_id, trainer_pid, watchdog, main, args):
            ferry.connect_sender(address, timeout=30, transport=transport).send({"hello": 7})
            time.sleep(30)

        real = _plumbing._worker_bootstrap
        _plumbing._worker_bootstrap = impostor
        try:
            with self.assertRaisesRegex(RuntimeError, "not one of this DataLoader's workers .*'hello': 7"):
                iter(DataLoader(Samples(8), batch_size=4, num_workers=1))
        finally:
            _plumbing._worker_bootstrap = real

    def test_timeout(self):
        iterator = iter(DataLoader(Slow(0.3, 8), batch_size=2, num_workers=2, timeout=0.05))
        began = time.monotonic()
        with self.assertRaisesRegex(RuntimeError, "DataLoader timed out after 0.05 seconds"):
            next(iterator)
        self.assertLess(time.monotonic() - began, 0.3)
        patient = DataLoader(Slow(0.01, 8), batch_size=2, num_workers=2, timeout=5)
        self.assertEqual([int(v) for batch in patient for v in batch], list(range(8)))

    def test_ctrl_c_while_the_trainer_waits_is_a_keyboard_interrupt_at_once(self):
        trainer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            sys.path[:0] = {sys.path!r}
            import torch
            from ferry.data import DataLoader
            class Slow(torch.utils.data.Dataset):
                def __len__(self): return 100
                def __getitem__(self, i): time.sleep(30); return torch.tensor(i)
            iterator = iter(DataLoader(Slow(), batch_size=1, num_workers=2))
            print(" ".join(map(str, iterator._workers.pids())), flush=True)
            try:
                next(iterator)
            except KeyboardInterrupt:
                print("KeyboardInterrupt", flush=True)
            del iterator
        """)], stdout=subprocess.PIPE, text=True)  # SIGINT at its default action, as in a terminal
        with trainer:
            workers = [int(pid) for pid in trainer.stdout.readline().split()]
            time.sleep(0.3)  # waiting for the first batch
            sent = time.monotonic()
            trainer.send_signal(signal.SIGINT)
            self.assertEqual(trainer.stdout.readline().strip(), "KeyboardInterrupt")
            self.assertLess(time.monotonic() - sent, 0.5)
            self.assertEqual(trainer.wait(timeout=30), 0)
        self.assertTrue(all(is_gone(pid) for pid in workers))

    def test_the_trainer_killed_leaves_no_worker_shared_memory_socket_or_descriptor(self):
        # Made on the main thread, workers die by PR_SET_PDEATHSIG; on a thread, by their watchdog.
        for on_thread in (False, True):
            with self.subTest(iterator_made_on_a_thread=on_thread):
                self.kill_a_trainer(on_thread)

    def kill_a_trainer(self, on_thread):
        shm_before = set(os.listdir("/dev/shm"))
        trainer = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(f"""
                import sys, threading, time
                sys.path[:0] = {sys.path!r}
                import torch
                from ferry.data import DataLoader
                class Images(torch.utils.data.Dataset):
                    def __len__(self): return 100000
                    def __getitem__(self, i): return torch.zeros(3, 64, 64, dtype=torch.uint8)
                made = []
                make = lambda: made.append(iter(DataLoader(Images(), batch_size=32, num_workers=2)))
                if {on_thread!r}:
                    maker = threading.Thread(target=make)
                    maker.start()
                    maker.join()
                else:
                    make()
                held = [next(made[0]) for _ in range(4)]
                print(" ".join(map(str, made[0]._workers.pids())), flush=True)
                time.sleep(60)
            """)], stdout=subprocess.PIPE, text=True)
        try:
            workers = [int(pid) for pid in trainer.stdout.readline().split()]
            self.assertEqual(len(workers), 2)
            sockets = [line for line in unix_sockets() if f"@ferry-data-{trainer.pid}-" in line]
            self.assertTrue(sockets)  # the workers' connections exist while the trainer lives
        finally:
            trainer.kill()
            trainer.wait()
            trainer.stdout.close()
        def left_behind():
            return ([pid for pid in workers if not is_gone(pid)],
                    set(os.listdir("/dev/shm")) - shm_before,
                    [line for line in unix_sockets() if f"@ferry-data-{trainer.pid}-" in line])

        deadline = time.monotonic() + 1.0
        while any(left_behind()) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(left_behind(), ([], set(), []), "left a second after the trainer was killed")


class ResourcesTest(unittest.TestCase):
    def test_a_64_mb_dev_shm_in_a_mount_namespace(self):
        unshare = shutil.which("unshare")
        if os.geteuid() != 0 or unshare is None:
            self.skipTest("needs root and unshare(1) to mount a 64 MB /dev/shm in a new mount namespace")
        # 24 MiB batches, 6 in flight (prefetch 3 x 2 workers) and 2 held: 192 MiB alive at
        # once, three times what /dev/shm holds.
        # torch's loader runs in an interpreter of its own: when a bus error kills one of its
        # workers, torch's trainer may raise, or it may die in its own exit path, and either
        # way ferry's run below is judged on its own.
        torch_script = textwrap.dedent("""
            import torch
            class Images(torch.utils.data.Dataset):
                def __len__(self): return 128 * 6
                def __getitem__(self, i): return torch.full((3, 256, 256), i % 251, dtype=torch.uint8), i
            list(torch.utils.data.DataLoader(Images(), batch_size=128, num_workers=2, prefetch_factor=3))
            print("torch's loader worked")
        """)
        script = textwrap.dedent("""
            import os, subprocess, sys, torch
            sys.path[:0] = %r
            from ferry.data import DataLoader
            class Images(torch.utils.data.Dataset):
                def __len__(self): return 128 * 6
                def __getitem__(self, i): return torch.full((3, 256, 256), i %% 251, dtype=torch.uint8), i
            # torch's workers write their batches into /dev/shm files: a bus error kills one
            torch_run = subprocess.run([sys.executable, "-c", %r], capture_output=True, text=True, timeout=60)
            print("torch's loader exit status", torch_run.returncode, torch_run.stdout.strip())
            if "bus error" in torch_run.stderr.lower() or "DataLoader worker (pid" in torch_run.stderr:
                print("torch's loader lost a worker to a bus error")
            left_by_torch = set(os.listdir("/dev/shm"))  # a killed torch worker may leave its file
            held = []
            for images, labels in DataLoader(Images(), batch_size=128, num_workers=2, prefetch_factor=3):
                assert torch.equal(images[:, 2, 255, 255], (labels %% 251).to(torch.uint8))
                held = (held + [images])[-2:]
            shm = os.statvfs("/dev/shm")
            added = set(os.listdir("/dev/shm")) - left_by_torch
            print("dev/shm bytes", shm.f_blocks * shm.f_frsize, "entries added", len(added))
        """ % (sys.path, torch_script))
        shell = f"mount -t tmpfs -o size=64m ferry-test-shm /dev/shm && exec {sys.executable} -c \"$0\""
        completed = subprocess.run([unshare, "--mount", "--propagation", "private", "sh", "-c", shell, script],
                                   capture_output=True, text=True, timeout=120)
        if completed.returncode != 0 and "dev/shm bytes" not in completed.stdout and "mount" in completed.stderr:
            self.skipTest(f"cannot mount a tmpfs in a new mount namespace here: {completed.stderr.strip()}")
        self.assertEqual(completed.returncode, 0, completed.stdout + completed.stderr)
        self.assertNotIn("torch's loader worked", completed.stdout)  # a bus error killed one of its workers
        self.assertNotIn("torch's loader exit status 0", completed.stdout)
        self.assertIn("torch's loader lost a worker to a bus error", completed.stdout)
        self.assertIn(f"dev/shm bytes {64 * 1024 * 1024} entries added 0", completed.stdout)

    def test_a_descriptor_limit_of_1024_with_batches_of_256_tensors_held_by_the_trainer(self):
        code, output = run_script("""
            import os, resource, torch
            resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
            from ferry.data import DataLoader
            class ManyTensors(torch.utils.data.Dataset):
                def __len__(self): return 16 * 8
                def __getitem__(self, i): return [torch.full((4,), float(i * 1000 + k)) for k in range(256)]
            try:  # torch passes a descriptor per tensor, and the trainer keeps one per tensor it holds
                held = list(torch.utils.data.DataLoader(ManyTensors(), batch_size=8, num_workers=2))
                print("torch's loader worked")
            except RuntimeError as error:
                print("torch's loader failed:", error)
            held = None
            loader = DataLoader(ManyTensors(), batch_size=8, num_workers=2)
            before = len(os.listdir("/proc/self/fd"))
            held = list(loader)  # 16 batches of 256 tensors: 4,096 tensors alive at once
            assert len(held) == 16 and all(len(batch) == 256 for batch in held)
            assert float(held[15][255][7, 3]) == (15 * 8 + 7) * 1000 + 255
            print("fds", before, len(os.listdir("/proc/self/fd")))
        """)
        self.assertEqual(code, 0, output)
        self.assertIn("torch's loader failed: received 0 items of ancdata", output)
        before, after = (int(v) for v in output.split("fds ")[1].split())
        self.assertLessEqual(after, before + 8, output)  # no descriptor per tensor


class EpochsTest(unittest.TestCase):
    def test_break_then_restart_gives_torchs_batches(self):
        for persistent in (False, True):
            with self.subTest(persistent_workers=persistent):
                runs = []
                for loader in loaders(Samples(), batch_size=8, shuffle=True, num_workers=2,
                                      persistent_workers=persistent, seeded=True):
                    run = []
                    for position, batch in enumerate(loader):
                        run.append(batch)
                        if position == 3:
                            break
                    run.extend(loader)
                    run.extend(loader)
                    runs.append(run)
                assert_same(self, runs[0], runs[1])

    def test_three_persistent_epochs_keep_their_workers_and_allocate_no_segment_after_the_first(self):
        theirs, ours = loaders(Samples(256), batch_size=16, shuffle=True, num_workers=2, persistent_workers=True,
                               seeded=True)
        fds_before = open_fds()
        epochs = [list(ours)]
        workers = ours._iterator._workers.pids()
        worker_segments = [memfd_segments(pid) for pid in workers]
        trainer_segments = memfd_segments()
        self.assertTrue(all(worker_segments))
        epochs[0] = [batch["label"] for batch in epochs[0]]  # drops the first epoch's blocks
        epochs += [list(ours), list(ours)]
        self.assertEqual(ours._iterator._workers.pids(), workers)
        self.assertEqual([memfd_segments(pid) for pid in workers], worker_segments)
        self.assertLessEqual(memfd_segments(), trainer_segments)
        del ours  # its workers end; the batches it made stay readable
        self.assertTrue(all(is_gone(pid) for pid in workers))
        # One descriptor per segment the batches view (a few per worker), none per tensor.
        self.assertLessEqual(open_fds() - fds_before, len(memfd_segments()))
        expected = [list(theirs) for _ in range(3)]
        assert_same(self, [batch["label"] for batch in expected[0]], epochs[0])
        assert_same(self, expected[1:], epochs[1:])
        del theirs, expected, epochs
        self.assertEqual(open_fds(), fds_before)
