"""The h5py side of `cargo xtask hdf5-bench`: writes the benchmark's files
the way D4RL and Minari write theirs (h5py, contiguous datasets), and times
h5py reading the same datasets a gear import reads.

    python h5py_side.py make-d4rl PATH --steps N
    python h5py_side.py make-minari PATH --episodes N [--chunked]
    python h5py_side.py read PATH --method read_direct|getitem [--repeat R]

`read` prints one JSON line: the seconds of each repeat and the bytes read.
Each repeat opens the file and reads every dataset of one row per step
(D4RL: every dataset of N rows; Minari: every dataset of every episode
group), as an import of the file does. `read_direct` reads into arrays
allocated and written once before the first repeat (the memory an import
writes into, a table built beforehand, is warm too); `getitem` is
`ds[()]`, a fresh array per dataset.
"""

import argparse
import json
import sys
import time

import h5py
import numpy as np


def make_d4rl(path, steps):
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f["observations"] = rng.standard_normal((steps, 17), dtype=np.float32)
        f["next_observations"] = rng.standard_normal((steps, 17), dtype=np.float32)
        f["actions"] = rng.uniform(-1, 1, (steps, 6)).astype(np.float32)
        f["rewards"] = rng.standard_normal(steps, dtype=np.float32)
        f["terminals"] = np.zeros(steps, dtype=bool)
        timeouts = np.zeros(steps, dtype=bool)
        timeouts[999::1000] = True
        f["timeouts"] = timeouts
        f["infos/qpos"] = rng.standard_normal((steps, 9), dtype=np.float32)
        f["infos/qvel"] = rng.standard_normal((steps, 9), dtype=np.float32)


def make_minari(path, episodes, chunked):
    """CartPole-like episodes of 20 to 500 steps, as Minari stores them."""
    rng = np.random.default_rng(1)
    kw = {"chunks": True} if chunked else {}
    with h5py.File(path, "w") as f:
        f.attrs["total_episodes"] = episodes
        for i in range(episodes):
            t = int(rng.integers(20, 501))
            g = f.create_group(f"episode_{i}")
            g.attrs["id"] = i
            g.create_dataset("observations", data=rng.standard_normal((t + 1, 4), dtype=np.float32), **kw)
            g.create_dataset("actions", data=rng.integers(0, 2, t, dtype=np.int64), **kw)
            g.create_dataset("rewards", data=np.ones(t, dtype=np.float64), **kw)
            term = np.zeros(t, dtype=bool)
            term[-1] = True
            g.create_dataset("terminations", data=term, **kw)
            g.create_dataset("truncations", data=np.zeros(t, dtype=bool), **kw)


def datasets(f):
    """Every dataset an import reads, in file order."""
    out = []
    f.visititems(lambda name, obj: out.append(name) if isinstance(obj, h5py.Dataset) else None)
    return out


def read(path, method, repeat):
    with h5py.File(path, "r") as f:
        names = datasets(f)
        arrays = {}
        if method == "read_direct":
            for n in names:
                ds = f[n]
                arrays[n] = np.empty(ds.shape, dtype=ds.dtype)
                arrays[n].fill(0)
        total = sum(f[n].size * f[n].dtype.itemsize for n in names)
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        with h5py.File(path, "r") as f:
            if method == "read_direct":
                for n in names:
                    f[n].read_direct(arrays[n])
            else:
                for n in names:
                    f[n][()]
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"seconds": seconds, "bytes": total, "datasets": len(names)}))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("make-d4rl")
    d.add_argument("path")
    d.add_argument("--steps", type=int, required=True)
    m = sub.add_parser("make-minari")
    m.add_argument("path")
    m.add_argument("--episodes", type=int, required=True)
    m.add_argument("--chunked", action="store_true")
    r = sub.add_parser("read")
    r.add_argument("path")
    r.add_argument("--method", choices=["read_direct", "getitem"], required=True)
    r.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    if a.cmd == "make-d4rl":
        make_d4rl(a.path, a.steps)
    elif a.cmd == "make-minari":
        make_minari(a.path, a.episodes, a.chunked)
    else:
        read(a.path, a.method, a.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
