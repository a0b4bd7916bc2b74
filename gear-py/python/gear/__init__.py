"""GEAR-rs: GPU-centric experience replay for reinforcement learning.

Tables of trajectories in host memory (process-private, or shared between
processes by name), written by actors and sampled by learners::

    import numpy as np, gear

    table = gear.Table([("obs", "float32", (4,)), ("action", "int64", ())],
                       max_len=100, capacity=10_000, sampler="prioritized")
    with table.writer().trajectory() as t:
        for step in range(10):
            t.append(obs=np.zeros(4, np.float32), action=1)
    batch = table.sampler(batch_size=32, window=8).sample()
    batch["obs"].shape      # (32, 8, 4): a view of the batch's buffer
    table.update_priorities(batch.keys, np.ones(32))

A cluster of shard servers (``gear serve`` processes) is used alike::

    cluster = gear.Cluster(["node0:50051", "node1:50051", "node2:50051"])  # token: $GEAR_TOKEN
    with cluster.writer("round_robin").trajectory() as t:   # streamed in chunks
        t.append(obs=np.zeros(4, np.float32), action=1)
    batch = cluster.sampler(batch_size=32, window=8).sample()  # batch.lost, batch.rejoined
    cluster.update_priorities(batch.keys, np.ones(32))

Ownership: each batch owns its buffer. Column arrays (and DLPack exports,
``batch.dlpack("obs")``) are views that keep it alive; a sampler reuses a
buffer only once nothing references it, so a view never changes under you.

The torch adapter lives in ``gear.torch`` (imported only when used).
"""

from ._gear import (
    CLUSTER_KEY_DTYPE,
    AuthError,
    Batch,
    BatchBuffer,
    CheckpointError,
    ClosedError,
    Cluster,
    ClusterSampler,
    ClusterTrajectory,
    ClusterWriter,
    DlpackColumn,
    GearError,
    PartialInsertError,
    RateLimiter,
    Sampler,
    ShardLostError,
    SpecError,
    StaleKeyError,
    StepError,
    Table,
    TimeoutError,
    Trajectory,
    Writer,
    export_hdf5,
    import_hdf5,
    sequence_priority,
)

try:  # wheels built with the `cuda` feature
    from ._gear import CudaSampler
except ImportError:
    pass

__all__ = [
    "CLUSTER_KEY_DTYPE",
    "AuthError",
    "Batch",
    "BatchBuffer",
    "CheckpointError",
    "ClosedError",
    "Cluster",
    "ClusterSampler",
    "ClusterTrajectory",
    "ClusterWriter",
    "DlpackColumn",
    "GearError",
    "PartialInsertError",
    "RateLimiter",
    "Sampler",
    "ShardLostError",
    "SpecError",
    "StaleKeyError",
    "StepError",
    "Table",
    "TimeoutError",
    "Trajectory",
    "Writer",
    "export_hdf5",
    "import_hdf5",
    "sequence_priority",
]
