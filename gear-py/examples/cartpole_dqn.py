"""CartPole DQN on a shared GEAR table: actor processes write transitions,
a learner samples them with prioritized replay and updates priorities.

NumPy only: CartPole (the classic Barto, Sutton & Anderson dynamics, as in
Gymnasium's CartPole-v1: 500-step episodes, reward 1 per step) and a small
MLP Q-network with Adam and manual backprop are written out below, so the
example needs nothing but `gear` and NumPy.

    python gear-py/examples/cartpole_dqn.py                 # full run: until solved
    python gear-py/examples/cartpole_dqn.py --steps 4000 --check-loss-falls   # CI

The full run stops when the greedy policy's average return over 20
evaluation episodes reaches 195 (printed with the environment steps it
took), or after --steps environment steps (default 300000).

Runs are not reproducible step for step, even with the fixed seed:
environments, exploration and the network are seeded, but the actor
processes run freely, so which transitions the learner has drawn by a
given update depends on their timing. Measured spread: five runs of the
default (seed 0, 2 actors of 4 environments) on our 2-core machine solved
CartPole after 5,115, 5,121, 5,125, 5,125 and 9,125 environment steps
(the policy is evaluated every 2,000 updates, about 4,000 steps apart), in
7 to 19 s; a run on another machine under load needed 61,125.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from multiprocessing import shared_memory

import numpy as np

import gear

GAMMA = 0.99
HIDDEN = 64


class CartPole:
    """`n` CartPole-v1 environments stepped together."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.rng = np.random.default_rng(seed)
        self.state = self.rng.uniform(-0.05, 0.05, (n, 4))
        self.steps = np.zeros(n, np.int64)
        self.returns = np.zeros(n)

    def obs(self) -> np.ndarray:
        return self.state.astype(np.float32)

    def step(self, action: np.ndarray):
        """Returns (next obs, reward, terminated, finished-episode returns);
        finished environments are reset (the next obs returned is the
        terminal one, as a transition needs)."""
        x, x_dot, theta, theta_dot = self.state.T
        force = np.where(action == 1, 10.0, -10.0)
        cos, sin = np.cos(theta), np.sin(theta)
        total_mass, pole_mass_length, length = 1.1, 0.05, 0.5
        temp = (force + pole_mass_length * theta_dot**2 * sin) / total_mass
        theta_acc = (9.8 * sin - cos * temp) / (length * (4.0 / 3.0 - 0.1 * cos**2 / total_mass))
        x_acc = temp - pole_mass_length * theta_acc * cos / total_mass
        tau = 0.02
        x, x_dot = x + tau * x_dot, x_dot + tau * x_acc
        theta, theta_dot = theta + tau * theta_dot, theta_dot + tau * theta_acc
        self.state = np.stack([x, x_dot, theta, theta_dot], axis=1)
        self.steps += 1
        self.returns += 1.0
        terminated = (np.abs(x) > 2.4) | (np.abs(theta) > 12 * 2 * np.pi / 360)
        truncated = self.steps >= 500
        next_obs = self.obs()
        done = terminated | truncated
        finished = self.returns[done].copy()
        if done.any():
            self.state[done] = self.rng.uniform(-0.05, 0.05, (int(done.sum()), 4))
            self.steps[done] = 0
            self.returns[done] = 0.0
        return next_obs, np.ones(self.n, np.float32), terminated, finished


def init_params(rng: np.random.Generator) -> list:
    def layer(i, o):
        return [rng.normal(0, np.sqrt(2.0 / i), (i, o)).astype(np.float32), np.zeros(o, np.float32)]

    return layer(4, HIDDEN) + layer(HIDDEN, HIDDEN) + layer(HIDDEN, 2)


def q_values(p: list, x: np.ndarray):
    h1 = np.maximum(x @ p[0] + p[1], 0)
    h2 = np.maximum(h1 @ p[2] + p[3], 0)
    return h2 @ p[4] + p[5], (h1, h2)


def flat(p: list) -> np.ndarray:
    return np.concatenate([a.ravel() for a in p])


def unflat(v: np.ndarray, like: list) -> list:
    out, i = [], 0
    for a in like:
        out.append(v[i : i + a.size].reshape(a.shape))
        i += a.size
    return out


class Adam:
    def __init__(self, params: list, lr: float) -> None:
        self.lr, self.t = lr, 0
        self.m = [np.zeros_like(a) for a in params]
        self.v = [np.zeros_like(a) for a in params]

    def step(self, params: list, grads: list) -> None:
        self.t += 1
        for a, g, m, v in zip(params, grads, self.m, self.v):
            m *= 0.9
            m += 0.1 * g
            v *= 0.999
            v += 0.001 * g * g
            a -= self.lr * (m / (1 - 0.9**self.t)) / (np.sqrt(v / (1 - 0.999**self.t)) + 1e-8)


def train_step(p, target, opt, batch):
    """One double-DQN update (Huber loss, importance weights); returns the
    loss and the absolute TD errors."""
    obs, act = batch["obs"][:, 0], batch["action"][:, 0]
    rew, nxt, done = batch["reward"][:, 0], batch["next_obs"][:, 0], batch["done"][:, 0]
    q, (h1, h2) = q_values(p, obs)
    best = q_values(p, nxt)[0].argmax(1)
    q_next = q_values(target, nxt)[0][np.arange(len(best)), best]
    y = rew + GAMMA * (1.0 - done) * q_next
    rows = np.arange(len(act))
    td = q[rows, act] - y
    w = batch.weights.astype(np.float32)
    huber = np.where(np.abs(td) < 1, 0.5 * td**2, np.abs(td) - 0.5)
    loss = float((w * huber).mean())
    dq = np.zeros_like(q)
    dq[rows, act] = w * np.clip(td, -1, 1) / len(act)
    g5 = h2.T @ dq
    dh2 = (dq @ p[4].T) * (h2 > 0)
    g3 = h1.T @ dh2
    dh1 = (dh2 @ p[2].T) * (h1 > 0)
    g1 = obs.T @ dh1
    opt.step(p, [g1, dh1.sum(0), g3, dh2.sum(0), g5, dq.sum(0)])
    return loss, np.abs(td)


def actor(table_name: str, weights_name: str, shapes: list, seed: int, envs: int, steps: int, eps_steps: int) -> None:
    """Runs `envs` environments epsilon-greedily with the learner's latest
    weights, writing every transition; ends when the table closes."""
    table = gear.Table.attach(table_name)
    shm = shared_memory.SharedMemory(name=weights_name)
    like = [np.zeros(s, np.float32) for s in shapes]
    size = sum(a.size for a in like)
    weights = np.ndarray((size,), np.float32, buffer=shm.buf)
    env = CartPole(envs, seed)
    rng = np.random.default_rng(seed + 1000)
    writer = table.writer()
    obs = env.obs()
    try:
        while True:
            done_steps = table.inserts
            eps = max(0.05, 1.0 - done_steps / eps_steps)
            q = q_values(unflat(weights.copy(), like), obs)[0]
            action = np.where(rng.random(envs) < eps, rng.integers(0, 2, envs), q.argmax(1))
            nxt, rew, terminated, _ = env.step(action)
            writer.insert_batch({"obs": obs, "action": action.astype(np.int64), "reward": rew,
                                 "next_obs": nxt, "done": terminated.astype(np.float32)})
            obs = env.obs()
            if done_steps >= steps:
                break
    except gear.ClosedError:
        pass
    finally:
        del weights
        shm.close()


def evaluate(p: list, episodes: int, seed: int) -> float:
    env = CartPole(episodes, seed)
    alive = np.ones(episodes, bool)
    total = np.zeros(episodes)
    for _ in range(500):
        nxt, _, terminated, _ = env.step(q_values(p, env.obs())[0].argmax(1))
        total += alive
        alive &= ~terminated
        if not alive.any():
            break
    return float(total.mean())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300_000, help="environment steps at most")
    ap.add_argument("--actors", type=int, default=2, help="actor processes")
    ap.add_argument("--envs", type=int, default=4, help="environments per actor")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-loss-falls", action="store_true", help="exit 1 unless the TD loss falls (CI)")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    name = f"gear-cartpole-{os.getpid()}"
    batch_size, updates_per_insert = 64, 0.5
    table = gear.Table(
        [("obs", "float32", (4,)), ("action", "int64"), ("reward", "float32"), ("next_obs", "float32", (4,)),
         ("done", "float32")],
        max_len=1, capacity=50_000, sampler="prioritized", alpha=0.6, beta=0.4, name=name, seed=args.seed,
        # Learner and actors paced: 32 sampled rows per inserted transition.
        rate_limiter=gear.RateLimiter.sample_to_insert_ratio(batch_size * updates_per_insert, 1000, 4000.0),
    )
    params = init_params(rng)
    target = [a.copy() for a in params]
    opt = Adam(params, 5e-4)
    shm = shared_memory.SharedMemory(create=True, size=flat(params).nbytes)
    shared_weights = np.ndarray((flat(params).size,), np.float32, buffer=shm.buf)
    shared_weights[:] = flat(params)
    ctx = mp.get_context("spawn")
    shapes = [a.shape for a in params]
    eps_steps = max(1000, min(args.steps // 3, 20_000))
    procs = [ctx.Process(target=actor, args=(name, shm.name, shapes, args.seed + 10 * i, args.envs, args.steps, eps_steps))
             for i in range(args.actors)]
    for p in procs:
        p.start()
    sampler = table.sampler(batch_size=batch_size, window=1, timeout=60.0)
    sync_every, losses, updates, solved_at = 250, [], 0, None
    started = time.monotonic()
    try:
        while table.inserts < args.steps:
            batch = sampler.sample()
            loss, td = train_step(params, target, opt, batch)
            table.update_priorities(batch.keys, td + 1e-3)
            losses.append(loss)
            updates += 1
            if updates % sync_every == 0:
                target = [a.copy() for a in params]
            if updates % 20 == 0:
                shared_weights[:] = flat(params)
            if updates % 2000 == 0:
                steps = table.inserts
                score = evaluate(params, 20, args.seed + updates)
                print(f"steps {steps:7d}  updates {updates:6d}  loss {np.mean(losses[-2000:]):.4f}  "
                      f"greedy return {score:6.1f}  {time.monotonic() - started:5.1f}s", flush=True)
                if score >= 195 and not args.check_loss_falls:
                    solved_at = steps
                    break
    finally:
        table.close()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        del shared_weights
        shm.close()
        shm.unlink()
    failed = [p for p in procs if p.exitcode != 0]
    if failed:
        print(f"{len(failed)} actor processes failed", file=sys.stderr)
        return 1
    if solved_at is not None:
        print(f"solved: greedy average return >= 195 after {solved_at} environment steps")
    if args.check_loss_falls:
        # Within each target period the regression target is fixed, so
        # the loss must fall from the start of a period to its end.
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
