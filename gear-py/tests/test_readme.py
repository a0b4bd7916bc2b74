"""Every Python snippet of the README runs as written: each is executed
verbatim in a fresh interpreter, in a scratch directory holding what it
names (a cluster file for three real shards, an HDF5 file)."""

import pathlib
import re
import subprocess
import sys

import pytest

from conftest import REPO, TOKEN

SNIPPETS = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)


def snippet(containing: str) -> str:
    found = [s for s in SNIPPETS if containing in s]
    assert len(found) == 1, f"one README snippet with {containing!r}, found {len(found)}"
    return found[0]


def run(code: str, cwd: pathlib.Path, prelude: str = "") -> None:
    out = subprocess.run([sys.executable, "-c", prelude + "\n" + code], cwd=cwd, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, f"README snippet failed:\n{code}\n{out.stderr}"


def test_every_python_snippet_is_covered_here():
    assert len(SNIPPETS) == 3, "a new README snippet needs a test here"


def test_local_table_snippet(tmp_path):
    code = snippet("gear.Table(columns")
    run(code + "\nassert len(restored) == len(table) == 257\n", tmp_path)


def test_cluster_snippet(tmp_path, local_cluster):
    lc = local_cluster(max_len=100, capacity=1000,
                       columns=[("obs", "f32", (4,)), ("action", "i64", ()), ("reward", "f32", ())])
    (tmp_path / "cluster.toml").write_text(
        "shards = [" + ", ".join(f'"{a}"' for a in lc.addrs) + f']\ntoken = "{TOKEN}"\n')
    code = snippet("gear.Cluster.from_file")
    run(code + "\nassert batch['obs'].shape == (32, 8, 4) and applied + stale == 32 and batch.lost == []\n",
        tmp_path)


def test_hdf5_snippet(tmp_path):
    pytest.importorskip("h5py", reason="h5py is not installed (ci/pytest.sh installs it)")
    prelude = """
import h5py, numpy as np, gear
n = 50
with h5py.File("hopper-medium-v2.hdf5", "w") as f:
    f["observations"] = np.random.default_rng(0).normal(size=(n, 11)).astype(np.float32)
    f["actions"] = np.zeros((n, 3), np.float32)
    f["rewards"] = np.ones(n, np.float32)
    f["terminals"] = np.zeros(n, bool)
    f["timeouts"] = (np.arange(n) % 10 == 9)
table = gear.Table([("obs", "float32", (11,)), ("actions", "float32", (3,)), ("rewards", "float32")],
                   max_len=10, capacity=16)
"""
    code = snippet("import_hdf5")
    run(code + "\nassert report['trajectories'] == 5, report\n", tmp_path, prelude)
    assert (tmp_path / "copy.hdf5").exists()
