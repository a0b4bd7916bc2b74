"""Peer replay buffers on GEAR-rs's `gear bench` workloads, for `cargo xtask compare`.

Prints one JSON object per line: {"peer", "workload", "insert_items_per_s",
"insert_gb_per_s", "sample_items_per_s", "sample_gb_per_s"}. The workloads
mirror `gear bench`'s: whole trajectories stored as one item each (sampled
by numpy fancy indexing, as cpprb users do), and 64-byte transitions added
256 per call. Only cpprb is measured here; a peer whose package is missing
is reported with an "error" field instead of figures.
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


def main():
    peer, name = sys.argv[1], sys.argv[2]
    w = workload(name)
    out = {"peer": peer, "workload": name}
    try:
        if peer == "cpprb-uniform":
            out.update(cpprb_run(w, False))
        elif peer == "cpprb-prioritized":
            out.update(cpprb_run(w, True))
        else:
            raise SystemExit(f"unknown peer {peer}")
    except ImportError as e:
        out["error"] = f"not installed: {e}"
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
