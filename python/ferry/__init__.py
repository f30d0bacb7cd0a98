"""ferry: typed messages between processes, and tensors that travel without copies.

A C++ loader and a Python trainer exchange messages of one type, ``ferry::Value`` in C++:
None, bool, int (64 bits), float, str, bytes, tensors, lists (tuples arrive as lists) and
dicts with str keys (insertion order kept). Tensors arrive as :class:`ferry.Tensor`;
``torch.from_dlpack(t)`` and ``numpy.asarray(t)`` view their memory without a copy.
"""

from ._ferry import (
    AddressInUse,
    ChannelClosed,
    Error,
    Listener,
    PeerDied,
    ProtocolError,
    Receiver,
    Sender,
    Tensor,
    TypeMismatch,
    UntrustedPeer,
    connect_duplex,
    connect_receiver,
    connect_sender,
    listen,
    _channel,
    _empty,
    _end_from_description,
)
from ._ferry import Broadcast, Distributor, Selector, SpawnError
from ._channels import Duplex, channel, duplex
from ._fanout import select
from ._introspection import disable_introspection, enable_introspection, introspection_enabled, snapshot
from ._share import share
from ._spawn import PerRank, WorkerFailed, WorkerGroup, per_rank, spawn

from ._ferry import __version__

__all__ = [
    "AddressInUse",
    "Broadcast",
    "Distributor",
    "Duplex",
    "PerRank",
    "Selector",
    "SpawnError",
    "WorkerFailed",
    "WorkerGroup",
    "channel",
    "duplex",
    "per_rank",
    "select",
    "share",
    "snapshot",
    "enable_introspection",
    "disable_introspection",
    "introspection_enabled",
    "spawn",
    "ChannelClosed",
    "Error",
    "Listener",
    "PeerDied",
    "ProtocolError",
    "Receiver",
    "Sender",
    "Tensor",
    "TypeMismatch",
    "UntrustedPeer",
    "connect_duplex",
    "connect_receiver",
    "connect_sender",
    "empty",
    "listen",
]


def _dtype_name(dtype):
    """ferry's name of `dtype`: a name ("float32"), a torch dtype or a NumPy dtype."""
    if isinstance(dtype, str):
        return dtype
    text = str(dtype)
    if text.startswith("torch."):
        return text[len("torch."):]
    name = getattr(dtype, "name", None)  # numpy.dtype
    if name is None and isinstance(dtype, type):
        name = dtype.__name__  # numpy.float32 and the like
    if name == "bool_":
        name = "bool"
    if isinstance(name, str):
        return name
    raise TypeError(f"ferry does not know the dtype {dtype!r}; use a name such as 'float32'")


def empty(shape, dtype="float32"):
    """A new tensor of `shape` in shared memory, its elements not initialised.

    Fill it (through ``torch.from_dlpack`` or ``numpy.asarray``) and send it: no byte is copied.
    """
    if isinstance(shape, int):
        shape = (shape,)
    return _empty(list(shape), _dtype_name(dtype))


# One process per end, and ends and tensors through multiprocessing (_reductions.py).
from ._ferry import EndOwnedElsewhere  # noqa: E402
from . import _reductions  # noqa: E402

_reductions.register()
__all__.append("EndOwnedElsewhere")
