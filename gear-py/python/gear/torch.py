"""PyTorch adapters: batches as tensors (zero-copy through DLPack) and a
``torch.utils.data.IterableDataset`` over a table or a cluster.

Importing this module imports torch; ``import gear`` alone never does.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional, Sequence, Union

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from . import Batch, ClosedError, Cluster, Table


def cluster_key_words(keys: np.ndarray) -> np.ndarray:
    """Cluster keys (records of ``gear.CLUSTER_KEY_DTYPE``) as ``int64``
    words ``[shard, incarnation, slot << 32 | generation]``, shape
    ``[rows, 3]``: what ``Cluster.update_priorities`` takes back."""
    words = np.empty((len(keys), 3), np.uint64)
    words[:, 0] = keys["shard"]
    words[:, 1] = keys["incarnation"]
    words[:, 2] = (keys["slot"].astype(np.uint64) << np.uint64(32)) | keys["generation"]
    return words.view(np.int64)


def to_tensors(batch: Batch) -> Dict[str, torch.Tensor]:
    """Every column of ``batch`` as a CPU tensor sharing the batch's buffer
    (bf16 columns as ``torch.bfloat16``), plus ``keys``, ``lengths``,
    ``mask``, ``probabilities`` and ``weights``. ``keys`` are the int64
    bits of a local table's keys (shape ``[rows]``), or for a cluster
    batch ``[rows, 3]`` int64 words (:func:`cluster_key_words`); either
    goes back to ``update_priorities`` as it is."""
    out: Dict[str, torch.Tensor] = {}
    if batch.buffer is not None:
        for name in batch.columns:
            out[name] = torch.from_dlpack(batch.dlpack(name))
    else:
        for name, array in batch.columns.items():
            out[name] = torch.as_tensor(array)
    if batch.keys.dtype.names:
        out["keys"] = torch.from_numpy(cluster_key_words(batch.keys))
    else:
        out["keys"] = torch.from_numpy(batch.keys.view("int64"))
    out["lengths"] = torch.from_numpy(batch.lengths)
    out["mask"] = torch.from_numpy(batch.mask)
    out["probabilities"] = torch.from_numpy(batch.probabilities)
    out["weights"] = torch.from_numpy(batch.weights)
    return out


class ReplayDataset(IterableDataset):
    """Endless batches from a table or a cluster, as dicts of tensors (see
    :func:`to_tensors`). Use with ``DataLoader(dataset, batch_size=None)``:
    each item already is a batch. With ``num_workers > 0`` a table must be
    shared (created with ``name=...``): every worker attaches to it by name;
    a :class:`gear.Cluster` pickles as its configuration, so every worker
    opens its own connections (its row split seeded by the worker id).
    Each worker samples with its own sampler. Iteration ends when the
    table is closed.

    ``sampler_args`` are passed to ``sampler(...)`` of the table or cluster."""

    def __init__(self, source: Union[Table, Cluster], batch_size: int, window: Optional[int] = None,
                 *, columns: Optional[Sequence[str]] = None, timeout: Optional[float] = 10.0,
                 **sampler_args: Any) -> None:
        super().__init__()
        self._source: Optional[Union[Table, Cluster]] = source
        self._name = source.name if isinstance(source, Table) else None
        self._args = dict(batch_size=batch_size, window=window, columns=columns, timeout=timeout, **sampler_args)

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        if isinstance(self._source, Table):
            if self._name is None:
                raise TypeError("a DataLoader worker needs a shared table: create it with name=...")
            state["_source"] = None
        return state

    def _open(self) -> Union[Table, Cluster]:
        if self._source is None:
            self._source = Table.attach(self._name)
        return self._source

    def __iter__(self) -> Iterator[Dict[str, torch.Tensor]]:
        source = self._open()
        info = get_worker_info()
        if info is not None and isinstance(source, Cluster):
            # Workers' clusters were unpickled alike: give each its own split.
            source = source.with_seed(info.seed % 2**63)
        sampler = source.sampler(**self._args)
        while True:
            try:
                batch = sampler.sample()
            except ClosedError:
                return
            yield to_tensors(batch)
