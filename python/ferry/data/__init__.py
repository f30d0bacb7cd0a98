"""ferry.data: torch's DataLoader with batches that cross processes as handles to shared memory.

``from ferry.data import DataLoader`` instead of ``from torch.utils.data import DataLoader``:
the same arguments, the same batches in the same order. Needs torch.
"""

from torch.utils.data import get_worker_info

from ._collate import default_collate
from .dataloader import DataLoader

__all__ = ["DataLoader", "default_collate", "get_worker_info"]
