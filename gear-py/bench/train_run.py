"""One pipeline of the end-to-end training benchmark, for one replay system
and one window length L: N actor processes writing synthetic Atari-like
episodes at full speed into the replay system, and a PyTorch learner in
this process sampling windows of L steps, training (or, model "0", only
receiving the batch as tensors) and updating priorities from the loss.
For each (model, batch) it is given, it warms up, then measures for a few
seconds and prints one JSON object on a line of its own.

gear-py/bench/train.py runs it in each system's own virtual environment
(``python train_run.py --system gear-local --window 128 --configs 0:32,S:32``).

Systems (each used as its documentation recommends; the pages are named
in docs/PERFORMANCE.md):

* ``gear-local``: a shared-memory ``gear.Table`` (prioritized, Reverb's
  samples-per-insert limiter); actors attach by name and insert whole
  episodes; the learner's sampler gathers windows at random starts
  straight into preallocated torch tensors (``sample_into``).
* ``gear-cluster``: three ``gear serve`` shards on loopback, each with the
  same sampler and limiter; actors write through ``gear.Cluster`` writers
  (round robin), the learner samples across the shards.
* ``reverb``: a ``reverb.Server`` in its own process (prioritized table,
  ``SampleToInsertRatio``); actors append each step to a
  ``TrajectoryWriter`` and create an item for every window of L steps
  every L/2 steps (Acme's sequence adder); the learner reads batches with
  ``Client.sample`` and stacks them into NumPy arrays.
* ``torchrl``: a ``ReplayBuffer`` over a ``LazyMemmapStorage`` in shared
  memory with a ``PrioritizedSliceSampler``; actors in other processes
  extend it with whole episodes (TorchRL's shared replay buffer).
* ``cpprb``: an ``MPPrioritizedReplayBuffer`` of transitions shared with
  the actor processes; the learner draws window starts by priority and
  gathers the L transitions after each.

TorchRL and cpprb have no rate limiter: the same samples-per-insert rule
(Reverb's) is kept for them by two shared counters.

Every learner puts its batches through one background thread (a queue
of one batch, as a prefetching data loader does), except Reverb's
dataset, which keeps two batches of samples in flight and one
prefetched, and GEAR's, whose samplers draw one batch ahead on their own
Rust threads and make its tensors there (``prefetch=1``,
``transform=...``); the GEAR cluster learner keeps two Sample calls in
flight, from two samplers. Every learner sends
its priority updates from another background thread, one update in flight
and the next waiting at most (Acme's R2D2 learner does the same with its
``AsyncExecutor``): the learner goes on with its next step while the
replay system applies the last one; the update share is the time the
learner waits for that queue.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import pathlib
import queue
import secrets
import signal
import statistics
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

EPISODE = 1000
"""Steps per episode."""

ACTIONS = 18
HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]


class Spec:
    """What every system of a run shares: shapes, sizes, the rate limit."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.obs_shape: Tuple[int, ...] = (84, 84) if args.obs == "frames" else (int(args.obs),)
        self.window: int = args.window
        self.actors: int = args.actors
        self.capacity: int = args.capacity  # episodes
        self.min_episodes: int = args.min_episodes
        self.replay_ratio: float = args.replay_ratio
        # Windows sampled per inserted episode, so that each inserted step
        # is sampled `replay_ratio` times on average.
        self.spi: float = args.replay_ratio * EPISODE / args.window
        # Slack of the limiter, in windows: `slack_episodes` episodes' worth.
        self.error_buffer: float = self.spi * args.slack_episodes
        self.seed: int = args.seed

    @property
    def step_bytes(self) -> int:
        return math.prod(self.obs_shape) + 8 + 4


# --- measuring CPU across processes ------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` (all its threads), from
    /proc; 0 for a process that is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command: state(0) ppid pgrp session tty tpgid flags minflt
    # cminflt majflt cmajflt utime(11) stime(12).
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def descendants(pid: int) -> List[int]:
    """Every live descendant of `pid` (spawned servers' own children too)."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class CpuMeter:
    """CPU seconds of this process and every process it started, by role."""

    def __init__(self, roles: Dict[int, str]) -> None:
        self.roles = roles

    def snapshot(self) -> Dict[int, float]:
        pids = {os.getpid(), *self.roles, *descendants(os.getpid())}
        return {p: cpu_seconds(p) for p in pids}

    def between(self, a: Dict[int, float], b: Dict[int, float]) -> Dict[str, float]:
        out: Dict[str, float] = {}
        for pid, end in b.items():
            role = "learner" if pid == os.getpid() else self.roles.get(pid, "other")
            out[role] = out.get(role, 0.0) + max(end - a.get(pid, 0.0), 0.0)
        return out


# --- the harness rate limiter (TorchRL, cpprb: they have none) ---------------


class SharedLimiter:
    """Reverb's samples-per-insert rule on two shared counters: an actor
    may insert an episode while ``inserts * spi - samples`` stays at most
    ``min_size * spi + error_buffer``; the learner may sample a batch once
    ``min_size`` episodes are in and while the difference stays at least
    ``min_size * spi - error_buffer``. (Checked then counted without one
    lock across processes: actors may overshoot by one episode each.)"""

    def __init__(self, ctx: Any, spec: Spec) -> None:
        self.inserted = ctx.Value("q", 0)
        self.sampled = ctx.Value("q", 0)
        self.spi = spec.spi
        self.min_size = spec.min_episodes
        self.max_diff = spec.min_episodes * spec.spi + spec.error_buffer
        self.min_diff = spec.min_episodes * spec.spi - spec.error_buffer

    def wait_insert(self) -> None:
        while (self.inserted.value + 1) * self.spi - self.sampled.value > self.max_diff:
            time.sleep(0.0005)

    def inserted_one(self) -> None:
        with self.inserted.get_lock():
            self.inserted.value += 1

    def wait_sample(self, rows: int) -> None:
        while (self.inserted.value < self.min_size
               or self.inserted.value * self.spi - (self.sampled.value + rows) < self.min_diff):
            time.sleep(0.0005)
        with self.sampled.get_lock():
            self.sampled.value += rows


# --- actors ------------------------------------------------------------------


class Episode:
    """One episode's steps, filled step by step by the actor's loop."""

    def __init__(self, shape: Tuple[int, ...]) -> None:
        self.obs = np.empty((EPISODE, *shape), np.uint8)
        self.action = np.empty(EPISODE, np.int64)
        self.reward = np.empty(EPISODE, np.float32)
        self.done = np.zeros(EPISODE, bool)
        self.done[-1] = True


def actor_main(system: str, handle: Any, spec: Spec, actor: int, steps: Any, lock: Any) -> None:
    """An actor process: a synthetic environment producing 1000-step
    episodes (frames drawn from a pool of random ones, random actions and
    rewards) at full speed, written step by step into the system's sink."""
    rng = np.random.default_rng(spec.seed * 1000 + actor)
    pool = rng.integers(0, 256, size=(64, *spec.obs_shape), dtype=np.uint8)
    sink = SINKS[system](handle, spec, actor)
    try:
        while True:
            actions = rng.integers(0, ACTIONS, EPISODE)
            rewards = rng.random(EPISODE, dtype=np.float32)
            first = int(rng.integers(0, 64))
            sink.begin()
            for t in range(EPISODE):
                sink.step(t, pool[(first + t) % 64], actions[t], rewards[t])
            sink.end()
            with lock:
                steps.value += EPISODE
    except KeyboardInterrupt:
        pass
    except Exception as e:  # a closed table or server at the end of the run
        if not getattr(sink, "closing", lambda e: False)(e):
            raise
        # Expected at the end of a run; said, so that one ending early is explained.
        print(f"train_run: actor {actor} stopped: {e!r}", file=sys.stderr, flush=True)


class BufferedSink:
    """Steps into an episode buffer; `flush` hands the episode over."""

    def __init__(self, spec: Spec) -> None:
        self.ep = Episode(spec.obs_shape)

    def begin(self) -> None:
        pass

    def step(self, t: int, obs: np.ndarray, action: int, reward: float) -> None:
        self.ep.obs[t] = obs
        self.ep.action[t] = action
        self.ep.reward[t] = reward


# --- GEAR, local ----------------------------------------------------------------


def gear_columns(spec: Spec) -> list:
    return [("obs", "uint8", spec.obs_shape), ("action", "int64"), ("reward", "float32")]


class GearLocal:
    """A shared-memory gear.Table: prioritized, Reverb's ratio limiter."""

    ctx = "spawn"
    # Its samplers draw ahead on their own threads (`GearSource`).
    own_prefetch = True

    def __init__(self, spec: Spec) -> None:
        import gear

        self.gear = gear
        self.spec = spec
        self.name = f"gear-train-bench-{os.getpid()}-{secrets.token_hex(4)}"
        self.table = gear.Table(
            gear_columns(spec), max_len=EPISODE, capacity=spec.capacity, sampler="prioritized",
            rate_limiter=gear.RateLimiter.sample_to_insert_ratio(spec.spi, spec.min_episodes, spec.error_buffer),
            name=self.name)
        self.roles: Dict[int, str] = {}

    def actor_handle(self) -> Any:
        return self.name

    def source(self, batch: int) -> "GearSource":
        return GearSource([self.table.sampler(batch, self.spec.window, random_start=True, timeout=60.0,
                                              **GearSource.PREFETCH)],
                          self.table.update_priorities)

    def close(self) -> None:
        self.table.close()


class GearItems(GearLocal):
    """R2D2-style per-window priorities (``gear-items``): the same shared
    table, whose items are the windows of L steps every L/2 steps of each
    episode (``ItemPattern.windows``; the episode stored once, windows
    overlapping), each with its own priority, sampled from their first
    step; the limiter counts items, with Reverb's per-item settings."""

    def __init__(self, spec: Spec) -> None:
        import gear

        self.gear = gear
        self.spec = spec
        self.name = f"gear-train-bench-{os.getpid()}-{secrets.token_hex(4)}"
        period, per_episode = reverb_items_per_episode(spec)
        pattern = gear.ItemPattern.windows(spec.window, period, tail=False)
        self.table = gear.Table(
            gear_columns(spec), max_len=EPISODE, capacity=spec.capacity, sampler="prioritized",
            rate_limiter=gear.RateLimiter.sample_to_insert_ratio(
                spec.spi / per_episode, spec.min_episodes * per_episode, spec.error_buffer),
            items_per_trajectory=pattern.count(EPISODE), item_pattern=pattern, name=self.name)
        self.roles: Dict[int, str] = {}

    def source(self, batch: int) -> "GearSource":
        return GearSource([self.table.sampler(batch, self.spec.window, offset=0, timeout=60.0,
                                              **GearSource.PREFETCH)],
                          self.table.update_priorities)


def gear_tensors(batch: Any) -> Tuple[Dict[str, Any], Any]:
    """A GEAR batch as the learner takes it: its columns and weights as
    torch tensors sharing the batch's buffer, and its keys (run by the
    samplers' prefetch threads, as the other systems' background threads
    make their tensors)."""
    from torch import from_numpy

    c = batch.columns
    return {"obs": from_numpy(c["obs"]), "action": from_numpy(c["action"]), "reward": from_numpy(c["reward"]),
            "weights": from_numpy(batch.weights)}, batch.keys


class GearSource:
    """Batches the samplers' own Rust threads draw ahead (``prefetch=1``:
    one batch ready and the next being drawn, the lookahead the harness's
    `Prefetch` gives the other systems) and make into tensors there
    (``transform=gear_tensors``), taken round robin over the samplers (the
    cluster keeps one Sample call in flight per sampler). Taking a ready
    batch runs no Python code and wakes no Python thread."""

    PREFETCH = dict(prefetch=1, transform=gear_tensors)

    def __init__(self, samplers: List[Any], update: Any) -> None:
        self.samplers = samplers
        self.update_fn = update
        self.turn = 0

    def next(self) -> Tuple[Dict[str, Any], Any]:
        sampler = self.samplers[self.turn]
        self.turn = (self.turn + 1) % len(self.samplers)
        return sampler.sample()

    def update(self, keys: Any, priorities: np.ndarray) -> None:
        self.update_fn(keys, priorities)

    def close(self) -> None:
        for s in self.samplers:
            s.close()


class GearSink(BufferedSink):
    """An actor's writer: whole episodes through ``insert_batch`` (one call
    and one copy into shared memory per episode)."""

    def __init__(self, handle: Any, spec: Spec, actor: int) -> None:
        import gear

        super().__init__(spec)
        self.gear = gear
        self.table = gear.Table.attach(handle)
        self.writer = self.table.writer()

    def end(self) -> None:
        e = self.ep
        self.writer.insert_batch({"obs": e.obs[None], "action": e.action[None], "reward": e.reward[None]},
                                 steps=EPISODE)

    def closing(self, e: Exception) -> bool:
        return isinstance(e, self.gear.ClosedError)


# --- GEAR, three shards -----------------------------------------------------------


def gear_bin() -> str:
    path = os.environ.get("GEAR_BIN") or str(REPO / "target/release/gear")
    if not os.path.exists(path):
        sys.exit(f"no gear binary at {path} (train.py builds one)")
    return path


class GearCluster:
    """Three `gear serve` shards on loopback through `gear.Cluster`; each
    shard prioritized with the ratio limiter for its third of the inserts."""

    ctx = "spawn"
    SHARDS = 3
    SAMPLE_CALLS_IN_FLIGHT = 2
    # Its samplers draw ahead on their own threads (`GearSource`).
    own_prefetch = True

    def __init__(self, spec: Spec) -> None:
        import gear
        from shards import start_shard

        self.spec = spec
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        # The pid in the name: train.py removes what a killed run left.
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix=f"gear-train-bench-{os.getpid()}-", dir=base))
        self.token = secrets.token_hex(16)
        self.procs: List[subprocess.Popen] = []
        addrs = []
        n = self.SHARDS
        capacity = -(-spec.capacity // n)
        min_size = max(1, -(-spec.min_episodes // n))
        columns = "".join(
            f'[[columns]]\nname = "{c}"\ndtype = "{d}"\nshape = {list(s) if isinstance(s, tuple) else []}\n'
            for c, d, *rest in gear_columns(spec) for s in [rest[0] if rest else ()])
        columns = columns.replace('"uint8"', '"u8"').replace('"int64"', '"i64"').replace('"float32"', '"f32"')
        try:
            for s in range(n):
                config = self.dir / f"shard{s}.toml"
                config.write_text(
                    f'name = "gear-train-bench-{os.getpid()}-{s}"\ndir = "{self.dir}"\nmax_len = {EPISODE}\n'
                    f"capacity = {capacity}\nseed = {spec.seed * 10 + s}\n{columns}"
                    f'[sampler]\nkind = "prioritized"\nalpha = 0.6\nbeta = 0.4\n'
                    f"[rate_limiter]\nmin_size_to_sample = {min_size}\nsamples_per_insert = {spec.spi}\n"
                    f"error_buffer = {spec.error_buffer / n}\n"
                    f'[grpc]\nlisten = "127.0.0.1:0"\nshard = {s}\n')
                p, addr = start_shard(gear_bin(), str(config), self.token)
                self.procs.append(p)
                if addr is not None:
                    addrs.append(addr)
            if len(addrs) != n:
                raise RuntimeError("a gear serve shard did not start")
        except BaseException:
            self.close()
            raise
        self.cluster = gear.Cluster(addrs, self.token, call_timeout=60.0)
        # The learner's priority updates go over connections of their own,
        # as a Reverb learner's do (`reverb.Client` beside its dataset's
        # sampler streams): on the sampling connections each small update
        # reply queued behind megabytes of windows.
        self.updates = gear.Cluster(addrs, self.token, call_timeout=60.0)
        self.roles = {p.pid: "server" for p in self.procs}

    def actor_handle(self) -> Any:
        return self.cluster

    def counters(self) -> Dict[str, int]:
        """Episodes the shards refused as held by their rate limiters, and
        rows of replies sent from table memory that were overwritten while
        sent (each such reply asked for again, gathered)."""
        info = self.updates.info()
        return {"held_inserts": sum(i.get("held_inserts", 0) for i in info),
                "rows_overwritten": sum(i.get("rows_overwritten", 0) for i in info)}

    def source(self, batch: int) -> "GearSource":
        # Each row's window starts at a random step, drawn by its shard.
        # Two Sample calls in flight, from two samplers' threads (Reverb's
        # dataset keeps two batches of samples in flight the same way,
        # `max_in_flight_samples_per_worker = 2 * batch`): the shards gather
        # the next batch while the learner's process receives this one.
        samplers = [self.cluster.sampler(batch, self.spec.window, random_start=True, timeout=60.0,
                                         **GearSource.PREFETCH)
                    for _ in range(self.SAMPLE_CALLS_IN_FLIGHT)]
        return GearSource(samplers, self.updates.update_priorities)

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class GearClusterSink(BufferedSink):
    """An actor's cluster writer: whole episodes, round robin over shards."""

    def __init__(self, handle: Any, spec: Spec, actor: int) -> None:
        super().__init__(spec)
        self.writer = handle.with_seed(actor + 1).writer("round_robin", timeout=None)

    def end(self) -> None:
        import gear

        e = self.ep
        while True:
            try:
                self.writer.insert_batch({"obs": e.obs[None], "action": e.action[None], "reward": e.reward[None]},
                                         steps=EPISODE)
                return
            except gear.TimeoutError as err:
                # A shard whose rate limiter holds the episode sends it back
                # after 100 ms and the writer tries the next shard (waiting
                # twice as long, up to 1.6 s), until the call's 60 s pass
                # with every shard holding it (nothing of it stored); with a slow model the limiters rightly hold actors
                # that long: try again, as a Reverb actor's blocked write
                # keeps waiting.
                if "rate limiter" not in str(err):
                    raise

    def closing(self, e: Exception) -> bool:
        import gear

        return isinstance(e, gear.GearError)


# --- DeepMind Reverb -----------------------------------------------------------------


def reverb_items_per_episode(spec: Spec) -> Tuple[int, int]:
    """(period, items per episode): an item for each window of L steps
    every L/2 steps, as Acme's SequenceAdder makes them."""
    period = max(1, spec.window // 2)
    return period, (EPISODE - spec.window) // period + 1


def reverb_server_main(spec: Spec, conn: Any) -> None:
    """The Reverb server's own process: a prioritized table with Reverb's
    SampleToInsertRatio limiter, in items (each item one window)."""
    import reverb

    _, per_episode = reverb_items_per_episode(spec)
    table = reverb.Table(
        name="replay",
        sampler=reverb.selectors.Prioritized(0.6),
        remover=reverb.selectors.Fifo(),
        max_size=spec.capacity * per_episode,
        # Per item: the same samples per inserted step as the others.
        rate_limiter=reverb.rate_limiters.SampleToInsertRatio(
            samples_per_insert=spec.spi / per_episode,
            min_size_to_sample=spec.min_episodes * per_episode,
            error_buffer=spec.error_buffer),
    )
    server = reverb.Server(tables=[table])
    conn.send(server.port)
    server.wait()


class Reverb:
    """A reverb.Server in its own process; TrajectoryWriter actors."""

    ctx = "spawn"
    client_sample = False

    def __init__(self, spec: Spec) -> None:
        import reverb

        self.spec = spec
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.server = ctx.Process(target=reverb_server_main, args=(spec, child), daemon=True)
        self.server.start()
        if not parent.poll(120):
            self.server.kill()
            raise RuntimeError("the reverb server did not start within 120 s")
        self.address = f"localhost:{parent.recv()}"
        self.client = reverb.Client(self.address)
        self.roles = {self.server.pid: "server"}

    def actor_handle(self) -> Any:
        return self.address

    @property
    def own_prefetch(self) -> bool:
        return not self.client_sample

    def source(self, batch: int) -> Any:
        if self.client_sample:
            return ReverbClientSource(self.client, batch)
        return ReverbDatasetSource(self.address, self.client, self.spec, batch)

    def close(self) -> None:
        self.server.kill()
        self.server.join()


class ReverbDatasetSource:
    """Reverb's recommended training input: a ``TrajectoryDataset``
    (``Client.sample``'s own docstring: "should NOT be used for real
    training"), batched and prefetched by tf.data, each batch handed to
    torch through NumPy; importance weights from the items' probabilities;
    ``mutate_priorities`` with the losses."""

    def __init__(self, address: str, client: Any, spec: Spec, batch: int, beta: float = 0.4) -> None:
        import reverb
        import tensorflow as tf

        L = spec.window
        ds = reverb.TrajectoryDataset(
            server_address=address, table="replay",
            dtypes={"action": tf.int64, "obs": tf.uint8, "reward": tf.float32},
            shapes={"action": tf.TensorShape([L]), "obs": tf.TensorShape([L, *spec.obs_shape]),
                    "reward": tf.TensorShape([L])},
            max_in_flight_samples_per_worker=2 * batch)
        self.it = ds.batch(batch, drop_remainder=True).prefetch(1).as_numpy_iterator()
        self.client = client
        self.beta = beta

    def next(self) -> Tuple[Dict[str, Any], Any]:
        import torch

        sample = next(self.it)
        cols = {k: torch.from_numpy(v) for k, v in sample.data.items()}
        p = sample.info.probability.astype(np.float64)
        w = (sample.info.table_size.astype(np.float64) * p) ** -self.beta
        cols["weights"] = torch.from_numpy(w / w.max())
        return cols, sample.info.key

    def update(self, keys: Any, priorities: np.ndarray) -> None:
        self.client.mutate_priorities("replay", updates=dict(zip(keys.tolist(), priorities.tolist())))


class ReverbClientSource:
    """``Client.sample`` of a batch of items, stacked into NumPy arrays
    (the ``reverb-client`` variant; put through the harness's prefetch
    thread)."""

    def __init__(self, client: Any, batch: int, beta: float = 0.4) -> None:
        self.client = client
        self.batch = batch
        self.beta = beta

    def next(self) -> Tuple[Dict[str, Any], Any]:
        import torch

        items = list(self.client.sample("replay", num_samples=self.batch, emit_timesteps=False))
        # A trajectory dict's columns are flattened in sorted key order.
        names = ("action", "obs", "reward")
        cols = {n: torch.from_numpy(np.stack([it.data[i] for it in items])) for i, n in enumerate(names)}
        keys = np.array([it.info.key for it in items], np.uint64)
        p = np.array([it.info.probability for it in items])
        w = (float(items[0].info.table_size) * p) ** -self.beta
        cols["weights"] = torch.from_numpy(w / w.max())
        return cols, keys

    def update(self, keys: Any, priorities: np.ndarray) -> None:
        self.client.mutate_priorities("replay", updates=dict(zip(keys.tolist(), priorities.tolist())))


class ReverbSink:
    """An actor's TrajectoryWriter: every step appended, an item of the
    last L steps created every L/2 steps (Acme's sequence adder with
    period L/2), the episode ended at its end."""

    def __init__(self, handle: Any, spec: Spec, actor: int) -> None:
        import reverb

        self.client = reverb.Client(handle)
        self.window = spec.window
        self.period, _ = reverb_items_per_episode(spec)
        self.writer = self.client.trajectory_writer(num_keep_alive_refs=spec.window)

    def begin(self) -> None:
        pass

    def step(self, t: int, obs: np.ndarray, action: int, reward: float) -> None:
        w = self.writer
        w.append({"obs": obs, "action": action, "reward": reward})
        if t + 1 >= self.window and (t + 1 - self.window) % self.period == 0:
            w.create_item("replay", priority=1.0,
                          trajectory={k: w.history[k][-self.window:] for k in ("action", "obs", "reward")})
            # As Acme's adders do: at most 25 items in flight (the legacy
            # Writer's default), else the writer warns and memory grows
            # while the rate limiter holds inserts back.
            w.flush(block_until_num_items=25)

    def end(self) -> None:
        self.writer.end_episode(clear_buffers=True)

    def closing(self, e: Exception) -> bool:
        return True  # the server was stopped at the end of the run


class ReverbClient(Reverb):
    """Reverb read with ``Client.sample`` instead of a dataset."""

    client_sample = True


# --- cpprb -----------------------------------------------------------------------


class Cpprb:
    """An MPPrioritizedReplayBuffer of transitions, shared with forked
    actors (cpprb's multi-process buffer)."""

    ctx = "fork"

    def __init__(self, spec: Spec) -> None:
        import cpprb

        self.spec = spec
        env = {
            "obs": {"shape": spec.obs_shape, "dtype": np.uint8},
            "act": {"dtype": np.int64},
            "rew": {"dtype": np.float32},
            # The step's place in its episode, to keep windows inside one.
            "t": {"dtype": np.int32},
        }
        ctx = mp.get_context("fork")
        self.rb = cpprb.MPPrioritizedReplayBuffer(spec.capacity * EPISODE, env, alpha=0.6, ctx=ctx)
        self.limiter = SharedLimiter(ctx, spec)
        self.roles: Dict[int, str] = {}

    def actor_handle(self) -> Any:
        return (self.rb, self.limiter)

    def source(self, batch: int) -> "CpprbSource":
        return CpprbSource(self.rb, self.limiter, batch, self.spec.window)

    def close(self) -> None:
        pass


class CpprbSource:
    """Window starts drawn by priority (``sample``), the windows' L
    transitions gathered from the buffer by index (cpprb's
    ``_encode_sample``, what ``sample`` itself calls)."""

    def __init__(self, rb: Any, limiter: "SharedLimiter", batch: int, window: int, beta: float = 0.4) -> None:
        self.rb, self.limiter, self.batch, self.window, self.beta = rb, limiter, batch, window, beta
        self.steps = np.arange(window)

    def next(self) -> Tuple[Dict[str, Any], Any]:
        import torch

        self.limiter.wait_sample(self.batch)
        s = self.rb.sample(self.batch, beta=self.beta)
        idx = s["indexes"].astype(np.int64)
        # Episodes are added whole and the capacity is a multiple of their
        # length, so each lies in one run of indexes: move a start that is
        # too late back so the window ends with its episode.
        start = idx - np.maximum(s["t"].ravel().astype(np.int64) + self.window - EPISODE, 0)
        w = self.rb._encode_sample((start[:, None] + self.steps).ravel())
        shape = (self.batch, self.window)
        out = {"obs": torch.from_numpy(w["obs"].reshape(*shape, *w["obs"].shape[1:])),
               "action": torch.from_numpy(w["act"].reshape(shape)),
               "reward": torch.from_numpy(w["rew"].reshape(shape)),
               "weights": torch.from_numpy(s["weights"].astype(np.float64))}
        return out, idx

    def update(self, idx: Any, priorities: np.ndarray) -> None:
        self.rb.update_priorities(idx, priorities)


class CpprbSink(BufferedSink):
    """An actor adding whole episodes (one ``add`` of 1000 transitions)."""

    def __init__(self, handle: Any, spec: Spec, actor: int) -> None:
        super().__init__(spec)
        self.rb, self.limiter = handle
        self.t = np.arange(EPISODE, dtype=np.int32)

    def end(self) -> None:
        self.limiter.wait_insert()
        e = self.ep
        self.rb.add(obs=e.obs, act=e.action, rew=e.reward, t=self.t)
        self.limiter.inserted_one()


# --- TorchRL -------------------------------------------------------------------------


class TorchRL:
    """A ``TensorDictReplayBuffer`` over a ``LazyTensorStorage`` of steps
    with a ``PrioritizedSliceSampler`` (slices of L steps of one episode,
    ``cache_values``), in the learner's process: a prioritized sampler
    cannot be shared between processes (TorchRL refuses to pickle it), so
    actors hand whole episodes over as TorchRL's multi-process collectors
    do, through shared-memory buffers (two per actor), and a thread of the
    learner's process extends the buffer with each."""

    ctx = "spawn"

    def __init__(self, spec: Spec) -> None:
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, PrioritizedSliceSampler, TensorDictReplayBuffer

        self.spec = spec
        steps = spec.capacity * EPISODE
        self.rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(steps),
            sampler=PrioritizedSliceSampler(max_capacity=steps, alpha=0.6, beta=0.4, slice_len=spec.window,
                                            traj_key="episode", cache_values=True, strict_length=True),
        )
        ctx = mp.get_context("spawn")
        self.limiter = SharedLimiter(ctx, spec)
        self.ready = ctx.Queue()
        self.buffers = []
        self.free = []
        for _ in range(spec.actors):
            pair = [TensorDict({"obs": torch.zeros((EPISODE, *spec.obs_shape), dtype=torch.uint8),
                                "action": torch.zeros(EPISODE, dtype=torch.int64),
                                "reward": torch.zeros(EPISODE, dtype=torch.float32),
                                "episode": torch.zeros(EPISODE, dtype=torch.int64)}, [EPISODE]).share_memory_()
                    for _ in range(2)]
            self.buffers.append(pair)
            self.free.append(ctx.Semaphore(2))
        self.next_actor = 0
        self.stop = threading.Event()
        self.ingest = threading.Thread(target=self.ingest_loop, daemon=True)
        self.ingest.start()
        self.roles: Dict[int, str] = {}

    def ingest_loop(self) -> None:
        while not self.stop.is_set():
            try:
                actor, slot = self.ready.get(timeout=0.1)
            except queue.Empty:
                continue
            self.rb.extend(self.buffers[actor][slot])
            self.free[actor].release()
            self.limiter.inserted_one()

    def actor_handle(self) -> Any:
        # Each actor takes its own pair of buffers, in start order.
        actor = self.next_actor
        self.next_actor += 1
        return (self.buffers[actor], self.free[actor], self.ready, self.limiter)

    def source(self, batch: int) -> "TorchRLSource":
        return TorchRLSource(self.rb, self.limiter, batch, self.spec.window)

    def close(self) -> None:
        self.stop.set()
        self.ingest.join(timeout=10)


class TorchRLSource:
    """``sample`` of B slices of L steps, reshaped to ``[B, L]``; priority
    updates of every step of each slice with the slice's loss."""

    def __init__(self, rb: Any, limiter: "SharedLimiter", batch: int, window: int) -> None:
        self.rb, self.limiter, self.batch, self.window = rb, limiter, batch, window

    def next(self) -> Tuple[Dict[str, Any], Any]:
        self.limiter.wait_sample(self.batch)
        td, info = self.rb.sample(self.batch * self.window, return_info=True)
        b, L = self.batch, self.window
        out = {"obs": td["obs"].view(b, L, *td["obs"].shape[1:]), "action": td["action"].view(b, L),
               "reward": td["reward"].view(b, L),
               "weights": info["priority_weight"].view(b, L)[:, 0].double()}
        return out, info["index"]

    def update(self, index: Any, priorities: np.ndarray) -> None:
        import torch

        self.rb.update_priority(index, torch.from_numpy(priorities).repeat_interleave(self.window).float())


class TorchRLSink:
    """An actor filling its shared-memory episode buffers step by step and
    queueing each full one for the learner's process to extend with."""

    def __init__(self, handle: Any, spec: Spec, actor: int) -> None:
        self.buffers, self.free, self.ready, self.limiter = handle
        self.views = [{k: td[k].numpy() for k in ("obs", "action", "reward", "episode")} for td in self.buffers]
        self.actor = actor
        self.slot = 0
        self.count = 0

    def begin(self) -> None:
        self.free.acquire()
        self.cur = self.views[self.slot]

    def step(self, t: int, obs: np.ndarray, action: int, reward: float) -> None:
        c = self.cur
        c["obs"][t] = obs
        c["action"][t] = action
        c["reward"][t] = reward

    def end(self) -> None:
        self.cur["episode"][:] = self.actor * 1_000_000 + self.count
        self.count += 1
        self.limiter.wait_insert()
        self.ready.put((self.actor, self.slot))
        self.slot ^= 1


# --- the learner -------------------------------------------------------------------


class Prefetch:
    """A background thread filling a queue of one batch."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.q: "queue.Queue[Any]" = queue.Queue(maxsize=1)
        self.stop = threading.Event()
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                item = self.source.next()
                while not self.stop.is_set():
                    try:
                        self.q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        pass
        except BaseException as e:  # handed to the learner
            self.error = e
            self.q.put(None)

    def next(self) -> Tuple[Dict[str, Any], Any]:
        item = self.q.get()
        if item is None:
            raise RuntimeError(f"sampling failed: {self.error!r}") from self.error
        return item

    def update(self, handle: Any, priorities: np.ndarray) -> None:
        self.source.update(handle, priorities)

    def close(self) -> None:
        self.stop.set()
        try:
            self.q.get_nowait()
        except queue.Empty:
            pass
        self.thread.join(timeout=30)


class AsyncUpdates:
    """Priority updates sent from one background thread, in order: `submit`
    waits only while an update is in flight and another is already queued;
    an update's error is raised by the next `submit` or by `close`."""

    def __init__(self, update: Any) -> None:
        self.update = update
        self.q: "queue.Queue[Any]" = queue.Queue(maxsize=1)
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            try:
                if self.error is None:
                    self.update(*item)
            except BaseException as e:  # handed to the learner
                self.error = e

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"updating priorities failed: {self.error!r}") from self.error

    def submit(self, handle: Any, priorities: np.ndarray) -> None:
        self.check()
        self.q.put((handle, priorities))

    def close(self) -> None:
        """Waits for the updates sent (at most 60 s); idempotent, never raises."""
        if self.thread.is_alive():
            self.q.put(None)
            self.thread.join(timeout=60)


def measure(system: Any, spec: Spec, model: str, batch: int, seconds: float, warmup: float,
            min_steps: int, steps_counter: Any, meter: CpuMeter, device: str = "host") -> Dict[str, Any]:
    """Trains (or only receives batches) for `seconds` after `warmup`;
    returns the figures of the timed part. With `device` other than
    "host" the model lives there and every batch is staged to it one step
    ahead (train_device.DeviceFeed); "host" trains on the batches where
    the replay system put them."""
    import torch

    staged = None
    if device != "host":
        from train_device import DeviceFeed, resolve

        staged = resolve(device)

    learner = None
    if model != "0":
        from train_model import Learner

        learner = Learner(model, spec.obs_shape, spec.window, seed=spec.seed, device=staged or "cpu")
    source = system.source(batch)
    if getattr(system, "own_prefetch", False):
        host_feed = source
    else:
        host_feed = Prefetch(source)
    feed = DeviceFeed(host_feed, staged) if staged is not None else host_feed
    updates = AsyncUpdates(feed.update)
    try:
        wait = update = released = 0.0
        waits: List[float] = []
        data = handle = None
        steps = 0
        timed = False
        t_begin = time.perf_counter()
        t_end = t_begin + warmup
        while True:
            now = time.perf_counter()
            if not timed and now >= t_end:
                timed = True
                wait = update = released = 0.0
                waits = []
                steps = 0
                t0, cpu0, ins0 = now, meter.snapshot(), steps_counter.value
                counted0 = system_counters(system)
                t_end = now + seconds
            elif timed and now >= t_end and steps >= min_steps:
                break
            # The previous batch is released before the wait is timed: the
            # wait is the time until the next batch is there, the same
            # queue.get for every system. (Releasing it inside the timed
            # `feed.next()` assignment counted 0.15 to 0.4% of a 270 ms
            # model-S step as waiting; timed apart: 0.01% waiting and 0.03 to
            # 0.07% releasing, for GEAR, TorchRL and cpprb alike.)
            a0 = time.perf_counter()
            data = handle = None
            a = time.perf_counter()
            released += a - a0
            data, handle = feed.next()
            b = time.perf_counter()
            if learner is not None:
                prio = learner.step(data["obs"], data["action"], data["reward"], data.get("mask"),
                                    data.get("weights"))
            else:
                prio = data["reward"].float().mean(1).abs()
            prio = prio.double().add_(1e-3).cpu().numpy()
            c = time.perf_counter()
            updates.submit(handle, prio)
            d = time.perf_counter()
            wait += b - a
            waits.append(b - a)
            update += d - c
            steps += 1
        wall = time.perf_counter() - t0
        cpu = meter.between(cpu0, meter.snapshot())
        inserted = steps_counter.value - ins0
        counted = {k: v - counted0.get(k, 0) for k, v in system_counters(system).items()}
        updates.close()
        updates.check()
    finally:
        updates.close()
        if feed is not host_feed:
            feed.close()
        if host_feed is not source:
            host_feed.close()
        if hasattr(source, "close"):
            source.close()
    total_cpu = sum(cpu.values())
    return {
        "model": model,
        "window": spec.window,
        "batch": batch,
        "parameters": learner.parameters if learner else 0,
        "steps": steps,
        "seconds": wall,
        "learner_steps_per_s": steps / wall,
        "windows_per_s": steps * batch / wall,
        "data_wait_share": wait / wall,
        # Per step: what the share averages (a few long waits or many short).
        "data_wait_median_us": statistics.median(waits) * 1e6 if waits else 0.0,
        "data_wait_max_us": max(waits, default=0.0) * 1e6,
        "update_share": update / wall,
        "release_share": released / wall,
        "actor_steps_per_s": inserted / wall,
        "actor_episodes_per_s": inserted / EPISODE / wall,
        "cpu_s_per_step": total_cpu / max(steps, 1),
        "cpu_share": {k: v / wall for k, v in sorted(cpu.items())},
        "torch_threads": torch.get_num_threads(),
        "device": device,
        # The replay system's own counters over the timed part (gear-cluster:
        # episodes a shard's rate limiter held past the writer's wait, 100 ms
        # to 1.6 s, and sent back, to go to the next shard).
        **counted,
    }


def system_counters(system: Any) -> Dict[str, int]:
    """The replay system's own counters now (`counters()`, where it has one)."""
    counters = getattr(system, "counters", None)
    return counters() if counters is not None else {}


SYSTEMS: Dict[str, Any] = {"gear-local": GearLocal, "gear-items": GearItems, "gear-cluster": GearCluster,
                           "reverb": Reverb,
                           "reverb-client": ReverbClient, "torchrl": TorchRL, "cpprb": Cpprb}
SINKS: Dict[str, Any] = {"gear-local": GearSink, "gear-items": GearSink, "gear-cluster": GearClusterSink,
                         "reverb": ReverbSink,
                         "reverb-client": ReverbSink, "torchrl": TorchRLSink, "cpprb": CpprbSink}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system", required=True, choices=sorted(SYSTEMS))
    ap.add_argument("--window", type=int, required=True, help="L, steps per sampled window")
    ap.add_argument("--configs", required=True, help="MODEL:BATCH,... (models 0, S, M)")
    ap.add_argument("--actors", type=int, default=4)
    ap.add_argument("--obs", default="frames", help="'frames' (84x84 u8) or a byte count (flat u8)")
    ap.add_argument("--capacity", type=int, default=64, help="episodes the replay holds")
    ap.add_argument("--min-episodes", type=int, default=4, help="episodes in before sampling starts")
    ap.add_argument("--replay-ratio", type=float, default=8.0, help="times each inserted step is sampled")
    ap.add_argument("--slack-episodes", type=float, default=8.0, help="the limiter's error buffer, in episodes")
    ap.add_argument("--seconds", type=float, default=5.0, help="timed part of each configuration")
    ap.add_argument("--warmup", type=float, default=1.5)
    ap.add_argument("--min-steps", type=int, default=2, help="timed learner steps at least")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--torch-threads", type=int, default=0,
                    help="the learner's torch intra-op threads (0: one per CPU core)")
    ap.add_argument("--device", default="host",
                    help="'host' (train where the batch lies) or a torch device (cuda, cuda:1, cpu): the model "
                         "there, batches staged to it one step ahead")
    args = ap.parse_args()
    configs = []
    for c in args.configs.split(","):
        model, _, batch = c.partition(":")
        if model not in ("0", "S", "M") or not batch.isdigit() or int(batch) < 1:
            ap.error(f"--configs: {c!r} is not MODEL:BATCH with MODEL 0, S or M")
        configs.append((model, int(batch)))
    # The largest model first: one pipeline's configurations share its
    # rate limiter, and a faster learner before a slower one would leave
    # the limiter's slack drained (the actors then owe it more than a
    # slower learner's run lasts), so the slower configuration would be
    # timed paying a debt it did not make; the other way round, a faster
    # learner spends the slack a slower one left in a fraction of its
    # warmup.
    configs.sort(key=lambda c: "0SM".index(c[0]), reverse=True)
    if args.torch_threads < 0:
        ap.error("--torch-threads must be 0 (one per core) or more")
    if args.window < 1 or args.window > EPISODE:
        ap.error(f"--window must be within 1..{EPISODE}")
    spec = Spec(args)
    sys.path.insert(0, str(HERE))
    # SIGTERM (train.py's timeout, a user's kill) ends the run as an error
    # would: the system closes (a GEAR table leaves /dev/shm, shards stop)
    # and the actors are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    system = SYSTEMS[args.system](spec)
    ctx = mp.get_context(system.ctx)
    steps = ctx.Value("q", 0, lock=False)
    lock = ctx.Lock()
    procs = [ctx.Process(target=actor_main, args=(args.system, system.actor_handle(), spec, i, steps, lock),
                         daemon=True) for i in range(args.actors)]
    try:
        for p in procs:
            p.start()
        roles = dict(system.roles)
        roles.update({p.pid: "actors" for p in procs})
        meter = CpuMeter(roles)
        import torch  # after the actors started: none of them forks a process that has torch's threads

        torch.set_num_threads(args.torch_threads or os.cpu_count() or 1)
        if args.device != "host":
            from train_device import resolve

            try:
                resolve(args.device)
            except ValueError as e:
                print(f"train_run: {e}", file=sys.stderr)
                return 2
        for model, batch in configs:
            out = measure(system, spec, model, batch, args.seconds, args.warmup, args.min_steps, steps, meter,
                          args.device)
            out.update(system=args.system, actors=args.actors, obs=list(spec.obs_shape),
                       replay_ratio=spec.replay_ratio)
            if not all(p.is_alive() for p in procs):
                raise RuntimeError(f"an actor died (exit codes {[p.exitcode for p in procs]})")
            print(json.dumps(out), flush=True)
    finally:
        system.close()
        # One deadline for all actors, not one each: the actors of systems
        # whose close does not reach them (cpprb's, TorchRL's: they wait on
        # the harness's limiter, which no learner moves any more) are
        # killed after it, so ending takes 5 s, not 5 s per actor.
        deadline = time.monotonic() + 5
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
