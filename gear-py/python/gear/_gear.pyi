"""Type stubs of the extension module (gear._gear); import from ``gear``."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import builtins
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

class TimeoutError(GearError, builtins.TimeoutError):
    """A wait (rate limiter, empty table, table lock, a shard's answer) ran out."""

class StaleKeyError(GearError):
    """A key whose trajectory was evicted or replaced."""

class SpecError(GearError):
    """A table, column, sampler or rate-limiter configuration that cannot work."""

class StepError(GearError):
    """Step data or priorities that do not fit the table."""

class CheckpointError(GearError):
    """A checkpoint that cannot be restored (truncated, corrupted, another version or spec) or written."""

class ShardLostError(GearError):
    """No shard of a cluster could serve the call."""

class AuthError(GearError):
    """A shard refused the cluster token."""

class PartialInsertError(GearError):
    """An insert failed part way; ``committed`` lists ``(index, key)`` of every trajectory stored."""

    committed: List[Tuple[int, Any]]
    indices: npt.NDArray[np.int64]
    keys: np.ndarray

CLUSTER_KEY_DTYPE: np.dtype
"""Records of cluster keys: ``shard`` (u4), ``incarnation`` (u8), ``slot`` (u4), ``generation`` (u4)."""

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
        items_per_trajectory: int = 0,
        item_pattern: Optional[ItemPattern] = None,
    ) -> None: ...
    @staticmethod
    def restore(
        path: Union[str, os.PathLike[str]],
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
        items_per_trajectory: int = 0,
        item_pattern: Optional[ItemPattern] = None,
    ) -> Table:
        """A table as ``Table(...)`` makes it, filled from a checkpoint file or the newest in a directory."""
    def checkpoint(self, path: Union[str, os.PathLike[str]]) -> Dict[str, Any]:
        """Writes a checkpoint (atomic, fsynced); returns a report."""
    def checkpoint_into(self, dir: Union[str, os.PathLike[str]], keep: int = 3) -> Dict[str, Any]:
        """Writes the next numbered checkpoint into ``dir``, keeping the newest ``keep``."""
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
        prefetch: int = 0,
        transform: Optional[Callable[[Batch], Any]] = None,
    ) -> Sampler:
        """A sampler of ``batch_size`` rows of ``window`` steps; ``prefetch`` batches drawn ahead by a Rust
        thread, which applies ``transform`` to each."""
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
    def add_items(
        self, key: int, starts: ArrayLike, lengths: ArrayLike, priorities: Optional[ArrayLike] = None
    ) -> np.ndarray:
        """Adds items (windows with priorities) to a committed trajectory; returns their keys."""
    def add_pattern_items(self, key: int, pattern: ItemPattern, priority: Optional[float] = None) -> np.ndarray:
        """Adds the items ``pattern`` gives a committed trajectory's steps; returns their keys."""
    def items_of(self, key: int) -> Dict[str, np.ndarray]:
        """The live items of a stored trajectory: keys, starts, lengths, priorities, times_sampled."""
    def transition_sampler(
        self,
        batch_size: int,
        *,
        obs: Union[str, Sequence[str], None] = None,
        action: Union[str, Sequence[str], None] = None,
        reward: str = "reward",
        done: Optional[str] = None,
        frame_stack: int = 1,
        n_step: int = 1,
        gamma: float = 0.99,
        timeout: Optional[float] = 10.0,
    ) -> TransitionSampler:
        """A sampler of DQN transitions over this table's transition items."""
    @property
    def items_per_trajectory(self) -> int: ...
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

class ItemPattern:
    """Which items a trajectory's steps give (windows of it with priorities of their own)."""

    @staticmethod
    def whole() -> ItemPattern:
        """One item of all the trajectory's steps."""
    @staticmethod
    def none() -> ItemPattern:
        """No item."""
    @staticmethod
    def windows(length: int, stride: int, tail: bool = False) -> ItemPattern:
        """Windows of ``length`` steps every ``stride`` steps (with ``tail``, a shorter last one)."""
    @staticmethod
    def transitions(n_step: int = 1) -> ItemPattern:
        """One item ``[t, t + n_step]`` per step that has a next step (DQN)."""
    def count(self, steps: int) -> int:
        """How many items a trajectory of ``steps`` steps gets."""
    def windows_of(self, steps: int) -> List[Tuple[int, int]]:
        """``(start, length)`` of each item a trajectory of ``steps`` steps gets."""

class TransitionSampler:
    """Batches of DQN transitions over transition items: obs, next_obs, step columns, reward, done, discount."""

    def sample(self) -> Batch:
        """Draws one batch of transitions (no window axis)."""
    @property
    def batch_size(self) -> int: ...
    @property
    def frame_stack(self) -> int: ...
    def __iter__(self) -> Iterator[Batch]: ...
    def __next__(self) -> Batch: ...

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
    def add_item(self, start: int, length: int, priority: Optional[float] = None) -> int:
        """Adds an item over written steps; selectable when the trajectory ends. Returns its key."""
    def add_items(self, pattern: ItemPattern, priority: Optional[float] = None) -> np.ndarray:
        """Adds the items ``pattern`` gives the steps written so far; returns their keys."""
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
    lost: List[int]
    lost_reasons: Dict[int, str]
    rejoined: List[int]
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
        """Draws one batch into a buffer the batch owns (prefetching: the next one drawn ahead, or what
        ``transform`` made of it)."""
    def sample_into(self, out: Union[Mapping[str, Any], Sequence[Any]]) -> Batch:
        """Draws one batch into your arrays (or torch CPU tensors); needs ``prefetch=0``."""
    def output_spec(self) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
        """``{column: (numpy dtype name, shape)}`` for ``sample_into``."""
    def close(self) -> None:
        """Stops a prefetching sampler's thread; later samples raise."""
    @property
    def prefetch(self) -> int:
        """Batches drawn ahead (0: none)."""
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

class Cluster:
    """A sharded table served by ``gear serve`` processes, reached over gRPC; pickles as its configuration."""

    def __init__(
        self,
        shards: Sequence[str],
        token: Optional[str] = None,
        *,
        table: Optional[str] = None,
        call_timeout: float = 10.0,
        connect_timeout: float = 1.0,
        tls_ca: Optional[Union[str, os.PathLike[str]]] = None,
        tls_domain: Optional[str] = None,
        tls_cert: Optional[Union[str, os.PathLike[str]]] = None,
        tls_key: Optional[Union[str, os.PathLike[str]]] = None,
        mass_refresh: float = 0.1,
        free_space_refresh: float = 0.5,
        seed: int = 0,
        data_plane: str = "auto",
    ) -> None: ...
    @staticmethod
    def from_file(path: Union[str, os.PathLike[str]]) -> Cluster:
        """Opens the cluster a cluster file describes (as ``gear cluster-info`` reads it)."""
    def with_seed(self, seed: int) -> Cluster:
        """The same configuration with another seed, as a new connection."""
    def info(self) -> List[Dict[str, Any]]:
        """Every shard's counters (or ``error`` for a shard that did not answer)."""
    def update_priorities(self, keys: ArrayLike, priorities: ArrayLike) -> Tuple[int, int]:
        """Sets priorities by key, routed to each key's shard. Returns ``(applied, stale)``."""
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
        prefetch: int = 0,
        transform: Optional[Callable[[Batch], Any]] = None,
    ) -> ClusterSampler:
        """A sampler drawing across the shards with one table's distribution."""
    def writer(
        self, target: Union[str, int, None] = None, *, timeout: Optional[float] = None, chunk_steps: Optional[int] = None
    ) -> ClusterWriter:
        """A writer to ``"round_robin"``, ``"most_free"`` or one shard."""
    def __reduce__(self) -> Tuple[Any, Tuple[Dict[str, Any]]]: ...
    @property
    def shards(self) -> List[str]: ...
    @property
    def columns(self) -> List[Tuple[str, str, List[int]]]: ...
    @property
    def max_len(self) -> int: ...

class ClusterSampler:
    """Draws batches across a cluster's shards."""

    def sample(self) -> Batch:
        """One batch; ``batch.lost`` / ``batch.rejoined`` name shards left out or back."""
    def sample_into(self, out: Union[Mapping[str, Any], Sequence[Any]]) -> Batch:
        """One batch decoded straight into your arrays (or torch CPU tensors), reused batch after batch."""
    def output_spec(self) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
        """``{column: (numpy dtype name, shape)}`` for ``sample_into``."""
    def close(self) -> None:
        """Stops a prefetching sampler's thread; later samples raise."""
    @property
    def prefetch(self) -> int:
        """Batches drawn ahead (0: none)."""
    @property
    def batch_size(self) -> int: ...
    @property
    def window(self) -> int: ...
    @property
    def columns(self) -> List[str]: ...
    def __iter__(self) -> Iterator[Batch]: ...
    def __next__(self) -> Batch: ...

class ClusterWriter:
    """Writes to a cluster's shards."""

    def trajectory(self, priority: Optional[float] = None) -> ClusterTrajectory:
        """Starts a trajectory streamed to one shard in chunks."""
    def insert_batch(
        self,
        columns: Mapping[str, ArrayLike],
        priorities: Optional[ArrayLike] = None,
        steps: Optional[int] = None,
    ) -> np.ndarray:
        """Inserts ``count`` trajectories; returns their keys (``CLUSTER_KEY_DTYPE``)."""
    @property
    def chunk_steps(self) -> int: ...

class ClusterTrajectory:
    """A trajectory being streamed to a shard; a context manager."""

    def append(self, **columns: ArrayLike) -> None:
        """Appends one step: a value for every column."""
    def end(self, priority: Optional[float] = None) -> Any:
        """Commits the trajectory and returns its key."""
    def abandon(self) -> None:
        """Abandons it: the shard stores none of it."""
    @property
    def shard(self) -> Optional[int]: ...
    @property
    def closed(self) -> bool: ...
    def __len__(self) -> int: ...
    def __enter__(self) -> ClusterTrajectory: ...
    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool: ...

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
