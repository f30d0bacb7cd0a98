"""The loop a DataLoader worker runs (private): torch's worker loop over ferry channels.

Contract: ``worker_loop(link, worker_id, ...)`` seeds the process and sets torch's worker info
exactly as ``torch.utils.data._utils.worker._worker_loop`` does (so ``get_worker_info()``,
``worker_init_fn`` and datasets that shard themselves behave the same), then answers each
task from ``link.tasks()`` with one result through ``link.put``, in the order received.

Tasks (trainer to worker), ferry.Value dicts:
  ``{"i": task_index, "x": pickled_index}``   fetch and collate this index (a batch of them)
  ``{"resume": seed_or_None}``                 a new epoch for persistent workers
Results (worker to trainer):
  ``{"i": task_index, "p": skeleton, "t": [tensors]}``   a batch (see _batch.py)
  ``{"i": task_index, "end": True}``             an IterableDataset replica is exhausted
  ``{"i": task_index, "error": ..., ...}``       the fetch raised (see error_message())
  ``{"resumed": True}``                          acknowledges a resume
After ``end``, the worker answers no task until the next resume (torch skips them too).
"""

import pickle
import random

import torch
from torch._utils import ExceptionWrapper
from torch.utils.data import IterDataPipe, _DatasetKind
from torch.utils.data._utils import HAS_NUMPY, signal_handling
from torch.utils.data._utils import worker as _torch_worker
from torch.utils.data.graph_settings import apply_random_seed

from . import _batch


def error_message(task_index, wrapper):
    """The result that carries `wrapper` (a torch ExceptionWrapper) to the trainer."""
    try:
        exc_type = pickle.dumps(wrapper.exc_type)
    except Exception:  # a class the trainer could not import either: it becomes a RuntimeError
        exc_type = b""
    return {"i": task_index, "error": exc_type, "name": wrapper.exc_type.__name__,
            "text": wrapper.exc_msg, "where": wrapper.where}


def rebuild_error(message):
    """The ExceptionWrapper an error result carries; its reraise() raises it as torch does."""
    wrapper = ExceptionWrapper.__new__(ExceptionWrapper)
    try:
        wrapper.exc_type = pickle.loads(message["error"])
    except Exception:
        wrapper.exc_type = RuntimeError
    wrapper.exc_msg = message["text"]
    wrapper.where = message["where"]
    return wrapper


def _seed(base_seed, worker_id):
    seed = base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    if HAS_NUMPY:
        import numpy
        numpy.random.seed(_torch_worker._generate_state(base_seed, worker_id))
    return seed


def _answer(task_index, fetcher, dataset_kind, worker_id):
    """The result of one task, and whether the worker's iterable is exhausted."""
    try:
        data = fetcher.fetch(pickle.loads(task_index[1]))
    except StopIteration:
        if dataset_kind == _DatasetKind.Iterable:
            return {"i": task_index[0], "end": True}, True
        return error_message(task_index[0], ExceptionWrapper(where=f"in DataLoader worker process {worker_id}")), False
    except Exception:
        return error_message(task_index[0], ExceptionWrapper(where=f"in DataLoader worker process {worker_id}")), False
    try:
        skeleton, tensors = _batch.encode(data)
    except Exception:
        return error_message(task_index[0], ExceptionWrapper(
            where=f"in DataLoader worker process {worker_id} (sending the batch)")), False
    return {"i": task_index[0], "p": skeleton, "t": tensors}, False


def worker_loop(link, worker_id, num_workers, dataset_kind, dataset, auto_collation, collate_fn, drop_last,
                base_seed, init_fn, shared_seed):
    signal_handling._set_worker_signal_handlers()
    torch.set_num_threads(1)
    seed = _seed(base_seed, worker_id)
    shared_rng = torch.Generator()
    if isinstance(dataset, IterDataPipe):
        shared_rng.manual_seed(shared_seed)
        dataset = apply_random_seed(dataset, shared_rng)
    _torch_worker._worker_info = _torch_worker.WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed,
                                                          dataset=dataset)
    init_error = None
    fetcher = None
    try:
        if init_fn is not None:
            init_fn(worker_id)
        fetcher = _DatasetKind.create_fetcher(dataset_kind, dataset, auto_collation, collate_fn, drop_last)
    except Exception:
        init_error = ExceptionWrapper(where=f"in DataLoader worker process {worker_id}")

    iteration_end = False
    for task in link.tasks():
        if "resume" in task:
            iteration_end = False
            if isinstance(dataset, IterDataPipe):
                shared_rng.manual_seed(task["resume"])
                dataset = apply_random_seed(dataset, shared_rng)
            fetcher = _DatasetKind.create_fetcher(dataset_kind, dataset, auto_collation, collate_fn, drop_last)
            if not link.put({"resumed": True}):
                return
            continue
        if iteration_end:
            continue
        if init_error is not None:
            result, init_error = error_message(task["i"], init_error), None
        else:
            result, iteration_end = _answer((task["i"], task["x"]), fetcher, dataset_kind, worker_id)
        if not link.put(result):
            return
        del result
