"""ferry.spawn: worker processes that run a Python function, as torch.multiprocessing.spawn.

Ends (Sender, Receiver, Duplex) among the arguments are handed over as C++'s spawn does:
the worker owns them, the parent lets go of its copy (so end of stream and peer death
work), and a worker forked with ``start_method="fork"`` drops every other end it inherited.
"""

import io
import multiprocessing.spawn as _mp_spawn
import os
import pickle
import sys
import traceback

from . import _ferry
from ._ferry import Receiver, Sender, SpawnError

__all__ = ["PerRank", "WorkerFailed", "WorkerGroup", "per_rank", "spawn"]


class PerRank:
    """One value per worker: worker ``rank`` receives ``values[rank]`` (see :func:`per_rank`)."""

    __slots__ = ("values",)

    def __init__(self, values):
        self.values = list(values)

    def __repr__(self):
        return f"ferry.per_rank({self.values!r})"


def per_rank(values):
    """Gives worker ``r`` of :func:`spawn` the element ``values[r]``.

    ``values`` must hold exactly one value per worker. A channel end belongs to one process,
    so with ``nprocs > 1`` ends are handed out this way::

        ferry.spawn(work, nprocs=4, args=(ferry.per_rank(receivers),))
    """
    return PerRank(values)


class WorkerFailed(_ferry.Error):
    """A worker of :func:`spawn` failed; the other workers of its group were terminated.

    Attributes: ``rank``, ``world_size``, ``pid``, ``cause`` (``"exception"``,
    ``"exit_code"``, ``"signal"`` or ``"start_failed"``), ``exit_code`` (or None),
    ``signal`` (its number, or None), ``exception_type`` (the name of what the worker
    raised, or None) and ``traceback`` (the worker's formatted traceback, or None).
    """

    def __init__(self, details):
        self.rank = details["rank"]
        self.world_size = details["world_size"]
        self.pid = details["pid"]
        self.cause = details["cause"]
        self.exit_code = details["exit_code"]
        self.signal = details["signal"]
        self.exception_type = details["exception_type"]
        self.traceback = details["traceback"]
        self.terminated_siblings = details["terminated_siblings"]
        super().__init__(_describe_failure(details))




def _signal_name(number):
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _describe_failure(d):
    text = f"worker {d['rank']} of {d['world_size']} (pid {d['pid']}) "
    cause = d["cause"]
    if cause == "exception":
        lines = (d["traceback"] or "").rstrip().splitlines()
        last = lines[-1] if lines else d["exception_type"]
        text += f"raised {last}"
    elif cause == "exit_code":
        text += f"exited with status {d['exit_code']}"
    elif cause == "signal":
        text += f"was killed by {_signal_name(d['signal'])}"
    else:
        text += f"could not start: {d['start_failure']}"
    siblings = d["terminated_siblings"]
    if siblings:
        text += f"; the {siblings} other running worker{' was' if siblings == 1 else 's were'} terminated"
    if cause == "exception" and d["traceback"]:
        text += "\n\n" + d["traceback"].rstrip()
    return text


class WorkerGroup:
    """The workers one :func:`spawn` started.

    Dropping the group while workers run terminates them (SIGTERM, then SIGKILL after
    ``termination_grace`` seconds); workers never outlive the parent process either (they
    get SIGKILL when the thread that spawned them exits; spawn from the main thread).
    """

    def __init__(self, group, keep):
        self._group = group
        self._keep = keep  # the arguments: their tensors must outlive the forked workers

    def join(self, timeout=None):
        """Waits for every worker to finish; ``timeout`` in seconds, None waits for ever.

        Returns True when all finished, False when the time ran out. Raises
        :class:`WorkerFailed` as soon as one fails (raised, exited non-zero, was killed),
        after terminating the others. Ctrl-C raises KeyboardInterrupt; terminate() from
        another thread ends the wait with :class:`ferry.Error`.
        """
        outcome = self._group.join(timeout)
        if isinstance(outcome, dict):
            self._keep = None
            raise WorkerFailed(outcome)
        if outcome:
            self._keep = None
        return outcome

    def terminate(self):
        """Terminates the running workers (SIGTERM; SIGKILL after the grace period) and reaps them."""
        self._group.terminate()
        self._keep = None

    @property
    def pids(self):
        """The process ids of the workers, by rank."""
        return [self._group.pid(rank) for rank in range(self._group.size)]

    @property
    def nprocs(self):
        """The number of workers."""
        return self._group.size

    @property
    def running(self):
        """How many workers have not been reaped yet."""
        return self._group.running

    def exit_status(self, rank):
        """How worker ``rank`` ended: (exited, exit code, signal), or None while it runs."""
        return self._group.exit_status(rank)


for _public in (PerRank, WorkerFailed, WorkerGroup):
    _public.__module__ = "ferry"  # as users name them


def _duplex_type():
    from ._channels import Duplex

    return Duplex


def _ends_in(value, found, seen):
    """Appends to ``found`` every Sender and Receiver inside ``value`` (lists, tuples, dicts, Duplex)."""
    if isinstance(value, (Sender, Receiver)):
        found.append(value)
    elif isinstance(value, _duplex_type()):
        found.append(value.sender)
        found.append(value.receiver)
    elif isinstance(value, (list, tuple, dict, PerRank)):
        if id(value) in seen:
            return
        seen.add(id(value))
        items = value.values() if isinstance(value, dict) else (value.values if isinstance(value, PerRank) else value)
        for item in items:
            _ends_in(item, found, seen)


def _args_of_rank(args, rank):
    return tuple(arg.values[rank] if isinstance(arg, PerRank) else arg for arg in args)


def _check(args, nprocs, start_method):
    """The ends of each rank, after checking the arguments as C++'s spawn does."""
    owners = {}
    ends_of_rank = [[] for _ in range(nprocs)]
    for position, arg in enumerate(args):
        if isinstance(arg, PerRank):
            if len(arg.values) != nprocs:
                raise SpawnError(
                    f"argument {position} of ferry.spawn is ferry.per_rank of {len(arg.values)} values, but nprocs "
                    f"is {nprocs}: give exactly one value per worker")
            per_rank_ends = []
            for rank, value in enumerate(arg.values):
                found = []
                _ends_in(value, found, set())
                per_rank_ends.append(found)
        else:
            found = []
            _ends_in(arg, found, set())
            if found and nprocs > 1:
                raise SpawnError(
                    f"argument {position} of ferry.spawn holds a channel end, and an end belongs to one process; "
                    f"give each of the {nprocs} workers its own with ferry.per_rank([...])")
            per_rank_ends = [found] + [[] for _ in range(nprocs - 1)]
        for rank, found in enumerate(per_rank_ends):
            for end in found:
                if id(end) in owners and owners[id(end)] != rank:
                    raise SpawnError(
                        f"argument {position} of ferry.spawn gives one channel end to workers {owners[id(end)]} and "
                        f"{rank}; an end belongs to one process: make one channel per worker")
                owners[id(end)] = rank
                is_open, transport, used = _ferry._end_state(end)
                if not is_open:
                    raise SpawnError(
                        f"argument {position} of ferry.spawn holds a closed channel end; hand workers open ends")
                if transport == "in_process":
                    raise SpawnError(
                        f"argument {position} of ferry.spawn holds an end of an in_process channel, which cannot "
                        f"reach another process; make the channel with transport='shm_ring', 'unix_socket' or "
                        f"'pipe'")
                if start_method == "spawn" and used:
                    raise SpawnError(
                        f"argument {position} of ferry.spawn holds an end that has already carried messages; "
                        f"start_method='spawn' rebuilds ends from their descriptors in a new interpreter, so it "
                        f"needs fresh ones (or use start_method='fork')")
                if end not in ends_of_rank[rank]:
                    ends_of_rank[rank].append(end)
    return ends_of_rank


def _flush_output():
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # a closed or broken stream: its output is lost either way
            pass


def _run(fn, rank, args, ends):
    """Runs ``fn(rank, *args)`` in a worker: None when it returned, (type name, traceback)
    when it raised. SystemExit ends the process with its code."""
    try:
        try:
            fn(rank, *args)
        except SystemExit as stop:
            code = stop.code
            if code is None:
                code = 0
            elif not isinstance(code, int):
                print(code, file=sys.stderr)
                code = 1
            if code != 0:
                _flush_output()
                os._exit(code)
        for end in ends:  # the worker's ends end cleanly when fn returns
            end.close()
        return None
    except BaseException as error:  # noqa: B902 - a worker reports whatever it raised
        return (type(error).__qualname__, traceback.format_exc())
    finally:
        _flush_output()


def _start_forked(group, fn, rank, args, ends):
    def body():
        _ferry._keep_only_ends(ends)
        for end in ends:
            _ferry._hand_over(end, True)
        return _run(fn, rank, args, ends)

    group.start_forked(rank, body)


_WORKER_CODE = "import sys; sys.path.insert(0, {path!r}); from ferry import _spawn; _spawn._exec_main()"


def _command_line():
    """How a worker interpreter is started: this interpreter, running _exec_main."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return [sys.executable, "-c", _WORKER_CODE.format(path=package_parent)]


def _record_command_line():
    _ferry._record_command_line(_command_line())


class _EndPickler(pickle.Pickler):
    """Pickles a worker's function and arguments; ends travel as descriptions of descriptors
    the worker inherits."""

    def __init__(self, file):
        from multiprocessing.reduction import ForkingPickler

        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.dispatch_table = ForkingPickler(io.BytesIO()).dispatch_table  # torch's and ferry's reducers
        self.fds = []

    def persistent_id(self, obj):
        if isinstance(obj, (Sender, Receiver)):
            description, fds = _ferry._describe_end(obj)
            self.fds.extend(fds)
            return ("ferry-end", description)
        return None


class _EndUnpickler(pickle.Unpickler):
    def persistent_load(self, pid):
        kind, description = pid
        if kind != "ferry-end":
            raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")
        return _ferry._end_from_description(description)


def _start_exec(group, fn, rank, args):
    buffer = io.BytesIO()
    preparation = _mp_spawn.get_preparation_data(f"ferry-worker-{rank}")
    preparation["authkey"] = bytes(preparation["authkey"])  # multiprocessing's key, for its own connections
    pickle.dump(preparation, buffer, protocol=pickle.HIGHEST_PROTOCOL)
    pickler = _EndPickler(buffer)
    pickler.dump((fn, args))
    fd = os.memfd_create("ferry-spawn-payload", os.MFD_CLOEXEC)
    try:
        with open(fd, "wb", closefd=False) as payload:
            payload.write(buffer.getvalue())
        os.lseek(fd, 0, os.SEEK_SET)
        group.start_exec(rank, fd, pickler.fds)
    finally:
        os.close(fd)


def _exec_main():
    """The entry of an interpreter that ferry.spawn started with start_method='spawn'."""
    _ferry._run_exec_worker(_command_line())  # recorded too, for spawns in the worker


def _exec_worker(rank, world_size, payload_fd):
    """Called by the C++ entry in a re-executed interpreter: reads the payload, runs fn."""
    del world_size
    with open(payload_fd, "rb") as payload:
        _mp_spawn.prepare(pickle.load(payload))
        fn, args = _EndUnpickler(payload).load()
    ends = []
    _ends_in(args, ends, set())
    return _run(fn, rank, args, ends)


def spawn(fn, args=(), nprocs=1, join=True, start_method="fork", *, termination_grace=5.0,
          fork_with_threads=False):
    """Starts ``nprocs`` worker processes, each calling ``fn(rank, *args)``, as
    ``torch.multiprocessing.spawn`` does.

    Arguments reach the workers as in C++'s ``ferry::spawn``: a ``ferry.per_rank(list)``
    gives worker ``r`` element ``r``; channel ends (Sender, Receiver, Duplex, also inside
    lists, tuples and dicts) are handed over: the worker owns them and closes them cleanly
    when ``fn`` returns, and this process lets go of its copy. With ``nprocs > 1`` ends go
    through ``per_rank``. Anything else is the same value for every worker.

    ``start_method="fork"`` forks this process (fast; ``fn`` may be any callable; refused
    while this process runs other threads unless ``fork_with_threads=True``; a thread whose
    function has returned, joined or not, gets 100 ms to end before it counts);
    ``"spawn"`` starts a fresh interpreter, to which ``fn`` and the arguments are pickled
    (``fn`` must be importable; ends must not have carried messages yet).

    Returns the :class:`WorkerGroup` when ``join`` is False; otherwise joins it (raising
    :class:`WorkerFailed` if a worker fails) and returns None. Workers never outlive this
    process. Raises :class:`SpawnError` before any worker starts for arguments it cannot
    hand over.
    """
    if not callable(fn):
        raise TypeError(f"ferry.spawn needs a callable, not {type(fn).__name__}")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise SpawnError(f"ferry.spawn needs nprocs >= 1 workers, not {nprocs!r}")
    if start_method not in ("fork", "spawn"):
        raise ValueError(f"ferry.spawn's start_method is 'fork' or 'spawn', not {start_method!r}")
    args = tuple(args)
    ends_of_rank = _check(args, nprocs, start_method)
    if start_method == "spawn":
        _record_command_line()
    group = _ferry._WorkerGroup(nprocs, start_method, float(termination_grace), bool(fork_with_threads))
    try:
        for rank in range(nprocs):
            rank_args = _args_of_rank(args, rank)
            if start_method == "fork":
                _start_forked(group, fn, rank, rank_args, ends_of_rank[rank])
            else:
                _start_exec(group, fn, rank, rank_args)
    finally:
        for ends in ends_of_rank:  # the workers own them now (or, after a failure, nobody)
            for end in ends:
                _ferry._hand_over(end, False)
    workers = WorkerGroup(group, args)
    if join:
        workers.join()
        return None
    return workers
