"""How ferry's ends and tensors travel through ``multiprocessing``.

``register()`` (run by ``import ferry``) adds reductions to
``multiprocessing.reduction.ForkingPickler``, the pickler behind ``Process`` arguments (spawn
and forkserver contexts), ``Queue``, ``SimpleQueue``, ``Pipe`` connections and ``Pool``:

- ``Sender`` / ``Receiver`` MOVE: the pickle carries the end's description and duplicates
  of its descriptors (``multiprocessing.reduction.DupFd``: handed to the child by the
  spawning ``Popen``, else served by ``multiprocessing.resource_sharer``); the pickling
  process's copy is marked handed away and let go of, so any later use there raises
  ``ferry.EndOwnedElsewhere``. Only a fresh end (one that never sent or received) can be
  pickled: a used one keeps protocol state in its process.
- ``ferry.Tensor``: the tensor is sent on a new channel over a Unix socket (its segment's
  descriptor travels with the frame) and the pickle carries that channel's Receiver; the
  unpickling process receives it, so the tensor views the same pages, leased as any
  received tensor (the sender's pool does not recycle the block while it is held).
- ``Process`` arguments of the 'fork' context are not pickled but inherited: a child
  adopts every end among its arguments (and a Pool worker's ``initargs``) before its
  target runs (``multiprocessing.util.register_after_fork``), so the parent's copy is
  refused from then on.
"""

import multiprocessing
import os
from multiprocessing import reduction, util

from . import _ferry


def _duplicates_for_pickle(fds):
    """A ``DupFd`` for each descriptor, valid after this process closes ``fds``."""
    popen = multiprocessing.context.get_spawning_popen()
    if popen is None:
        # resource_sharer duplicates each descriptor now and serves the copy.
        return [reduction.DupFd(fd) for fd in fds]
    # A spawning Popen passes the descriptors themselves when it starts the child, after
    # pickling: hand it duplicates that live as long as the Popen does.
    copies = [os.dup(fd) for fd in fds]
    util.Finalize(popen, _close_all, args=(copies,))
    return [reduction.DupFd(fd) for fd in copies]


def _close_all(fds):
    for fd in fds:
        os.close(fd)


def _reduce_end(end):
    description, fds = _ferry._describe_for_handover(end)
    duplicates = _duplicates_for_pickle(fds)
    _ferry._hand_away(end)
    return _rebuild_end, (description, duplicates)


def _rebuild_end(description, duplicates):
    return _ferry._rebuild_end(description, [duplicate.detach() for duplicate in duplicates])


def _reduce_tensor(tensor):
    sender, receiver = _ferry._channel("unix")
    sender.send(tensor)
    sender.close()
    return _rebuild_tensor, (receiver,)


def _rebuild_tensor(receiver):
    with receiver:
        return receiver.recv()


def _ends_among(value, depth=0):
    """The ferry ends in ``value`` and the lists, tuples and dicts it holds (a few levels)."""
    if isinstance(value, (_ferry.Sender, _ferry.Receiver)):
        yield value
    elif depth < 4 and isinstance(value, (list, tuple)):
        for item in value:
            yield from _ends_among(item, depth + 1)
    elif depth < 4 and isinstance(value, dict):
        for item in value.values():
            yield from _ends_among(item, depth + 1)


def _adopt_process_arguments(_token):
    """In a new multiprocessing child, before its target runs: take its ends over."""
    process = multiprocessing.current_process()
    arguments = (getattr(process, "_args", ()), getattr(process, "_kwargs", {}))
    for end in _ends_among(arguments):
        end.adopt()


class _AfterForkToken:
    """What register_after_fork keys the callback on (it must be weakly referenceable)."""


_after_fork_token = _AfterForkToken()


def register():
    """Registers the reductions with ForkingPickler and the 'fork' children's handover."""
    reduction.ForkingPickler.register(_ferry.Sender, _reduce_end)
    reduction.ForkingPickler.register(_ferry.Receiver, _reduce_end)
    reduction.ForkingPickler.register(_ferry.Tensor, _reduce_tensor)
    util.register_after_fork(_after_fork_token, _adopt_process_arguments)
