"""The Python package against the Rust `gear bench`, on the same
workloads, measured side by side in one run (alternating Rust and Python
rounds, medians reported), so that a shared machine's load falls on both:

* cluster sampling: three `gear serve` shards on loopback, whole
  trajectories of 128 steps x 4 KiB, batches of 32 (Rust: `gear bench
  --shards 3`; Python: `gear.Cluster(...).sampler(32).sample()`);
* cluster inserts of 64-byte one-step transitions, 48 per call (16 per
  shard, as `gear bench --shards 3` sends them; Python:
  `cluster.writer("round_robin").insert_batch`);
* cluster inserts of whole 128 x 4 KiB trajectories (the same);
* a local table, `gear bench`'s default workload (128 x 4 KiB
  trajectories, batch 32): inserts (Python `insert_batch(steps=128)`, 16
  trajectories a call) and sampling (`sample()` and `sample_into()`).

Run through gear-py/bench/run.sh, which builds both sides in release mode.
Prints a table and, with --json, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import gear
from shards import start_shard

REPO = pathlib.Path(__file__).resolve().parents[2]


def gear_bin() -> str:
    path = os.environ.get("GEAR_BIN") or str(REPO / "target/release/gear")
    if not os.path.exists(path):
        sys.exit(f"no gear binary at {path}: run gear-py/bench/run.sh (it builds one)")
    return path


def rust_bench(*args: str) -> dict:
    out = subprocess.run([gear_bin(), "bench", "--json", *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


class Shards:
    """Three `gear serve` processes on loopback, as `gear bench --shards 3` starts them."""

    def __init__(self, steps: int, step_bytes: int, capacity: int, n: int = 3):
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="gear-py-bench-", dir=base))
        self.token = secrets.token_hex(16)
        self.procs, self.addrs = [], []
        for s in range(n):
            config = self.dir / f"shard{s}.toml"
            config.write_text(f'name = "gear-py-bench-{os.getpid()}-{s}"\ndir = "{self.dir}"\nmax_len = {steps}\n'
                              f'capacity = {capacity}\n[[columns]]\nname = "obs"\ndtype = "u8"\n'
                              f'shape = [{step_bytes}]\n[grpc]\nlisten = "127.0.0.1:0"\nshard = {s}\n')
            p, addr = start_shard(gear_bin(), str(config), self.token)
            self.procs.append(p)
            if addr is not None:
                self.addrs.append(addr)
        if len(self.addrs) != n:
            self.close()
            sys.exit("a shard server did not start")

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def py_cluster_trajectories(inserts: int, batches: int) -> dict:
    """Python through gear.Cluster: whole 128 x 4 KiB trajectories in and out."""
    steps, step_bytes = 128, 4096
    shards = Shards(steps, step_bytes, capacity=2048)
    try:
        cluster = gear.Cluster(shards.addrs, shards.token)
        one = (np.arange(steps * step_bytes) % 251).astype(np.uint8).reshape(1, steps, step_bytes)
        per_call = 48
        block = {"obs": np.repeat(one, per_call, axis=0)}
        writer = cluster.writer("round_robin")
        t0 = time.perf_counter()
        done = 0
        while done < inserts:
            writer.insert_batch(block, steps=steps)
            done += per_call
        insert_s = time.perf_counter() - t0
        sampler = cluster.sampler(32)
        sampler.sample()
        t0 = time.perf_counter()
        for _ in range(batches):
            b = sampler.sample()
        sample_s = time.perf_counter() - t0
        assert b["obs"].shape == (32, steps, step_bytes)
        batch_bytes = 32 * steps * step_bytes
        return {"insert_traj_per_s": done / insert_s, "insert_gb_per_s": done * steps * step_bytes / insert_s / 1e9,
                "sample_gb_per_s": batches * batch_bytes / sample_s / 1e9}
    finally:
        shards.close()


def py_cluster_transitions(inserts: int) -> dict:
    """Python through gear.Cluster: 64-byte one-step transitions, 48 per call."""
    shards = Shards(1, 64, capacity=65536)
    try:
        cluster = gear.Cluster(shards.addrs, shards.token)
        per_call = 48
        block = {"obs": (np.arange(per_call * 64) % 251).astype(np.uint8).reshape(per_call, 64)}
        writer = cluster.writer("round_robin")
        writer.insert_batch(block)
        t0 = time.perf_counter()
        done = 0
        while done < inserts:
            writer.insert_batch(block)
            done += per_call
        secs = time.perf_counter() - t0
        return {"insert_traj_per_s": done / secs}
    finally:
        shards.close()


def py_local(inserts: int, batches: int) -> dict:
    """Python on a process-private table: gear bench's default workload."""
    steps, step_bytes = 128, 4096
    table = gear.Table([("obs", "uint8", (step_bytes,))], max_len=steps, capacity=2048)
    per_call = 16
    block = {"obs": np.repeat((np.arange(steps * step_bytes) % 251).astype(np.uint8).reshape(1, steps, step_bytes),
                              per_call, axis=0)}
    writer = table.writer()
    t0 = time.perf_counter()
    done = 0
    while done < inserts:
        writer.insert_batch(block, steps=steps)
        done += per_call
    insert_s = time.perf_counter() - t0
    sampler = table.sampler(32)
    batch_bytes = 32 * steps * step_bytes
    sampler.sample()
    t0 = time.perf_counter()
    for _ in range(batches):
        b = sampler.sample()
        del b
    sample_s = time.perf_counter() - t0
    out = {"obs": np.empty((32, steps, step_bytes), np.uint8)}
    t0 = time.perf_counter()
    for _ in range(batches):
        sampler.sample_into(out)
    into_s = time.perf_counter() - t0
    return {"insert_gb_per_s": done * steps * step_bytes / insert_s / 1e9,
            "sample_gb_per_s": batches * batch_bytes / sample_s / 1e9,
            "sample_into_gb_per_s": batches * batch_bytes / into_s / 1e9}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="alternating Rust/Python rounds (medians reported)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows: dict = {}

    def add(name: str, rust: float, py: float) -> None:
        rows.setdefault(name, {"rust": [], "python": []})
        rows[name]["rust"].append(rust)
        rows[name]["python"].append(py)

    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
        rust = rust_bench("--shards", "3", "--steps", "128", "--step-bytes", "4096", "--batch", "32",
                          "--inserts", "480", "--batches", "150")
        py = py_cluster_trajectories(480, 150)
        add("cluster sample, 32 x 128 x 4 KiB (GB/s)", rust["sample_gb_per_s"], py["sample_gb_per_s"])
        add("cluster insert, 128 x 4 KiB trajectories (GB/s)", rust["insert_gb_per_s"], py["insert_gb_per_s"])
        rust = rust_bench("--shards", "3", "--steps", "1", "--step-bytes", "64", "--batch", "32",
                          "--inserts", "48000", "--batches", "20", "--capacity", "65536")
        py = py_cluster_transitions(48000)
        add("cluster insert_batch, 64-byte transitions (per s)", rust["insert_traj_per_s"], py["insert_traj_per_s"])
        rust = rust_bench("--inserts", "2048", "--batches", "200")
        py = py_local(2048, 200)
        add("local insert, 128 x 4 KiB (GB/s)", rust["insert_gb_per_s"], py["insert_gb_per_s"])
        add("local sample, 32 x 128 x 4 KiB (GB/s)", rust["sample_gb_per_s"], py["sample_gb_per_s"])
        add("local sample_into, 32 x 128 x 4 KiB (GB/s)", rust["sample_gb_per_s"], py["sample_into_gb_per_s"])

    report = {}
    print(f"{'workload':52} {'Rust':>10} {'Python':>10} {'Python/Rust':>12}")
    for name, v in rows.items():
        rust, py = statistics.median(v["rust"]), statistics.median(v["python"])
        ratios = [p / q for p, q in zip(v["python"], v["rust"])]
        report[name] = {"rust": rust, "python": py, "ratio_median": statistics.median(ratios),
                        "ratios": ratios}
        print(f"{name:52} {rust:10.3f} {py:10.3f} {statistics.median(ratios):12.2f}   per round: "
              + " ".join(f"{x:.2f}" for x in ratios))
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
