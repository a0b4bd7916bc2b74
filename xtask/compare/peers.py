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
    if name == "windows":
        # 32-step windows at random starts of 128-step trajectories.
        return dict(steps=128, obs=4096, capacity=2048, inserts=4096, add_batch=1, batch=32, batches=400, window=32)
    if name == "writers":
        # Two writer processes insert while this process samples.
        return dict(steps=128, obs=4096, capacity=2048, inserts=16384, add_batch=1, batch=32, batches=400, writers=2)
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
    window = w.get("window")
    t = time.perf_counter()
    for _ in range(w["batches"]):
        b = rb.sample(w["batch"])
        if window:
            b = cut_windows(b, window)
    sample_s = time.perf_counter() - t
    del b
    rows = w["batches"] * w["batch"]
    if window:
        item_bytes = window * (obs + 8)
    return {
        "insert_items_per_s": w["inserts"] / insert_s,
        "insert_gb_per_s": w["inserts"] * steps * (obs + 8) / insert_s / 1e9,
        "sample_items_per_s": rows / sample_s,
        "sample_gb_per_s": rows * item_bytes / sample_s / 1e9,
    }


def cut_windows(batch, window):
    """A `window`-step slice at a random start of each sampled trajectory
    (numpy fancy indexing, as a numpy trainer would cut sequences)."""
    cols = {k: v for k, v in batch.items() if k in ("obs", "action", "reward")}
    rows, steps = cols["obs"].shape[0], cols["obs"].shape[1]
    start = np.random.randint(0, steps - window + 1, size=rows)
    idx = start[:, None] + np.arange(window)[None, :]
    r = np.arange(rows)[:, None]
    return {k: v[r, idx] for k, v in cols.items()}


def writer_process(family, address, w, count, start, prioritized):
    """One writer process of the `writers` workload: waits for `start`, then
    inserts `count` trajectories; returns (first insert, last insert) times."""
    steps, obs = w["steps"], w["obs"]
    o = np.random.randint(0, 255, size=(steps, obs), dtype=np.uint8)
    a = np.zeros(steps, dtype=np.int32)
    r = np.zeros(steps, dtype=np.float32)
    while time.time() < start:
        time.sleep(0.001)
    t0 = time.time()
    if family == "cpprb":
        rb = address
        for _ in range(count):
            rb.add(obs=o[None], action=a[None], reward=r[None])
    else:
        import reverb

        client = reverb.Client(address)
        with client.trajectory_writer(num_keep_alive_refs=1) as writer:
            for _ in range(count):
                writer.append({"obs": o, "action": a, "reward": r})
                writer.create_item("t", priority=1.0, trajectory={k: writer.history[k][-1] for k in writer.history})
            writer.flush()
    return t0, time.time()


def writer_entry(family, address, w, count, start, prioritized, spans):
    """A writer process's entry point: reports its span on `spans`."""
    spans.put(writer_process(family, address, w, count, start, prioritized))


def writers_run(family, w, prioritized):
    """Two writer processes insert while this process samples (at least
    `batches` batches, and for as long as the writers run)."""
    import multiprocessing as mp

    # cpprb shares its buffer with forked children; gRPC (Reverb's client)
    # does not survive fork, so its writers are spawned.
    ctx = mp.get_context("fork" if family == "cpprb" else "spawn")
    steps, obs = w["steps"], w["obs"]
    env = {
        "obs": {"shape": (steps, obs), "dtype": np.uint8},
        "action": {"shape": (steps,), "dtype": np.int32},
        "reward": {"shape": (steps,), "dtype": np.float32},
    }
    server = None
    if family == "cpprb":
        import cpprb

        cls = cpprb.MPPrioritizedReplayBuffer if prioritized else cpprb.MPReplayBuffer
        rb = cls(w["capacity"], env, ctx=ctx)
        address = rb
        per_writer = w["inserts"] // w["writers"]

        def sample():
            return rb.sample(w["batch"])

        def size():
            return rb.get_stored_size()
    else:
        import reverb

        sampler = reverb.selectors.Prioritized(0.6) if prioritized else reverb.selectors.Uniform()
        table = reverb.Table(
            name="t",
            sampler=sampler,
            remover=reverb.selectors.Fifo(),
            max_size=w["capacity"],
            rate_limiter=reverb.rate_limiters.MinSize(1),
        )
        server = reverb.Server(tables=[table])
        address = f"localhost:{server.port}"
        client = reverb.Client(address)
        # Reverb's per-item Python path is slow: fewer items, rates alike.
        per_writer = min(w["inserts"] // w["writers"], 512)

        def sample():
            items = list(client.sample("t", num_samples=w["batch"], emit_timesteps=False))
            return [np.stack([it.data[c] for it in items]) for c in range(len(items[0].data))]

        def size():
            return client.server_info()["t"].current_size

    start = time.time() + 2.0
    spans = ctx.Queue()
    args = (family, address, w, per_writer, start, prioritized, spans)
    procs = [ctx.Process(target=writer_entry, args=args) for _ in range(w["writers"])]
    for proc in procs:
        proc.start()
    give_up = start + 120
    while time.time() < start or size() == 0:
        if time.time() > give_up or not any(proc.is_alive() for proc in procs):
            raise SystemExit("writers: nothing was inserted within 120 s")
        time.sleep(0.001)
    t = time.perf_counter()
    done = 0
    while done < w["batches"] or any(proc.is_alive() for proc in procs):
        sample()
        done += 1
    sample_s = time.perf_counter() - t
    for proc in procs:
        proc.join(timeout=60)
    if any(proc.exitcode != 0 for proc in procs):
        raise SystemExit(f"writers: a writer process failed ({[proc.exitcode for proc in procs]})")
    spans = [spans.get(timeout=10) for _ in procs]
    if server is not None:
        server.stop()
    wall = max(e for _, e in spans) - min(b for b, _ in spans)
    inserts = per_writer * w["writers"]
    item_bytes = steps * (obs + 8)
    return {
        "insert_items_per_s": inserts / wall,
        "insert_gb_per_s": inserts * item_bytes / wall / 1e9,
        "sample_items_per_s": done * w["batch"] / sample_s,
        "sample_gb_per_s": done * w["batch"] * item_bytes / sample_s / 1e9,
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
    window = w.get("window")
    names = sorted(step)
    for _ in range(batches):
        items = list(client.sample("t", num_samples=w["batch"], emit_timesteps=False))
        columns = {n: np.stack([it.data[c] for it in items]) for c, n in enumerate(names)}
        if window:
            columns = cut_windows(columns, window)
    sample_s = time.perf_counter() - t
    del columns
    server.stop()
    rows = batches * w["batch"]
    insert_gb = inserts * item_bytes / insert_s / 1e9
    if window:
        item_bytes = window * (obs + 8)
    return {
        "insert_items_per_s": inserts / insert_s,
        "insert_gb_per_s": insert_gb,
        "sample_items_per_s": rows / sample_s,
        "sample_gb_per_s": rows * item_bytes / sample_s / 1e9,
    }


def main():
    peer, name = sys.argv[1], sys.argv[2]
    w = workload(name)
    out = {"peer": peer, "workload": name}
    try:
        if name == "writers":
            family, strategy = peer.split("-", 1)
            out.update(writers_run(family, w, strategy == "prioritized"))
        elif peer == "cpprb-uniform":
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
