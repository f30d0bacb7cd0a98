"""How the DataLoader's trainer and its worker processes reach each other (private).

Contract:
- ``WorkerProcesses(context, count, main, args)`` starts ``count`` processes with the
  ``multiprocessing`` context ``context``; worker ``i`` runs ``main(link, i, *args)`` where
  ``link`` is a :class:`TrainerLink`. When the constructor returns, every worker is connected:
  one ferry channel carries tasks from the trainer to each worker, another carries results back.
- ``put(i, message)`` sends worker ``i`` a task; ``get(i, timeout)`` returns its next result, or
  None when none came within ``timeout`` seconds; ``WorkerGone`` when its stream ended or the
  worker died. ``poll(i)`` is ``get(i, 0)``. ``failures()`` names workers that died.
  ``stop(i)`` ends worker ``i``'s task stream (it finishes its loop and exits);
  ``shutdown()`` stops every worker, waits a little, kills the rest and closes every end.
- A worker dies with the trainer, SIGKILL included (``PR_SET_PDEATHSIG``, or a watchdog
  thread where the trainer started it from a thread other than the main one, since the
  kernel signal follows the starting thread). Nothing is named on disk: the listener's
  address is in the abstract Unix namespace, and tensors live in ferry's memfd segments.

Messages are ``ferry.Value`` dicts (see python/ferry/data/_worker.py for their fields). This
module is the only one that knows how processes start and how ends are made, so that it can
move to ferry.spawn and ferry.channel without touching the loader.
"""

import ctypes
import os
import secrets
import signal
import threading
import time

import ferry

# How long one wait runs before liveness is checked again (a dead worker is reported within it).
CHECK_INTERVAL = 0.1
# How long a starting worker may take to connect (spawn imports torch: seconds).
CONNECT_TIMEOUT = 120.0
# How long shutdown() waits for a stopped worker to exit before killing it.
EXIT_GRACE = 1.0

_PR_SET_PDEATHSIG = 1


class WorkerGone(Exception):
    """A worker's result stream ended or broke; ``description`` says how it died if it did."""

    def __init__(self, worker_id, description):
        super().__init__(f"DataLoader worker {worker_id} {description}")
        self.worker_id = worker_id
        self.description = description


def describe_exit(process):
    """How `process` ended, in words ('killed by signal 9 (SIGKILL)'), or None while it runs."""
    code = process.exitcode
    if code is None:
        return None
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "an unknown signal"
        return f"(pid {process.pid}) was killed by signal {-code} ({name})"
    return f"(pid {process.pid}) exited unexpectedly with exit code {code}"


# Plumbing objects of this process. A forked worker keeps references to those it inherited, so
# that they are never destroyed there: destroying an inherited end would act on the trainer's
# connections (a Sender's destructor ends its stream).
_live = set()
_live_lock = threading.Lock()


class WorkerProcesses:
    """The trainer's side: the worker processes and a task and a result channel to each."""

    def __init__(self, context, count, main, args, transport="unix"):
        self._owner = os.getpid()
        self.processes = []
        self._tasks = [None] * count
        self._results = [None] * count
        self._closed = False
        address = f"unix:@ferry-data-{os.getpid()}-{secrets.token_hex(8)}"
        with _live_lock:
            _live.add(self)
        listener = None
        try:
            watchdog = threading.current_thread() is not threading.main_thread()
            for worker_id in range(count):
                process = context.Process(
                    target=_worker_bootstrap,
                    args=(address, transport, worker_id, os.getpid(), watchdog, main, args),
                    daemon=True)
                process.start()
                self.processes.append(process)
            # Listening only now, so that no worker inherits the listening socket (a worker's
            # connect waits for the address to appear).
            listener = ferry.listen(address, transport=transport)
            self._accept_all(listener, count)
        except BaseException:
            self.shutdown()
            raise
        finally:
            if listener is not None:
                listener.close()

    def _accept_all(self, listener, count):
        # Each worker connects its result Sender, says hello on it, then connects its task
        # Receiver; it cannot connect the second before the first was accepted, so the
        # accept_sender after a hello is that worker's.
        deadline = time.monotonic() + CONNECT_TIMEOUT
        for _ in range(count):
            results = self._wait(lambda: listener.accept_receiver(timeout=CHECK_INTERVAL), deadline)
            hello = self._wait(lambda: results.recv_for(CHECK_INTERVAL), deadline)
            worker_id = hello.get("hello") if isinstance(hello, dict) else None
            if not isinstance(worker_id, int) or not 0 <= worker_id < count or self._results[worker_id] is not None:
                raise RuntimeError(f"a process that is not one of this DataLoader's workers connected to its "
                                   f"listener and said {hello!r}")
            self._results[worker_id] = results
            self._tasks[worker_id] = self._wait(lambda: listener.accept_sender(timeout=CHECK_INTERVAL), deadline)

    def _wait(self, attempt, deadline):
        while True:
            try:
                return attempt()
            except TimeoutError:
                pass
            for worker_id, description in self.failures():
                raise RuntimeError(f"DataLoader worker {worker_id} {description} while starting")
            if time.monotonic() > deadline:
                raise RuntimeError(f"DataLoader workers did not connect within {CONNECT_TIMEOUT:.0f} s")

    def __len__(self):
        return len(self.processes)

    def put(self, worker_id, message):
        try:
            self._tasks[worker_id].send(message)
        except ferry.ChannelClosed:
            raise WorkerGone(worker_id, self._death(worker_id) or "stopped reading its tasks") from None

    def get(self, worker_id, timeout):
        try:
            return self._results[worker_id].recv_for(timeout)
        except TimeoutError:
            return None
        except ferry.ChannelClosed:  # PeerDied too: the worker ended or died
            raise WorkerGone(worker_id, self._death(worker_id) or "ended its results") from None

    def poll(self, worker_id):
        return self.get(worker_id, 0)

    def _death(self, worker_id):
        # A worker whose stream broke is dying: give the kernel a moment to report how.
        process = self.processes[worker_id]
        process.join(timeout=1.0)
        return describe_exit(process)

    def failures(self):
        """(worker_id, description) of each worker that exited."""
        return [(worker_id, describe_exit(p)) for worker_id, p in enumerate(self.processes)
                if p.exitcode is not None]

    def pids(self):
        return [p.pid for p in self.processes]

    def stop(self, worker_id):
        sender = self._tasks[worker_id]
        if sender is not None:
            sender.close()

    def shutdown(self):
        """Ends every worker (politely, then SIGKILL after EXIT_GRACE) and closes every end."""
        if self._closed or os.getpid() != self._owner:
            return
        self._closed = True
        for sender in self._tasks:
            if sender is not None:
                sender.close()  # the worker's loop ends after its current task
        for receiver in self._results:
            if receiver is not None:
                receiver.close()  # a worker blocked sending a result gets ChannelClosed
        deadline = time.monotonic() + EXIT_GRACE
        for process in self.processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.exitcode is None:
                process.kill()
                process.join()
        self._tasks = [None] * len(self._tasks)
        self._results = [None] * len(self._results)
        for process in self.processes:
            process.close()
        with _live_lock:
            _live.discard(self)


class TrainerLink:
    """A worker's side: the tasks it receives and the results it sends."""

    def __init__(self, tasks, results, parent):
        self._tasks = tasks
        self._results = results
        self._parent = parent

    def tasks(self):
        """The trainer's tasks, until it ends the stream or dies."""
        while True:
            try:
                yield self._tasks.recv_for(CHECK_INTERVAL)
            except TimeoutError:
                if os.getppid() != self._parent:
                    return
            except ferry.ChannelClosed:
                return

    def put(self, message):
        """Sends a result; False when the trainer stopped reading."""
        try:
            self._results.send(message)
            return True
        except ferry.ChannelClosed:
            return False


def _die_with_parent(parent, watchdog):
    if watchdog:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True,
                         name="ferry-data-watchdog").start()
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed in a DataLoader worker")
    if os.getppid() != parent:  # the parent died before prctl: nobody will send the signal
        os._exit(1)


def _watch_parent(parent):
    while os.getppid() == parent:
        time.sleep(CHECK_INTERVAL)
    os.kill(os.getpid(), signal.SIGKILL)


def _parent_to_follow(trainer_pid):
    """The process whose death ends this worker: the trainer, or the forkserver that the
    trainer started (it exits when the trainer dies). Exits at once if the trainer is gone."""
    parent = os.getppid()
    if parent == trainer_pid:
        return parent
    try:
        with open(f"/proc/{parent}/stat") as stat:  # "pid (name) state ppid ..."
            grandparent = int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        grandparent = None
    if grandparent != trainer_pid:
        os._exit(1)  # reparented: the trainer died before this worker started
    return parent


def _worker_bootstrap(address, transport, worker_id, trainer_pid, watchdog, main, args):
    # The plumbing objects a forked worker inherited stay referenced by its copy of _live, so
    # they are never destroyed here (the process ends with os._exit).
    parent = _parent_to_follow(trainer_pid)
    _die_with_parent(parent, watchdog)
    results = ferry.connect_sender(address, timeout=CONNECT_TIMEOUT, transport=transport)
    results.send({"hello": worker_id})
    tasks = ferry.connect_receiver(address, timeout=CONNECT_TIMEOUT, transport=transport)
    try:
        main(TrainerLink(tasks, results, parent), worker_id, *args)
    except KeyboardInterrupt:
        pass  # Ctrl-C reaches the trainer too, which reports it
    finally:
        tasks.close()
        results.close()
