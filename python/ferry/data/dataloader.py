"""ferry.data.DataLoader: torch's DataLoader whose worker batches cross processes as handles."""

from torch.utils.data import DataLoader as _TorchDataLoader

from ._iterator import FerryDataLoaderIter


class DataLoader(_TorchDataLoader):
    """``torch.utils.data.DataLoader`` with the same arguments and the same batches, in the
    same order, for the same dataset, sampler and generator.

    With ``num_workers > 0`` each worker collates a batch straight into ferry shared memory
    (memfds: nothing in ``/dev/shm``, no descriptor per tensor) and the trainer receives
    torch tensors viewing it, with no copy and no unpickling of tensor data; the blocks go
    back to the worker's pool when the trainer drops the batch. Workers die with the trainer.
    ``in_order=False`` yields batches as they arrive instead of in sampler order.
    With ``num_workers=0`` it is torch's loader, unchanged.
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=2, persistent_workers=False,
                 pin_memory_device="", in_order=True):
        super().__init__(dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                         batch_sampler=batch_sampler, num_workers=num_workers, collate_fn=collate_fn,
                         pin_memory=pin_memory, drop_last=drop_last, timeout=timeout,
                         worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
                         generator=generator, prefetch_factor=prefetch_factor,
                         persistent_workers=persistent_workers, pin_memory_device=pin_memory_device)
        self.in_order = bool(in_order)

    def _get_iterator(self):
        if self.num_workers == 0:
            return super()._get_iterator()
        self.check_worker_number_rationality()
        return FerryDataLoaderIter(self)

    def __iter__(self):
        if self.persistent_workers and self.num_workers > 0 and self._iterator is not None \
                and self._iterator.broken:
            self._iterator = None  # a worker died: the next epoch starts new ones
        return super().__iter__()
