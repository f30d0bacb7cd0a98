"""The trainer's side of a multi-process ferry DataLoader (private).

Contract: ``FerryDataLoaderIter(loader)`` behaves as torch's ``_MultiProcessingDataLoaderIter``:
it draws the base seed and the sampler's indices in torch's order, hands task ``k`` to the
next active worker in torch's cycle, keeps ``prefetch_factor * num_workers`` tasks
outstanding and yields batches in task order (``in_order=False``: as they arrive), so it
yields torch's batches in torch's order. What differs is the path of a batch: each worker
has its own ferry channels (python/ferry/data/_plumbing.py), the batch's tensors arrive as
handles to the worker's shared memory and are viewed by torch without a copy.

Failures: a worker's exception is re-raised here with its id and traceback (torch's
ExceptionWrapper); a worker that died is a RuntimeError naming its id, pid and signal or exit
code, found within _plumbing.CHECK_INTERVAL while waiting; ``timeout`` > 0 bounds each wait.
"""

import collections
import functools
import itertools
import os
import pickle
import time

from torch.utils.data import IterDataPipe, MapDataPipe
from torch.utils.data import _utils as _torch_utils
from torch.utils.data.dataloader import _BaseDataLoaderIter, _sharding_worker_init_fn

from . import _batch, _collate, _plumbing, _worker

# While waiting out of order, how long one wait on the oldest task's worker lasts before the
# others are polled again.
_OUT_OF_ORDER_SLICE = 0.005


class FerryDataLoaderIter(_BaseDataLoaderIter):
    def __init__(self, loader):
        super().__init__(loader)  # the sampler's iterator, then the base seed: torch's order
        assert self._num_workers > 0 and self._prefetch_factor > 0
        self._owner = os.getpid()
        self._shutdown = False
        self._failure = None  # the error that broke this iterator: raised again by every next()
        self._workers = None
        self._in_order = getattr(loader, "in_order", True)
        context = loader.multiprocessing_context
        if context is None:
            import multiprocessing as context
        collate_fn = self._collate_fn
        if collate_fn is _torch_utils.collate.default_collate:
            collate_fn = _collate.default_collate  # stacks straight into ferry memory
        init_fn = loader.worker_init_fn
        if isinstance(self._dataset, (IterDataPipe, MapDataPipe)):  # as torch: sharding, then the user's
            init_fn = functools.partial(_sharding_worker_init_fn, init_fn, self._world_size, self._rank)
        self._workers = _plumbing.WorkerProcesses(
            context, self._num_workers, _worker.worker_loop,
            (self._num_workers, self._dataset_kind, self._dataset, self._auto_collation, collate_fn,
             self._drop_last, self._base_seed, init_fn, self._shared_seed))
        self._reset(loader, first_iter=True)

    # ---- epochs ---------------------------------------------------------------------------

    def _reset(self, loader, first_iter=False):
        super()._reset(loader, first_iter)
        self._send_idx = 0  # the next task to hand out
        self._rcvd_idx = 0  # the next task to yield
        # task -> (worker,) while outstanding, (worker, batch) once received out of order, or
        # (worker, None) once yielded out of order
        self._task_info = {}
        self._tasks_outstanding = 0
        self._worker_tasks = [collections.deque() for _ in range(self._num_workers)]
        self._workers_status = [True] * self._num_workers
        self._worker_queue_idx_cycle = itertools.cycle(range(self._num_workers))
        if not first_iter:
            for worker_id in range(self._num_workers):
                try:
                    self._workers.put(worker_id, {"resume": self._shared_seed})
                except _plumbing.WorkerGone as gone:
                    self._fail(gone)
            for worker_id in range(self._num_workers):
                while "resumed" not in self._receive(worker_id):
                    pass  # a result of the epoch that was left early
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    # ---- tasks ----------------------------------------------------------------------------

    def _try_put_index(self):
        assert self._tasks_outstanding < self._prefetch_factor * self._num_workers
        try:
            index = self._next_index()
        except StopIteration:
            return
        for _ in range(self._num_workers):  # the next active worker, in torch's cycle
            worker_id = next(self._worker_queue_idx_cycle)
            if self._workers_status[worker_id]:
                break
        else:
            return
        try:
            self._workers.put(worker_id, {"i": self._send_idx, "x": pickle.dumps(index)})
        except _plumbing.WorkerGone as gone:
            self._fail(gone)
        self._task_info[self._send_idx] = (worker_id,)
        self._worker_tasks[worker_id].append(self._send_idx)
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _next_data(self):
        if self._failure is not None:
            raise RuntimeError(self._failure)
        while True:
            # Skip tasks that an exhausted (iterable) worker will never answer, and tasks
            # already yielded out of order.
            while self._rcvd_idx < self._send_idx:
                info = self._task_info[self._rcvd_idx]
                if len(info) == 2 and info[1] is not None:
                    break
                if len(info) == 1 and self._workers_status[info[0]]:
                    break
                del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
            else:
                if not self._persistent_workers:
                    self._shutdown_workers()
                raise StopIteration
            info = self._task_info[self._rcvd_idx]
            if len(info) == 2:
                del self._task_info[self._rcvd_idx]
                return self._process_data(info[1], in_order=True)
            worker_id, message = self._next_message(info[0])
            task = self._worker_tasks[worker_id].popleft()
            self._tasks_outstanding -= 1
            if "end" in message:  # this worker's replica of the IterableDataset is exhausted
                self._workers_status[worker_id] = False
                self._tasks_outstanding -= len(self._worker_tasks[worker_id])
                self._worker_tasks[worker_id].clear()
                if not self._persistent_workers:
                    self._workers.stop(worker_id)
                self._try_put_index()
                continue
            if task == self._rcvd_idx:
                del self._task_info[task]
                return self._process_data(message, in_order=True)
            if self._in_order:
                self._task_info[task] += (message,)
            else:
                self._task_info[task] += (None,)  # yielded now: skipped when its turn comes
                return self._process_data(message, in_order=False)

    def _process_data(self, message, in_order):
        if in_order:
            self._rcvd_idx += 1
        self._try_put_index()
        if "error" in message:
            _worker.rebuild_error(message).reraise()
        data = _batch.decode(message["p"], message["t"])
        if self._pin_memory:
            data = _torch_utils.pin_memory.pin_memory(data, self._pin_memory_device)
        return data

    # ---- waiting --------------------------------------------------------------------------

    def _next_message(self, worker_id):
        """(worker, message): `worker_id`'s next result, or out of order any worker's."""
        if self._in_order:
            return worker_id, self._receive(worker_id)
        deadline = time.monotonic() + self._timeout if self._timeout > 0 else None
        while True:
            for other in range(self._num_workers):
                if self._worker_tasks[other]:
                    message = self._poll(other)
                    if message is not None:
                        return other, message
            message = self._receive(worker_id, _OUT_OF_ORDER_SLICE, deadline)
            if message is not None:
                return worker_id, message

    def _poll(self, worker_id):
        try:
            return self._workers.poll(worker_id)
        except _plumbing.WorkerGone as gone:
            self._fail(gone)

    def _receive(self, worker_id, slice_seconds=None, deadline=None):
        """`worker_id`'s next result; None after `slice_seconds` when given. Raises for a dead
        worker (any active one) and when `timeout` passed."""
        if deadline is None and self._timeout > 0:
            deadline = time.monotonic() + self._timeout
        give_up = time.monotonic() + slice_seconds if slice_seconds is not None else None
        while True:
            wait = _plumbing.CHECK_INTERVAL
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - time.monotonic()))
            if give_up is not None:
                wait = min(wait, max(0.0, give_up - time.monotonic()))
            try:
                message = self._workers.get(worker_id, wait)
            except _plumbing.WorkerGone as gone:
                self._fail(gone)
            if message is not None:
                return message
            for failed, description in self._workers.failures():
                if self._workers_status[failed] or self._worker_tasks[failed]:
                    self._fail(_plumbing.WorkerGone(failed, description))
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
            if give_up is not None and now >= give_up:
                return None

    def _fail(self, gone):
        self._failure = str(gone)
        self._shutdown_workers()
        raise RuntimeError(self._failure) from None

    @property
    def broken(self):
        """True once a worker died: the loader starts new workers for the next epoch."""
        return self._failure is not None

    # ---- the end --------------------------------------------------------------------------

    def _shutdown_workers(self):
        if self._shutdown or os.getpid() != self._owner:
            return
        self._shutdown = True
        if self._workers is not None:
            self._workers.shutdown()

    def __del__(self):
        try:
            self._shutdown_workers()
        except Exception:  # at interpreter exit, multiprocessing may have ended the workers already
            pass
