"""How long a learner's take of the next batch lasts right after a model
step (issue 29's data wait, alone): GEAR's prefetching sampler
(``prefetch=1``, ``transform`` making the torch tensors on its thread, as
the training benchmark feeds GEAR) against a Python ``queue.Queue`` of one
batch filled by a thread (the training benchmark's ``Prefetch``, through
which TorchRL and cpprb are fed).

    target/gear-py-venv/bin/python gear-py/bench/handoff.py --steps 40 --source gear
    target/gear-py-venv/bin/python gear-py/bench/handoff.py --steps 40 --source queue

Each step trains the model-S transformer of ``train_model.py`` on the last
batch, then times the take of the next. ``--between sleep`` replaces the
model step by a sleep of the same length (no torch threads, no Python
running), ``--torch-threads`` sets torch's intra-op threads. One source
per process, so that neither's threads disturb the other's.

What it showed on the 2-core VM (docs/PERFORMANCE.md, "The take of a
prefetched batch after a model step"): before the prefetch thread ran as
a SCHED_BATCH thread, the take was 55-70 us in some processes and a few
ms in others (the woken prefetch thread preempted the learner on its
core); after, 20-24 us in every one, against the queue's 50-53.
"""

from __future__ import annotations

import argparse
import pathlib
import queue
import statistics
import sys
import threading
import time

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from train_model import Learner  # noqa: E402

EPISODE = 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", choices=["gear", "queue"], default="gear")
    p.add_argument("--steps", type=int, default=40, help="model steps, each followed by one timed take")
    p.add_argument("--window", type=int, default=32)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--obs-bytes", type=int, default=4096)
    p.add_argument("--between", choices=["model", "sleep"], default="model",
                   help="what runs between takes: a model-S step, or a sleep as long as one")
    p.add_argument("--torch-threads", type=int, default=0, help="0: torch's default")
    a = p.parse_args()
    if a.steps < 3 or a.window < 1 or a.batch < 1 or a.obs_bytes < 1:
        sys.exit("--steps must be at least 3, --window, --batch and --obs-bytes at least 1")
    if a.torch_threads:
        torch.set_num_threads(a.torch_threads)
    obs_shape = (a.obs_bytes,)
    batch_shape = (a.batch, a.window)

    def tensors(batch):
        c = batch.columns
        return {"obs": torch.from_numpy(c["obs"]), "action": torch.from_numpy(c["action"]),
                "reward": torch.from_numpy(c["reward"]), "weights": torch.from_numpy(batch.weights)}, batch.keys

    if a.source == "gear":
        import gear

        table = gear.Table([("obs", "uint8", obs_shape), ("action", "int64"), ("reward", "float32")],
                           max_len=EPISODE, capacity=16)
        writer = table.writer()
        for i in range(8):
            writer.insert_batch({"obs": np.full((1, EPISODE, *obs_shape), i, np.uint8),
                                 "action": np.zeros((1, EPISODE), np.int64),
                                 "reward": np.zeros((1, EPISODE), np.float32)}, steps=EPISODE)
        sampler = table.sampler(a.batch, a.window, offset=0, timeout=60.0, prefetch=1, transform=tensors)
        take = sampler.sample
        close = sampler.close
    else:
        filled: "queue.Queue" = queue.Queue(maxsize=1)
        obs = np.zeros((*batch_shape, *obs_shape), np.uint8)
        action = np.zeros(batch_shape, np.int64)
        reward = np.zeros(batch_shape, np.float32)

        def fill() -> None:
            while True:
                filled.put(({"obs": torch.from_numpy(obs.copy()), "action": torch.from_numpy(action.copy()),
                             "reward": torch.from_numpy(reward.copy()),
                             "weights": torch.ones(a.batch, dtype=torch.float64)}, None))

        threading.Thread(target=fill, daemon=True).start()
        take = filled.get
        close = None

    learner = Learner("S", obs_shape, a.window)
    data, handle = take()
    step_secs = []
    takes = []
    for _ in range(a.steps):
        s = time.perf_counter()
        if a.between == "model":
            learner.step(data["obs"], data["action"], data["reward"], None, data["weights"])
        else:
            time.sleep(statistics.median(step_secs) if step_secs else 0.07)
        step_secs.append(time.perf_counter() - s)
        # Both released before the take is timed, as train.py does.
        data = handle = None
        t = time.perf_counter()
        data, handle = take()
        takes.append(time.perf_counter() - t)
    if close is not None:
        close()
    timed = takes[2:]
    print(f"{a.source} ({a.between}, torch threads {torch.get_num_threads()}): step {statistics.median(step_secs) * 1e3:.1f} ms, "
          f"take median {statistics.median(timed) * 1e6:.1f} us, min {min(timed) * 1e6:.1f}, "
          f"max {max(timed) * 1e6:.1f}, over {len(timed)} takes")


if __name__ == "__main__":
    main()
