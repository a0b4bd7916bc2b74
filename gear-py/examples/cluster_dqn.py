"""CartPole DQN through a cluster: three `gear serve` shards, actor
processes writing transitions through `gear.Cluster` writers, a learner
sampling them across the shards with prioritized replay and updating
their priorities on the shards that hold them.

The same agent as cartpole_dqn.py (its environment, network and update
are imported from it); only the replay is remote.

    python gear-py/examples/cluster_dqn.py                      # starts 3 local shards, trains until solved
    python gear-py/examples/cluster_dqn.py --cluster cluster.toml   # an existing cluster (its file)
    python gear-py/examples/cluster_dqn.py --steps 4000 --check-loss-falls   # CI

Without --cluster the example starts three `gear serve` processes on
127.0.0.1 (the binary from $GEAR_BIN, else `gear` on PATH, else the
workspace's target/release or target/debug build), each with a
prioritized table of its own and a random cluster token, and stops them
at the end. With --cluster the shards' tables must have the columns
below (max_len 1) and a prioritized sampler.

Pacing: the shards' tables have no samples-per-insert limiter (across
shards a prioritized learner would wait on the busiest shard's); instead
the actors wait while they are more than 2,000 transitions ahead of 32
sampled rows per transition, the ratio cartpole_dqn.py's limiter keeps.
The full run stops when the greedy policy averages 195 over 20 episodes:
on our 2-core machine (debug build of the package, shards from a debug
`gear`) it did after 6,004 environment steps and 66 s, the local example's
bar (its runs: 5,115 to 9,125 steps). Runs differ as the local example's
do (actors run freely).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pathlib
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from multiprocessing import shared_memory

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cartpole_dqn import Adam, CartPole, evaluate, flat, init_params, q_values, train_step, unflat  # noqa: E402

import gear  # noqa: E402

COLUMNS = [("obs", "f32", [4]), ("action", "i64", []), ("reward", "f32", []), ("next_obs", "f32", [4]),
           ("done", "f32", [])]
BATCH = 64
ROWS_PER_INSERT = 32
AHEAD = 2000


def gear_binary() -> str:
    repo = pathlib.Path(__file__).resolve().parents[2]
    for candidate in (os.environ.get("GEAR_BIN"), shutil.which("gear"), repo / "target/release/gear",
                      repo / "target/debug/gear"):
        if candidate and os.path.exists(candidate):
            return str(candidate)
    sys.exit("no `gear` binary: build it (cargo build --release -p gear-cli) or set GEAR_BIN")


def start_shards(n: int, capacity: int, seed: int, workdir: pathlib.Path, token: str):
    """`n` gear serve processes on 127.0.0.1 (free ports); returns them and their addresses."""
    procs, addrs = [], []
    columns = "\n".join(f'[[columns]]\nname = "{c}"\ndtype = "{d}"\nshape = {s}' for c, d, s in COLUMNS)
    for shard in range(n):
        config = workdir / f"shard{shard}.toml"
        config.write_text(
            f'name = "cluster-dqn-{os.getpid()}-{shard}"\ndir = "{workdir}"\nmax_len = 1\ncapacity = {capacity}\n'
            f'seed = {seed + shard}\n{columns}\n[sampler]\nkind = "prioritized"\nalpha = 0.6\nbeta = 0.4\n'
            f'[rate_limiter]\nmin_size_to_sample = 100\n[grpc]\nlisten = "127.0.0.1:0"\nshard = {shard}\n')
        proc = subprocess.Popen([gear_binary(), "serve", "--config", str(config)], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=dict(os.environ, GEAR_TOKEN=token))
        procs.append(proc)
        deadline = time.monotonic() + 30
        for line in proc.stdout:
            if line.startswith("grpc listening on "):
                addrs.append(line.split()[3])
                break
            if time.monotonic() > deadline:
                break
        if len(addrs) != shard + 1:
            for p in procs:
                p.kill()
            sys.exit(f"shard {shard} did not start (gear serve --config {config})")
        # Keep reading its status lines so the pipe never fills.
        threading_drain(proc)
    return procs, addrs


def threading_drain(proc: subprocess.Popen) -> None:
    import threading

    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()


def actor(cluster: gear.Cluster, progress_name: str, weights_name: str, shapes: list, seed: int, envs: int,
          steps: int, eps_steps: int) -> None:
    """Runs `envs` environments epsilon-greedily with the learner's latest
    weights, writing every step's transitions through a round-robin cluster
    writer; paced against the learner's sampled rows."""
    progress_shm = shared_memory.SharedMemory(name=progress_name)
    progress = np.ndarray((3,), np.int64, buffer=progress_shm.buf)  # [inserts, sampled rows, stop]
    shm = shared_memory.SharedMemory(name=weights_name)
    like = [np.zeros(s, np.float32) for s in shapes]
    weights = np.ndarray((sum(a.size for a in like),), np.float32, buffer=shm.buf)
    env = CartPole(envs, seed)
    rng = np.random.default_rng(seed + 1000)
    writer = cluster.writer("round_robin")
    obs = env.obs()
    try:
        while not progress[2] and progress[0] < steps:
            inserted = int(progress[0])
            if inserted > 1000 and inserted * ROWS_PER_INSERT > progress[1] + AHEAD * ROWS_PER_INSERT:
                time.sleep(0.002)  # the learner is behind
                continue
            eps = max(0.05, 1.0 - inserted / eps_steps)
            q = q_values(unflat(weights.copy(), like), obs)[0]
            action = np.where(rng.random(envs) < eps, rng.integers(0, 2, envs), q.argmax(1))
            nxt, rew, terminated, _ = env.step(action)
            writer.insert_batch({"obs": obs, "action": action.astype(np.int64), "reward": rew, "next_obs": nxt,
                                 "done": terminated.astype(np.float32)})
            progress[0] += envs  # racy across actors by a few steps at most; only paces
            obs = env.obs()
    finally:
        del weights, progress
        shm.close()
        progress_shm.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", help="a cluster file (else three local shards are started)")
    ap.add_argument("--steps", type=int, default=300_000, help="environment steps at most")
    ap.add_argument("--actors", type=int, default=2, help="actor processes")
    ap.add_argument("--envs", type=int, default=4, help="environments per actor")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-loss-falls", action="store_true", help="exit 1 unless the TD loss falls (CI)")
    args = ap.parse_args()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="gear-cluster-dqn-"))
    servers = []
    try:
        if args.cluster:
            cluster = gear.Cluster.from_file(args.cluster)
        else:
            token = secrets.token_hex(16)
            servers, addrs = start_shards(3, 20_000, args.seed, workdir, token)
            print(f"3 shards on {', '.join(addrs)}", flush=True)
            cluster = gear.Cluster(addrs, token, seed=args.seed)
        return train(cluster, args)
    finally:
        for p in servers:
            p.terminate()
        for p in servers:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(workdir, ignore_errors=True)


def train(cluster: gear.Cluster, args) -> int:
    rng = np.random.default_rng(args.seed)
    params = init_params(rng)
    target = [a.copy() for a in params]
    opt = Adam(params, 5e-4)
    shm = shared_memory.SharedMemory(create=True, size=flat(params).nbytes)
    shared_weights = np.ndarray((flat(params).size,), np.float32, buffer=shm.buf)
    shared_weights[:] = flat(params)
    progress_shm = shared_memory.SharedMemory(create=True, size=3 * 8)
    progress = np.ndarray((3,), np.int64, buffer=progress_shm.buf)
    progress[:] = 0
    ctx = mp.get_context("spawn")
    shapes = [a.shape for a in params]
    eps_steps = max(1000, min(args.steps // 3, 20_000))
    # The Cluster pickles as its configuration: each actor opens its own connections.
    procs = [ctx.Process(target=actor, args=(cluster, progress_shm.name, shm.name, shapes, args.seed + 10 * i,
                                             args.envs, args.steps, eps_steps)) for i in range(args.actors)]
    for p in procs:
        p.start()
    sampler = cluster.sampler(batch_size=BATCH, window=1, timeout=60.0)
    sync_every, losses, updates, solved_at, lost = 250, [], 0, None, set()
    started = time.monotonic()
    try:
        while progress[0] < args.steps:
            if progress[0] < 1000:
                time.sleep(0.01)
                continue
            if updates * BATCH > progress[0] * ROWS_PER_INSERT:
                time.sleep(0.001)  # the actors are behind
                continue
            batch = sampler.sample()
            lost |= set(batch.lost)
            loss, td = train_step(params, target, opt, batch)
            cluster.update_priorities(batch.keys, td + 1e-3)
            losses.append(loss)
            updates += 1
            progress[1] = updates * BATCH
            if updates % sync_every == 0:
                target = [a.copy() for a in params]
            if updates % 20 == 0:
                shared_weights[:] = flat(params)
            if updates % 2000 == 0:
                steps = int(progress[0])
                score = evaluate(params, 20, args.seed + updates)
                print(f"steps {steps:7d}  updates {updates:6d}  loss {np.mean(losses[-2000:]):.4f}  "
                      f"greedy return {score:6.1f}  {time.monotonic() - started:5.1f}s", flush=True)
                if score >= 195 and not args.check_loss_falls:
                    solved_at = steps
                    break
    finally:
        progress[2] = 1
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        del shared_weights, progress
        shm.close()
        shm.unlink()
        progress_shm.close()
        progress_shm.unlink()
    sizes = [i.get("size") for i in cluster.info()]
    print(f"shards hold {sizes} transitions; shards ever lost: {sorted(lost) or 'none'}")
    failed = [p for p in procs if p.exitcode != 0]
    if failed:
        print(f"{len(failed)} actor processes failed", file=sys.stderr)
        return 1
    if solved_at is not None:
        print(f"solved: greedy average return >= 195 after {solved_at} environment steps")
    if args.check_loss_falls:
        periods = np.array(losses[: len(losses) // sync_every * sync_every]).reshape(-1, sync_every)
        if len(periods) < 2:
            print(f"too few updates ({len(losses)}) to judge the loss", file=sys.stderr)
            return 1
        early, late = periods[:, :50].mean(), periods[:, -50:].mean()
        print(f"{updates} updates; loss at the start of target periods {early:.4f}, at their end {late:.4f}")
        if not late < early:
            print("the loss did not fall", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
