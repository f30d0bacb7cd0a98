"""A batch as it crosses from a worker to the trainer (private).

Contract: ``encode(batch)`` returns ``(skeleton, tensors)``: ``skeleton`` is the batch pickled
with every CPU torch tensor and NumPy array of a dtype ferry carries replaced by a reference,
``tensors`` the list of those tensors (sent in one ferry message, so they travel as handles to
shared memory; a tensor already in ferry memory, as the default collate makes them, is not
copied, any other is copied once into shared memory by the send). ``decode(skeleton, tensors)``
rebuilds the batch in the trainer with each reference replaced by a torch tensor (or NumPy
array) viewing the received memory: the same structure, types, dtypes, shapes and values.
Everything else (strings, numbers, namedtuples, user classes) is pickled as torch does.
"""

import io
import pickle

import torch

try:
    import numpy
except ImportError:  # NumPy is optional, as for torch
    numpy = None

# dtypes whose tensors travel as ferry tensors. A bool tensor travels as its bytes (DLPack
# 0.6 has no bool) and is viewed as bool again in the trainer.
_TORCH_DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                 torch.float16, torch.bfloat16, torch.float32, torch.float64}
_NUMPY_KINDS = {"b1", "u1", "i1", "i2", "i4", "i8", "f2", "f4", "f8"}

# torch.from_dlpack asks the object for its device, then its capsule, through a Python
# wrapper: a few microseconds per tensor that a batch of many small tensors feels. A
# ferry.Tensor is always on the CPU, so its capsule goes straight to torch's converter.
_capsule_to_torch = getattr(torch._C, "_from_dlpack", torch.from_dlpack)


def _to_torch(tensor):
    return _capsule_to_torch(tensor.__dlpack__())


_TENSOR = 0
_BOOL_TENSOR = 1
_GRAD_TENSOR = 2
_ARRAY = 3


def _travels_as_ferry_tensor(tensor):
    return (tensor.device.type == "cpu" and tensor.layout == torch.strided and tensor.dtype in _TORCH_DTYPES
            and not tensor.is_conj() and not tensor.is_neg())


def _array_travels(array):
    code = array.dtype.str  # '<f4', '|u1': byte order, kind, size
    return code[0] in "<|" and code[1:] in _NUMPY_KINDS and all(s >= 0 for s in array.strides)


class _Pickler(pickle.Pickler):
    def __init__(self, file, tensors):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._tensors = tensors
        self._seen = {}  # id -> reference, so that an object named twice travels once

    def persistent_id(self, obj):
        kind = type(obj)
        if kind is torch.Tensor:
            if not _travels_as_ferry_tensor(obj):
                return None
            if obj.dtype is torch.bool:
                tag, sent = _BOOL_TENSOR, obj.detach().view(torch.uint8)
            elif obj.requires_grad:
                tag, sent = _GRAD_TENSOR, obj.detach()
            else:
                tag, sent = _TENSOR, obj
        elif numpy is not None and kind is numpy.ndarray:
            if not _array_travels(obj):
                return None
            tag, sent = _ARRAY, obj
        else:
            return None
        reference = self._seen.get(id(obj))
        if reference is None:
            reference = (tag, len(self._tensors))
            self._tensors.append(sent)
            self._seen[id(obj)] = reference
        return reference


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, tensors):
        super().__init__(file)
        self._tensors = tensors

    def persistent_load(self, reference):
        tag, index = reference
        tensor = self._tensors[index]
        if tag == _ARRAY:
            return numpy.asarray(tensor)
        result = _to_torch(tensor)
        if tag == _BOOL_TENSOR:
            return result.view(torch.bool)
        if tag == _GRAD_TENSOR:
            return result.requires_grad_()
        return result


def encode(batch):
    """(skeleton bytes, list of tensors to send) for `batch`."""
    if type(batch) is torch.Tensor and batch.dtype is not torch.bool and not batch.requires_grad \
            and _travels_as_ferry_tensor(batch):
        return None, [batch]  # the common single-tensor batch: no pickle at all
    tensors = []
    buffer = io.BytesIO()
    _Pickler(buffer, tensors).dump(batch)
    return buffer.getvalue(), tensors


def decode(skeleton, tensors):
    """The batch `encode` described, its tensors viewing the received `tensors`."""
    if skeleton is None:
        return _to_torch(tensors[0])
    return _Unpickler(io.BytesIO(skeleton), tensors).load()
