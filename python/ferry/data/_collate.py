"""torch's default_collate, writing each stacked tensor straight into ferry shared memory.

Contract: ``default_collate(batch)`` returns what ``torch.utils.data.default_collate`` returns
(same structure, types, dtypes, values: it is torch's ``collate`` with torch's table of element
functions, read when called), except that each tensor it stacks is written into a new block
of this process's ferry pool instead of a new torch shared-memory file. Sent to the trainer,
such a tensor travels as a handle; when the trainer drops it, the block returns to the pool.
Tensors ferry cannot hold (other devices, layouts or dtypes) are stacked by torch as usual.
"""

import torch
from torch.utils.data._utils import collate as _torch_collate

import ferry

_FERRY_DTYPES = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                 torch.bfloat16, torch.float32, torch.float64}


def _new_ferry_tensor(shape, dtype):
    """A torch tensor of `shape` and `dtype` viewing a new block of ferry shared memory."""
    if dtype is torch.bool:  # DLPack 0.6 has no bool: the block is made as bytes
        return torch.from_dlpack(ferry.empty(shape, "uint8")).view(torch.bool)
    return torch.from_dlpack(ferry.empty(shape, str(dtype)[len("torch."):]))


def collate_tensor_fn(batch, *, collate_fn_map=None):
    """torch.stack(batch) into ferry memory (torch's collate_tensor_fn, another destination)."""
    elem = batch[0]
    if elem.device.type != "cpu" or elem.layout != torch.strided or \
            (elem.dtype not in _FERRY_DTYPES and elem.dtype is not torch.bool):
        return torch.stack(batch, 0)
    out = _new_ferry_tensor((len(batch), *elem.shape), elem.dtype)
    return torch.stack(batch, 0, out=out)


def default_collate(batch):
    """torch.utils.data.default_collate, its stacked tensors written into ferry memory."""
    table = dict(_torch_collate.default_collate_fn_map)
    if table.get(torch.Tensor) is _torch_collate.collate_tensor_fn:  # unless the user replaced it
        table[torch.Tensor] = collate_tensor_fn
    return _torch_collate.collate(batch, collate_fn_map=table)
