"""HDF5 datasets in and out of a table, checked against h5py (the HDF5 C
library): a D4RL-layout file written by h5py itself (chunked, gzip, as
D4RL's files are) is imported, sampled and exported, and h5py reads the
export back equal to the original; likewise a Minari-layout file. Skipped
when h5py is not installed (ci/pytest.sh installs it)."""

import numpy as np
import pytest

import gear

h5py = pytest.importorskip("h5py")

# Episode lengths, and how each ends (the last one is cut off: partial).
EPISODES = [(40, "terminal"), (25, "timeout"), (90, "terminal"), (1, "terminal"), (60, "timeout"), (34, None)]
N = sum(n for n, _ in EPISODES)


def d4rl_arrays():
    i = np.arange(N)
    terminals = np.zeros(N, bool)
    timeouts = np.zeros(N, bool)
    end = 0
    for n, how in EPISODES:
        end += n
        if how == "terminal":
            terminals[end - 1] = True
        elif how == "timeout":
            timeouts[end - 1] = True
    return {
        "observations": np.stack([i, i + 0.25, -i, i * 2, i % 7], axis=1).astype(np.float32),
        "actions": np.stack([np.sin(i), np.cos(i)], axis=1).astype(np.float32),
        "rewards": (i % 11 - 3.5).astype(np.float32),
        "terminals": terminals,
        "timeouts": timeouts,
        "infos/qpos": np.stack([i * 1e-3, 1 / (i + 1)], axis=1).astype(np.float64),
    }


def write_d4rl(path, arrays):
    with h5py.File(path, "w") as f:
        for name, a in arrays.items():
            f.create_dataset(name, data=a, chunks=True, compression="gzip")


def table_for(arrays, max_len, capacity):
    return gear.Table([(k, v.dtype, v.shape[1:]) for k, v in arrays.items()], max_len=max_len, capacity=capacity)


def test_d4rl_from_h5py_imports_samples_and_exports_equal(tmp_path):
    arrays = d4rl_arrays()
    src = tmp_path / "d4rl.hdf5"
    write_d4rl(src, arrays)
    table = table_for(arrays, max_len=50, capacity=100)
    report = gear.import_hdf5(table, str(src))
    assert report["layout"] == "d4rl"
    assert (report["episodes"], report["trajectories"], report["split_episodes"]) == (6, 8, 2)
    assert report["steps"] == N

    # Whole trajectories: every valid step equals the source row it names.
    batch = table.sampler(batch_size=64).sample()
    obs = batch["observations"]
    for r, n in enumerate(batch.lengths):
        assert n >= 1
        rows = obs[r, :n, 0].astype(np.int64)
        np.testing.assert_array_equal(rows, np.arange(rows[0], rows[0] + n))
        for name, a in arrays.items():
            np.testing.assert_array_equal(batch[name][r, :n], a[rows], err_msg=name)

    for deflate in (None, 4):
        out = tmp_path / f"out-{deflate}.hdf5"
        e = gear.export_hdf5(table, str(out), deflate=deflate)
        assert (e["trajectories"], e["steps"]) == (8, N)
        with h5py.File(src, "r") as a, h5py.File(out, "r") as b:
            names = []
            a.visit(lambda k: names.append(k) if isinstance(a[k], h5py.Dataset) else None)
            other = []
            b.visit(lambda k: other.append(k) if isinstance(b[k], h5py.Dataset) else None)
            assert sorted(names) == sorted(other)
            for k in names:
                assert a[k].dtype == b[k].dtype, k
                assert a[k].shape == b[k].shape, k
                np.testing.assert_array_equal(a[k][()], b[k][()], err_msg=k)
                assert a[k][()].tobytes() == b[k][()].tobytes(), k
            if deflate:
                assert b["observations"].compression == "gzip"


def test_minari_from_h5py_round_trips(tmp_path):
    src = tmp_path / "main_data.hdf5"
    lengths = [12, 45, 7]
    with h5py.File(src, "w") as f:
        base = 0
        for e, t in enumerate(lengths):
            g = f.create_group(f"episode_{e}")
            i = np.arange(base, base + t + 1)
            g.create_dataset("observations", data=np.stack([i, -i], axis=1).astype(np.float32), compression="gzip")
            g.create_dataset("actions", data=(i[:-1] % 3).astype(np.int64))
            g.create_dataset("rewards", data=np.ones(t))
            g.create_dataset("terminations", data=np.arange(t) == t - 1)
            g.create_dataset("truncations", data=np.zeros(t, bool))
            base += t + 1
    table = gear.Table(
        [
            ("observations", "float32", (2,)),
            ("next_observations", "float32", (2,)),
            ("actions", "int64", ()),
            ("rewards", "float64", ()),
            ("terminations", "bool", ()),
            ("truncations", "bool", ()),
        ],
        max_len=20,
        capacity=10,
    )
    report = gear.import_hdf5(table, str(src), layout="minari")
    assert (report["episodes"], report["trajectories"]) == (3, 5)
    batch = table.sampler(batch_size=16).sample()
    for r, n in enumerate(batch.lengths):
        np.testing.assert_array_equal(batch["next_observations"][r, :n, 0], batch["observations"][r, :n, 0] + 1)
    out = tmp_path / "out.hdf5"
    assert gear.export_hdf5(table, str(out), layout="minari")["episodes"] == 3
    with h5py.File(src, "r") as a, h5py.File(out, "r") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        for g in a:
            for k in a[g]:
                assert a[g][k].dtype == b[g][k].dtype, (g, k)
                np.testing.assert_array_equal(a[g][k][()], b[g][k][()], err_msg=f"{g}/{k}")


def test_bad_files_raise_and_change_nothing(tmp_path):
    arrays = d4rl_arrays()
    src = tmp_path / "d4rl.hdf5"
    write_d4rl(src, arrays)
    table = table_for(arrays, max_len=50, capacity=100)
    gear.import_hdf5(table, str(src))
    before = table.info()["inserts"]
    text = tmp_path / "notes.txt"
    text.write_text("not hdf5")
    with pytest.raises(gear.GearError, match="not an HDF5 file"):
        gear.import_hdf5(table, str(text))
    with pytest.raises(gear.SpecError, match="names column `nope`"):
        gear.import_hdf5(table, str(src), mapping={"rewards": "nope"})
    with pytest.raises(gear.GearError, match="not the Minari layout"):
        gear.import_hdf5(table, str(src), layout="minari")
    with pytest.raises(gear.SpecError, match="has 90 steps"):
        gear.import_hdf5(table, str(src), split_long_episodes=False)
    small = gear.Table([("observations", "float64", (5,))], max_len=50, capacity=100)
    gear.import_hdf5(small, str(src))  # f32 -> f64: lossless
    narrow = gear.Table([("observations", "float16", (5,))], max_len=50, capacity=100)
    with pytest.raises(gear.SpecError, match="dtype f32, column `observations` is f16"):
        gear.import_hdf5(narrow, str(src))
    after = table.info()["inserts"]
    assert after == before


def test_export_targets_that_are_not_regular_files_are_refused(tmp_path, not_regular_targets):
    targets, kept = not_regular_targets
    arrays = d4rl_arrays()
    src = tmp_path / "d4rl.hdf5"
    write_d4rl(src, arrays)
    table = table_for(arrays, max_len=100, capacity=10)
    gear.import_hdf5(table, str(src))
    for target, words in targets:
        with pytest.raises(gear.GearError, match=words):
            gear.export_hdf5(table, str(target))
    assert kept.read_bytes() == b"not mine"
    # Nothing left behind; a regular file (or a new path) is written.
    assert not [p for p in tmp_path.iterdir() if ".tmp." in p.name]
    gear.export_hdf5(table, str(kept))
    with h5py.File(kept, "r") as f:
        assert f["observations"].shape == arrays["observations"].shape
