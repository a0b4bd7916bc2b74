"""Reverb over the network, for docs/PERFORMANCE.md ("Beside Reverb over the
network"): a `reverb.Server` in a child process, this process writes 512 KiB
items with a TrajectoryWriter and samples 32-item batches with
`Client.sample` and with a `TrajectoryDataset`. Prints JSON lines (GB/s).

    target/reverb-venv/bin/python xtask/compare/reverb_remote.py client 1500 100

(`cargo xtask compare` makes target/reverb-venv.)
"""
import sys, time, json, subprocess, os
import numpy as np
mode = sys.argv[1]
STEPS, OBS = 128, 4096
if mode == "server":
    import reverb
    table = reverb.Table(name="t", sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(),
                         max_size=3072, rate_limiter=reverb.rate_limiters.MinSize(1))
    server = reverb.Server(tables=[table])
    print(server.port, flush=True)
    server.wait()
else:
    import reverb
    p = subprocess.Popen([sys.executable, __file__, "server"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
    except ValueError:
        p.kill()
    p.wait()
        raise SystemExit("the reverb server did not start")
    client = reverb.Client(f"localhost:{port}")
    inserts, batches, batch = int(sys.argv[2]), int(sys.argv[3]), 32
    step = {"obs": np.random.randint(0, 255, size=(STEPS, OBS), dtype=np.uint8)}
    t0 = time.perf_counter()
    with client.trajectory_writer(num_keep_alive_refs=1) as w:
        for _ in range(inserts):
            w.append(step)
            w.create_item("t", priority=1.0, trajectory={"obs": w.history["obs"][-1]})
        w.flush()
    insert_gbps = inserts * STEPS * OBS / (time.perf_counter() - t0) / 1e9
    # warm
    list(client.sample("t", num_samples=batch, emit_timesteps=False))
    c0 = os.times()
    t = time.perf_counter()
    for _ in range(batches):
        items = list(client.sample("t", num_samples=batch, emit_timesteps=False))
        obs = np.stack([it.data[0] for it in items])
    s = time.perf_counter() - t
    c1 = os.times()
    gb = batches * batch * STEPS * OBS / 1e9
    print(json.dumps({"reverb_insert_gb_per_s": insert_gbps, "reverb_client_sample_gb_per_s": gb / s, "client_cpu_s_per_gb": (c1.user + c1.system - c0.user - c0.system) / gb, "shape": list(obs.shape)}))
    sys.stdout.flush()
    # TF dataset path (what training loops use)
    import tensorflow as tf
    ds = reverb.TrajectoryDataset(server_address=f"localhost:{port}", table="t", dtypes={"obs": tf.uint8}, shapes={"obs": tf.TensorShape([STEPS, OBS])}, max_in_flight_samples_per_worker=64).batch(batch)
    it = iter(ds)
    next(it)
    t = time.perf_counter()
    for _ in range(batches):
        b = next(it)
        arr = b.data["obs"].numpy()
    s = time.perf_counter() - t
    print(json.dumps({"reverb_dataset_sample_gb_per_s": gb / s, "shape": list(arr.shape)}))
    p.kill()
    p.wait()
