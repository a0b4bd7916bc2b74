"""Sequence windows for a recurrent or transformer learner (R2D2-style),
each window with a priority of its own: an actor process writes whole
episodes online, step by step, into a shared table whose items are the
windows of `burn_in + unroll` steps every `unroll` steps of each episode
(`gear.ItemPattern.windows`, the shorter tail window included; R2D2's
80 every 40 with a burn-in of 40 is `windows(80, 40)`). Episodes are
stored once; the windows overlap by `burn_in` steps. The learner samples
windows by their priorities, uses the first `burn_in` steps only to warm
its state up and learns on the rest (masked where the tail window is
shorter), then sets each window's priority from its TD errors
(p = 0.9 max|d| + 0.1 mean|d|, `gear.sequence_priority`) by its item key.

The learner here is a linear TD(0) value function over a window of
observations, small enough for NumPy; the table side (episodes, random-start
windows, masks, burn-in, sequence priorities) is what an LSTM or
transformer learner uses unchanged.

    python gear-py/examples/r2d2_sequences.py            # 3000 updates
    python gear-py/examples/r2d2_sequences.py --updates 200   # CI
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys

import numpy as np

import gear
from cartpole_dqn import CartPole

BURN_IN, UNROLL, GAMMA = 8, 16, 0.97


def actor(name: str, seed: int) -> None:
    """Writes random-policy CartPole episodes until the table closes."""
    table = gear.Table.attach(name)
    writer = table.writer()
    env, rng = CartPole(1, seed), np.random.default_rng(seed)
    try:
        while True:
            with writer.trajectory() as episode:
                while True:
                    obs = env.obs()[0]
                    _, reward, terminated, _, finished = env.step(rng.integers(0, 2, 1))
                    episode.append(obs=obs, reward=reward[0], done=bool(terminated[0]))
                    if len(finished):
                        break
    except gear.ClosedError:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    name = f"gear-r2d2-{os.getpid()}"
    window = BURN_IN + UNROLL
    pattern = gear.ItemPattern.windows(window, UNROLL, tail=True)
    table = gear.Table([("obs", "float32", (4,)), ("reward", "float32"), ("done", "bool")],
                       max_len=500, capacity=2000, sampler="prioritized", alpha=0.9, beta=0.6, name=name,
                       seed=args.seed, rate_limiter=gear.RateLimiter.min_size(20),
                       items_per_trajectory=pattern.count(500), item_pattern=pattern)
    child = mp.get_context("spawn").Process(target=actor, args=(name, args.seed))
    child.start()
    # Each row is one window item from its first step (a tail window is
    # padded at its end and masked).
    sampler = table.sampler(batch_size=32, window=window, offset=0, timeout=60.0)
    windows_seen = set()
    weights, lr, losses = np.zeros(5), 0.01, []
    try:
        for update in range(1, args.updates + 1):
            batch = sampler.sample()
            obs = batch["obs"]                          # [32, 24, 4]
            feats = np.concatenate([obs, np.ones(obs.shape[:2] + (1,), np.float32)], axis=2)
            value = feats @ weights                     # a recurrent learner would run over the burn-in here
            train = slice(BURN_IN, window - 1)          # steps with a successor inside the window
            nxt = slice(BURN_IN + 1, window)
            mask = batch.mask[:, train] & batch.mask[:, nxt]
            not_done = ~batch["done"][:, train]
            td = batch["reward"][:, train] + GAMMA * not_done * value[:, nxt] - value[:, train]
            td = np.where(mask, td, 0.0)
            w = batch.weights[:, None]
            grad = -(w * td)[..., None] * feats[:, train]
            weights -= lr * grad.sum((0, 1)) / max(mask.sum(), 1)
            losses.append(float((w * td**2).sum() / max(mask.sum(), 1)))
            priorities = [gear.sequence_priority(td[r][mask[r]]) if mask[r].any() else 1e-3 for r in range(len(td))]
            applied = table.update_priorities(batch.keys, np.asarray(priorities) + 1e-3)
            windows_seen.update(int(k) for k in batch.keys)
            if update % 200 == 0:
                print(f"update {update:5d}  windows stored {len(table):5d}  td loss {np.mean(losses[-200:]):.4f}  "
                      f"masked steps {1 - batch.mask.mean():.2f}  priorities applied {applied}/32", flush=True)
    finally:
        table.close()
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
    print(f"{len(windows_seen)} distinct windows trained on, each with its own priority")
    return 0 if child.exitcode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
