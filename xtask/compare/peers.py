"""Peer replay buffers on GEAR-rs's `gear bench` workloads, for `cargo xtask compare`.

Prints one JSON object per line: {"peer", "workload", "insert_items_per_s",
"insert_gb_per_s", "sample_items_per_s", "sample_gb_per_s"}. The workloads
mirror `gear bench`'s: whole trajectories stored as one item each (sampled
by numpy fancy indexing, as cpprb users do), and 64-byte transitions added
256 per call (cpprb) or one per call (Reverb has no batched insert). Peers:
cpprb (`ReplayBuffer`, `PrioritizedReplayBuffer`) and DeepMind Reverb
(a `reverb.Server` in this process, written with a `TrajectoryWriter` and
sampled with `Client.sample`, each sampled item's columns stacked into
numpy batch arrays as a numpy trainer would). Reverb's Python loop per item
is slow, so its runs insert and sample fewer items (the figures are rates).
A peer whose package is missing is reported with an "error" field instead
of figures.
"""

import json
import sys
import time

import numpy as np


def workload(name):
    if name == "trajectories":
        # 128 steps x (4096 B obs + i32 action + f32 reward) = 513 KiB.
        return dict(steps=128, obs=4096, capacity=2048, inserts=4096, add_batch=1, batch=32, batches=400)
    if name == "trajectories-short":
        return dict(steps=128, obs=4096, capacity=2048, inserts=4096, add_batch=1, batch=32, batches=50)
    if name == "transitions":
        return dict(steps=1, obs=56, capacity=1_000_000, inserts=1_000_000, add_batch=256, batch=256, batches=20000)
    raise SystemExit(f"unknown workload {name}")


def cpprb_run(w, prioritized):
    import cpprb

    steps, obs = w["steps"], w["obs"]
    shape = (steps, obs) if steps > 1 else (obs,)
    scalar = (steps,) if steps > 1 else 1
    env = {
        "obs": {"shape": shape, "dtype": np.uint8},
        "action": {"shape": scalar, "dtype": np.int32},
        "reward": {"shape": scalar, "dtype": np.float32},
    }
    cls = cpprb.PrioritizedReplayBuffer if prioritized else cpprb.ReplayBuffer
    rb = cls(w["capacity"], env)
    k = w["add_batch"]
    item_bytes = steps * (obs + 8)
    o = np.random.randint(0, 255, size=(k,) + shape, dtype=np.uint8)
    a = np.zeros((k,) + ((steps,) if steps > 1 else ()), dtype=np.int32)
    r = np.zeros_like(a, dtype=np.float32)
    t = time.perf_counter()
    for _ in range(w["inserts"] // k):
        rb.add(obs=o, action=a, reward=r)
    insert_s = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(w["batches"]):
        b = rb.sample(w["batch"])
    sample_s = time.perf_counter() - t
    del b
    rows = w["batches"] * w["batch"]
    return {
        "insert_items_per_s": w["inserts"] / insert_s,
        "insert_gb_per_s": w["inserts"] * item_bytes / insert_s / 1e9,
        "sample_items_per_s": rows / sample_s,
        "sample_gb_per_s": rows * item_bytes / sample_s / 1e9,
    }


def reverb_run(w, prioritized):
    import reverb

    steps, obs = w["steps"], w["obs"]
    # Rates, not totals: a Python loop per item would take minutes on the
    # full counts.
    inserts = min(w["inserts"], 2048 if steps > 1 else 20_000)
    batches = min(w["batches"], 400 if steps > 1 else 40)
    sampler = reverb.selectors.Prioritized(0.6) if prioritized else reverb.selectors.Uniform()
    table = reverb.Table(
        name="t",
        sampler=sampler,
        remover=reverb.selectors.Fifo(),
        max_size=w["capacity"],
        rate_limiter=reverb.rate_limiters.MinSize(1),
    )
    server = reverb.Server(tables=[table])
    client = reverb.Client(f"localhost:{server.port}")
    shape = (steps, obs) if steps > 1 else (obs,)
    scalar = (steps,) if steps > 1 else ()
    step = {
        "obs": np.random.randint(0, 255, size=shape, dtype=np.uint8),
        "action": np.zeros(scalar, dtype=np.int32),
        "reward": np.zeros(scalar, dtype=np.float32),
    }
    item_bytes = steps * (obs + 8)
    t = time.perf_counter()
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        for _ in range(inserts):
            writer.append(step)
            writer.create_item("t", priority=1.0, trajectory={k: writer.history[k][-1] for k in step})
        writer.flush()
    insert_s = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(batches):
        items = list(client.sample("t", num_samples=w["batch"], emit_timesteps=False))
        columns = [np.stack([it.data[c] for it in items]) for c in range(len(items[0].data))]
    sample_s = time.perf_counter() - t
    del columns
    server.stop()
    rows = batches * w["batch"]
    return {
        "insert_items_per_s": inserts / insert_s,
        "insert_gb_per_s": inserts * item_bytes / insert_s / 1e9,
        "sample_items_per_s": rows / sample_s,
        "sample_gb_per_s": rows * item_bytes / sample_s / 1e9,
    }


def main():
    peer, name = sys.argv[1], sys.argv[2]
    w = workload(name)
    out = {"peer": peer, "workload": name}
    try:
        if peer == "cpprb-uniform":
            out.update(cpprb_run(w, False))
        elif peer == "cpprb-prioritized":
            out.update(cpprb_run(w, True))
        elif peer == "reverb-uniform":
            out.update(reverb_run(w, False))
        elif peer == "reverb-prioritized":
            out.update(reverb_run(w, True))
        else:
            raise SystemExit(f"unknown peer {peer}")
    except ImportError as e:
        out["error"] = f"not installed: {e}"
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
