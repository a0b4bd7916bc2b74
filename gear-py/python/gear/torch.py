"""PyTorch adapters: batches as tensors (zero-copy through DLPack) and a
``torch.utils.data.IterableDataset`` over a table.

Importing this module imports torch; ``import gear`` alone never does.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional, Sequence

import torch
from torch.utils.data import IterableDataset, get_worker_info

from . import Batch, ClosedError, Table


def to_tensors(batch: Batch) -> Dict[str, torch.Tensor]:
    """Every column of ``batch`` as a CPU tensor sharing the batch's buffer
    (bf16 columns as ``torch.bfloat16``), plus ``keys``, ``lengths``,
    ``mask``, ``probabilities`` and ``weights`` (``keys`` as int64 bits)."""
    out: Dict[str, torch.Tensor] = {}
    if batch.buffer is not None:
        for name in batch.columns:
            out[name] = torch.from_dlpack(batch.dlpack(name))
    else:
        for name, array in batch.columns.items():
            out[name] = torch.as_tensor(array)
    out["keys"] = torch.from_numpy(batch.keys.view("int64"))
    out["lengths"] = torch.from_numpy(batch.lengths)
    out["mask"] = torch.from_numpy(batch.mask)
    out["probabilities"] = torch.from_numpy(batch.probabilities)
    out["weights"] = torch.from_numpy(batch.weights)
    return out


class ReplayDataset(IterableDataset):
    """Endless batches from a table, as dicts of tensors (see
    :func:`to_tensors`). Use with ``DataLoader(dataset, batch_size=None)``:
    each item already is a batch. With ``num_workers > 0`` the table must
    be shared (created with ``name=...``): every worker attaches to it by
    name and samples with its own sampler. Iteration ends when the table
    is closed.

    ``sampler_args`` are passed to :meth:`gear.Table.sampler`."""

    def __init__(self, table: Table, batch_size: int, window: Optional[int] = None,
                 *, columns: Optional[Sequence[str]] = None, timeout: Optional[float] = 10.0,
                 **sampler_args: Any) -> None:
        super().__init__()
        self._table: Optional[Table] = table
        self._name = table.name
        self._args = dict(batch_size=batch_size, window=window, columns=columns, timeout=timeout, **sampler_args)

    def __getstate__(self) -> Dict[str, Any]:
        if self._name is None:
            raise TypeError("a DataLoader worker needs a shared table: create it with name=...")
        state = dict(self.__dict__)
        state["_table"] = None
        return state

    def _open(self) -> Table:
        if self._table is None:
            self._table = Table.attach(self._name)
        return self._table

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        table = self._open()
        sampler = table.sampler(**self._args)
        info = get_worker_info()
        del info  # each worker has its own sampler and random stream
        while True:
            try:
                batch = sampler.sample()
            except ClosedError:
                return
            yield to_tensors(batch)
