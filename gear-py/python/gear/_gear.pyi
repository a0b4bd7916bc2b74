"""Type stubs of the extension module (gear._gear); import from ``gear``."""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import os

import numpy as np
import numpy.typing as npt

DTypeLike = Union[str, type, np.dtype]
ColumnDef = Union[Tuple[str, DTypeLike], Tuple[str, DTypeLike, Union[int, Tuple[int, ...]]]]
ArrayLike = Any

class GearError(Exception):
    """Base class of every error GEAR raises."""

class ClosedError(GearError):
    """The table was closed."""

class TimeoutError(GearError):
    """A wait (rate limiter, empty table, table lock) ran out."""

class StaleKeyError(GearError):
    """A key whose trajectory was evicted or replaced."""

class SpecError(GearError):
    """A table, column, sampler or rate-limiter configuration that cannot work."""

class StepError(GearError):
    """Step data or priorities that do not fit the table."""

class RateLimiter:
    """How the table paces writers and samplers (Reverb's rate limiters)."""

    @staticmethod
    def min_size(min_size: int) -> RateLimiter:
        """Sampling waits until the table holds ``min_size`` trajectories."""
    @staticmethod
    def sample_to_insert_ratio(samples_per_insert: float, min_size_to_sample: int, error_buffer: float) -> RateLimiter:
        """Keep ``inserts * spi - samples`` within ``min_size * spi ± error_buffer``."""
    @staticmethod
    def queue(size: int) -> RateLimiter:
        """FIFO, each trajectory sampled once, writers wait when ``size`` are stored."""
    @staticmethod
    def stack(size: int) -> RateLimiter:
        """Like ``queue``, newest first."""

class Table:
    """A replay table, process-private or shared by name."""

    def __init__(
        self,
        columns: Sequence[ColumnDef],
        max_len: int,
        capacity: int,
        *,
        sampler: str = "uniform",
        remover: str = "fifo",
        alpha: float = 0.6,
        beta: float = 0.4,
        stratified: bool = True,
        max_times_sampled: Optional[int] = None,
        rate_limiter: Optional[RateLimiter] = None,
        name: Optional[str] = None,
        seed: int = 0,
        sample_while_writing: bool = False,
        collector_threads: Optional[int] = None,
    ) -> None: ...
    @staticmethod
    def attach(name: str, *, timeout: Optional[float] = 30.0, dir: Optional[str] = None) -> Table:
        """Attaches to the shared table ``name`` another process created."""
    def writer(self, timeout: Optional[float] = None) -> Writer:
        """A writer; ``timeout`` bounds rate-limiter waits (seconds)."""
    def sampler(
        self,
        batch_size: int,
        window: Optional[int] = None,
        *,
        offset: Optional[int] = None,
        pad: Optional[str] = None,
        columns: Optional[Sequence[str]] = None,
        timeout: Optional[float] = 10.0,
        random_start: bool = False,
    ) -> Sampler:
        """A sampler of ``batch_size`` rows of ``window`` steps."""
    def cuda_sampler(
        self,
        batch_size: int,
        window: Optional[int] = None,
        *,
        offset: Optional[int] = None,
        pad: Optional[str] = None,
        columns: Optional[Sequence[str]] = None,
        timeout: Optional[float] = 10.0,
        random_start: bool = False,
        device: int = 0,
        ring: int = 2,
    ) -> CudaSampler:
        """A sampler gathering on a CUDA device (wheels built with the ``cuda`` feature only)."""
    def update_priorities(self, keys: ArrayLike, priorities: ArrayLike) -> int:
        """Sets priorities by key; stale keys are ignored. Returns how many applied."""
    def info(self) -> Dict[str, Any]:
        """Counters and rate-limiter state; ``waiting`` lists the writers and samplers waiting now
        (any process): dicts of ``role``, ``reason``, ``pid``, ``waited_s``, ``since``."""
    def close(self) -> None:
        """Closes the table for every process."""
    def reclaim_dead(self) -> int:
        """Reclaims the slots of writers that died."""
    def __len__(self) -> int: ...
    def __reduce__(self) -> Tuple[Any, Tuple[str]]: ...
    @property
    def inserts(self) -> int:
        """Trajectories committed since creation (lock-free counter)."""
    @property
    def name(self) -> Optional[str]: ...
    @property
    def max_len(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def columns(self) -> List[Tuple[str, str, List[int]]]: ...

class Writer:
    """Hands out trajectories and inserts batches."""

    def trajectory(self, priority: Optional[float] = None) -> Trajectory:
        """Starts a trajectory (waits while the rate limiter holds writers back)."""
    def insert_batch(
        self,
        columns: Mapping[str, ArrayLike],
        priorities: Optional[ArrayLike] = None,
        steps: Optional[int] = None,
    ) -> npt.NDArray[np.uint64]:
        """Inserts ``count`` trajectories from ``[count, (steps,) *shape]`` arrays; returns their keys."""

class Trajectory:
    """A trajectory being written; a context manager."""

    def append(self, **columns: ArrayLike) -> None:
        """Appends one step: a value for every column."""
    def end(self, priority: Optional[float] = None) -> int:
        """Commits the trajectory and returns its key."""
    def abandon(self) -> None:
        """Gives the slot back."""
    @property
    def key(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def __len__(self) -> int: ...
    def __enter__(self) -> Trajectory: ...
    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool: ...

class BatchBuffer:
    """The memory of one batch; base object of its column arrays."""

    @property
    def address(self) -> int: ...
    @property
    def nbytes(self) -> int: ...

class DlpackColumn:
    """One column exported through DLPack."""

    def __dlpack__(
        self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: Optional[bool] = None
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...

class Batch:
    """One sampled batch; column arrays are views of its own buffer."""

    columns: Dict[str, np.ndarray]
    keys: npt.NDArray[np.uint64]
    lengths: npt.NDArray[np.int64]
    mask: npt.NDArray[np.bool_]
    probabilities: npt.NDArray[np.float64]
    weights: npt.NDArray[np.float64]
    starts: npt.NDArray[np.int64]
    buffer: Optional[BatchBuffer]
    @property
    def rows(self) -> int: ...
    @property
    def window(self) -> int: ...
    def __getitem__(self, name: str) -> np.ndarray: ...
    def __contains__(self, name: str) -> bool: ...
    def __len__(self) -> int: ...
    def dlpack(self, name: str) -> DlpackColumn:
        """Column ``name`` for ``torch.from_dlpack`` / ``np.from_dlpack``."""

class Sampler:
    """Draws batches of windows; one per thread."""

    def sample(self) -> Batch:
        """Draws one batch into a buffer the batch owns."""
    def sample_into(self, out: Union[Mapping[str, Any], Sequence[Any]]) -> Batch:
        """Draws one batch into your arrays (or torch CPU tensors)."""
    def output_spec(self) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
        """``{column: (numpy dtype name, shape)}`` for ``sample_into``."""
    @property
    def batch_size(self) -> int: ...
    @property
    def window(self) -> int: ...
    @property
    def columns(self) -> List[str]: ...
    def __iter__(self) -> Iterator[Batch]: ...
    def __next__(self) -> Batch: ...

class CudaSampler:
    """Draws batches into GPU memory (``cuda`` feature); columns are DLPack CUDA exports."""

    def sample(self) -> Batch:
        """Draws one batch; ``torch.from_dlpack(batch["obs"])`` is a CUDA tensor."""
    def __iter__(self) -> Iterator[Batch]: ...
    def __next__(self) -> Batch: ...

def sequence_priority(td_errors: ArrayLike, eta: float = 0.9) -> float:
    """R2D2 sequence priority: ``eta * max|d| + (1 - eta) * mean|d|``."""

def import_hdf5(
    table: Table,
    path: str | os.PathLike[str],
    layout: str | None = None,
    mapping: dict[str, str] | None = None,
    next_observations: str | None = None,
    split_long_episodes: bool = True,
) -> dict[str, Any]:
    """Imports an HDF5 file (D4RL or Minari layout) into ``table``; returns a report."""

def export_hdf5(
    table: Table,
    path: str | os.PathLike[str],
    layout: str = "d4rl",
    rename: dict[str, str] | None = None,
    deflate: int | None = None,
) -> dict[str, Any]:
    """Writes ``table``'s committed trajectories to an HDF5 file; returns a report."""
