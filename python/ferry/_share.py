"""ferry.share: moves a torch tensor or NumPy array into ferry's shared memory once."""

import warnings

from . import _ferry

__all__ = ["share"]


def _torch_share(tensor):
    import torch

    if tensor.device.type != "cpu":
        raise TypeError(
            f"ferry.share moves CPU tensors into shared memory; this tensor is on {tensor.device}: send a CPU "
            f"copy (tensor.cpu()) or keep it on the device")
    if tensor.numel() == 0 or _ferry._in_ferry_memory(tensor.data_ptr(), tensor.numel() * tensor.element_size()):
        return tensor
    from . import empty

    shared = torch.from_dlpack(empty(tuple(tensor.shape), tensor.dtype))
    with torch.no_grad():
        shared.copy_(tensor)
        tensor.set_(shared.storage(), 0, shared.shape, shared.stride())
    return tensor


def _numpy_share(array):
    import numpy

    if array.nbytes == 0 or _ferry._in_ferry_memory(array.__array_interface__["data"][0], array.nbytes):
        return array
    if not array.flags.c_contiguous:
        raise ValueError(
            "ferry.share moves C-contiguous NumPy arrays in place; make one with numpy.ascontiguousarray(array) and "
            "share that")
    if not array.flags.writeable:
        raise ValueError("ferry.share moves writable NumPy arrays; this one is read-only")
    from . import empty

    shared = numpy.asarray(empty(array.shape, array.dtype))
    shared[...] = array
    with warnings.catch_warnings():
        # NumPy's own way to point an array at other memory in place (deprecated as unsafe
        # in general; here the new memory has the same size, layout and dtype).
        warnings.simplefilter("ignore", DeprecationWarning)
        array.data = shared
    return array


def share(tensor):
    """Moves ``tensor`` (a torch tensor or NumPy array on the CPU heap) into ferry's shared
    memory, in place, as torch's ``share_memory_()`` does; returns the same object.

    Its elements are copied once; from then on sending it carries a handle to the shared
    memory (no copy), however often it is sent. A tensor already in ferry memory (received,
    made by ``ferry.empty``, or shared before) is returned as it is. Sending a tensor that
    was not shared copies it into shared memory on every send.

    torch: the tensor's storage is replaced (``Tensor.set_``); other tensors that viewed its
    old storage keep viewing the old memory, so share a tensor before taking views of it.
    NumPy: likewise (``ndarray.data`` is pointed at the new memory); the array must be
    C-contiguous and writable. A CUDA tensor is
    refused (``TypeError``): ferry shares CPU memory.
    """
    module = type(tensor).__module__
    if module.startswith("torch"):
        return _torch_share(tensor)
    if module == "numpy" and hasattr(tensor, "__array_interface__"):
        return _numpy_share(tensor)
    raise TypeError(f"ferry.share takes a torch tensor or a NumPy array, not {type(tensor).__name__}")
