"""gear.Cluster against three real `gear serve` processes on loopback:
remote writers (streamed trajectories and insert_batch), every sampled row
checked, the global prioritized distribution, a shard killed and
restarted, tokens refused, a writer process killed mid-trajectory,
pickling, deadlines and errors."""

import os
import pickle
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import gear
from conftest import TOKEN, require, run_child

OBS = 48
MAX_LEN = 16


def steps_of(tid: int, n: int):
    """Trajectory `tid`'s `n` steps: id, t, obs bytes (tid*31 + t*7 + j) % 251."""
    for t in range(n):
        obs = ((tid * 31 + t * 7 + np.arange(OBS)) % 251).astype(np.uint8)
        yield dict(id=tid, t=t, obs=obs)


def write(cluster, tid: int, n: int, target="round_robin", **kw):
    with cluster.writer(target, **kw).trajectory() as traj:
        for step in steps_of(tid, n):
            traj.append(**step)
    return traj


def check_rows(batch) -> int:
    """Every valid step of every row holds what was written."""
    rows, window = batch["id"].shape
    assert batch["obs"].shape == (rows, window, OBS)
    for r in range(rows):
        n = int(batch.lengths[r])
        assert 1 <= n <= window
        valid = np.flatnonzero(batch.mask[r])
        assert len(valid) == n
        tid = int(batch["id"][r, valid[0]])
        for j, step in enumerate(valid):
            t = int(batch.starts[r]) + j
            assert int(batch["id"][r, step]) == tid
            assert int(batch["t"][r, step]) == t
            want = ((tid * 31 + t * 7 + np.arange(OBS)) % 251).astype(np.uint8)
            assert np.array_equal(batch["obs"][r, step], want), (r, j, tid, t)
        assert batch.probabilities[r] > 0 and batch.weights[r] > 0
    return rows


def test_streamed_trajectories_and_batches_every_row_checked(local_cluster):
    lc = local_cluster()
    cluster = gear.Cluster(lc.addrs, TOKEN)
    assert [c[0] for c in cluster.columns] == ["id", "t", "obs"]
    keys = []
    for tid in range(30):
        # chunk_steps=3: a trajectory of up to 16 steps goes in several chunks.
        traj = write(cluster, tid, 1 + tid % MAX_LEN, chunk_steps=3)
        keys.append(int(traj.shard))
    assert sorted(set(keys)) == [0, 1, 2], "round-robin reached every shard"
    sampler = cluster.sampler(32, window=8)
    seen = set()
    for _ in range(20):
        batch = sampler.sample()
        assert check_rows(batch) == 32
        assert batch.lost == [] and isinstance(batch.rejoined, list)
        seen |= set(batch.keys["shard"].tolist())
        assert batch.keys.dtype == gear.CLUSTER_KEY_DTYPE
    assert seen == {0, 1, 2}
    info = cluster.info()
    assert [i["shard"] for i in info] == [0, 1, 2]
    assert sum(i["inserts"] for i in info) == 30 and all(i["size"] == 10 for i in info)
    # Zero copy: the columns are views of the batch's own memory.
    assert batch["obs"].base is batch.buffer or batch["obs"].base is not None


def test_kept_batches_stay_exact_while_the_sampler_reuses_its_buffers(local_cluster):
    """sample() decodes into buffers the sampler pools: the buffer of a
    batch that is gone is reused, and a batch (or an array of it) kept
    while later ones are drawn never changes."""
    lc = local_cluster()
    cluster = gear.Cluster(lc.addrs, TOKEN)
    for tid in range(24):
        write(cluster, tid, 1 + tid % MAX_LEN)
    sampler = cluster.sampler(16, window=6)
    addresses = set()
    for _ in range(6):
        b = sampler.sample()
        check_rows(b)
        addresses.add(b["obs"].__array_interface__["data"][0])
        del b
    assert len(addresses) == 1, addresses
    kept = [sampler.sample() for _ in range(3)]
    copies = [{c: b[c].copy() for c in ("id", "t", "obs")} for b in kept]
    obs_only = sampler.sample()["obs"]
    obs_copy = obs_only.copy()
    for _ in range(12):
        check_rows(sampler.sample())
    for b, want in zip(kept, copies):
        check_rows(b)
        assert all(np.array_equal(b[c], want[c]) for c in want)
    assert np.array_equal(obs_only, obs_copy)


def test_a_prefetching_sampler_draws_exact_batches_ahead_through_timeouts_and_a_lost_shard(local_cluster):
    """prefetch=N: a Rust thread draws ahead; an empty cluster's timeout is
    raised in its turn and drawing goes on; kept batches never change; a
    killed shard is left out of the batches, which keep coming."""
    lc = local_cluster()
    cluster = gear.Cluster(lc.addrs, TOKEN, call_timeout=3.0)
    sampler = cluster.sampler(16, window=6, timeout=0.4, prefetch=2)
    assert sampler.prefetch == 2
    with pytest.raises(gear.TimeoutError):
        sampler.sample()
    for tid in range(30):
        write(cluster, tid, 1 + tid % MAX_LEN)
    deadline = time.monotonic() + 20
    while True:
        try:
            first = sampler.sample()
            break
        except gear.TimeoutError:  # those drawn before the writes
            assert time.monotonic() < deadline
    kept = [first] + [sampler.sample() for _ in range(3)]
    copies = [{c: b[c].copy() for c in ("id", "t", "obs")} for b in kept]
    for _ in range(10):
        check_rows(sampler.sample())
    lc.servers[1].kill()
    lost = False
    while time.monotonic() < deadline and not lost:
        b = sampler.sample()
        assert check_rows(b) == 16
        lost = 1 in b.lost and 1 not in set(b.keys["shard"].tolist())
    assert lost
    for b, want in zip(kept, copies):
        check_rows(b)
        assert all(np.array_equal(b[c], want[c]) for c in want)
    with pytest.raises(gear.SpecError, match="prefetch"):
        sampler.sample_into({c: np.empty(s, dt) for c, (dt, s) in sampler.output_spec().items()})
    sampler.close()
    with pytest.raises(gear.GearError, match="closed"):
        sampler.sample()


def test_oversized_batches_are_refused_when_the_sampler_is_made(local_cluster):
    """Too many rows, or more bytes than one message may carry, fail at
    `sampler(...)`, naming the limit, before any buffer is sized."""
    lc = local_cluster()
    cluster = gear.Cluster(lc.addrs, TOKEN)
    started = time.monotonic()
    for rows in (3 * 10**7, 2**62):
        with pytest.raises(gear.SpecError, match="between 1 and 1048576 may be asked for"):
            cluster.sampler(rows, window=6)
    # 2^20 rows of 16 steps of 60 bytes: about 1 GB, over the message limit.
    with pytest.raises(gear.SpecError, match="message limit"):
        cluster.sampler(2**20, window=16)
    assert time.monotonic() - started < 5


def test_insert_batch_to_each_target_and_windows(local_cluster):
    lc = local_cluster()
    cluster = gear.Cluster(lc.addrs, TOKEN)
    n = 60
    ids = np.arange(1000, 1000 + n, dtype=np.int64)
    obs = ((ids[:, None] * 31 + np.arange(OBS)) % 251).astype(np.uint8)
    cols = {"id": ids, "t": np.zeros(n, np.int32), "obs": obs}
    keys = cluster.writer("most_free").insert_batch(cols)
    assert keys.dtype == gear.CLUSTER_KEY_DTYPE and len(keys) == n
    assert np.bincount(keys["shard"], minlength=3).tolist() == [20, 20, 20]
    keys2 = cluster.writer(2).insert_batch(cols, priorities=np.full(n, 2.0))
    assert set(keys2["shard"].tolist()) == {2}
    # Whole trajectories of 4 steps, windows at the start, padded at the tail.
    k = 4
    ids4 = np.arange(5000, 5010, dtype=np.int64)
    cols4 = {
        "id": np.repeat(ids4[:, None], k, axis=1),
        "t": np.tile(np.arange(k, dtype=np.int32), (10, 1)),
        "obs": ((ids4[:, None, None] * 31 + np.arange(k)[None, :, None] * 7 + np.arange(OBS)) % 251).astype(np.uint8),
    }
    cluster.writer("round_robin").insert_batch(cols4, steps=k)
    batch = cluster.sampler(16, window=6, offset=0).sample()
    check_rows(batch)
    assert batch.mask[:, 0].all()
    with pytest.raises(gear.StepError, match="shape"):
        cluster.writer().insert_batch({"id": ids, "t": np.zeros(n, np.int32), "obs": obs[:, :3]})
    with pytest.raises(gear.SpecError, match="no shard 7"):
        cluster.writer(7)
    with pytest.raises(gear.SpecError, match="round_robin"):
        cluster.writer("everywhere")


def test_sample_into_arrays_and_output_spec(local_cluster):
    lc = local_cluster()
    cluster = gear.Cluster(lc.addrs, TOKEN)
    for tid in range(12):
        write(cluster, tid, 5)
    sampler = cluster.sampler(8, window=4, columns=["obs", "t"])
    spec = sampler.output_spec()
    assert spec == {"obs": ("uint8", (8, 4, OBS)), "t": ("int32", (8, 4))}
    out = {"obs": np.zeros((8, 4, OBS), np.uint8), "t": np.full((8, 4), -1, np.int32)}
    batch = sampler.sample_into(out)
    assert batch["obs"] is out["obs"] and batch.buffer is None
    # Last 4 of 5 steps: t is 1..4 in every row.
    assert (out["t"] == np.arange(1, 5)).all()
    with pytest.raises(gear.StepError, match="shape"):
        sampler.sample_into({"obs": np.zeros((8, 3, OBS), np.uint8), "t": np.zeros((8, 4), np.int32)})


def check_into(batch, out, garbage: int) -> None:
    """`batch` is `out` filled: every valid step exact (check_rows), every
    padded step zero (none of the garbage the buffers held is left)."""
    assert all(batch[name] is out[name] for name in out)
    view = {name: np.asarray(out[name]) for name in out}

    class Filled:
        def __getitem__(self, name):
            return view[name]

        def __getattr__(self, name):
            return getattr(batch, name)

    assert check_rows(Filled()) == view["id"].shape[0]
    pad = ~np.asarray(batch.mask)
    for name, column in view.items():
        assert not (column[pad] == np.array(garbage).astype(column.dtype)).any(), name
        assert (column[pad] == 0).all(), name


def test_sample_into_decodes_exact_rows_into_the_same_buffers_batch_after_batch(local_cluster):
    lc = local_cluster()
    cluster = gear.Cluster(lc.addrs, TOKEN)
    for tid in range(30):
        write(cluster, tid, 1 + tid % MAX_LEN, chunk_steps=4)
    sampler = cluster.sampler(32, window=8)
    garbage = 0xAB
    out = {"id": np.full((32, 8), garbage, np.int64), "t": np.full((32, 8), garbage, np.int32),
           "obs": np.full((32, 8, OBS), garbage, np.uint8)}
    addresses = {name: a.ctypes.data for name, a in out.items()}
    seen = set()
    for i in range(12):
        batch = sampler.sample_into(out)
        # The same memory every batch: decoded into, never replaced.
        assert {name: a.ctypes.data for name, a in out.items()} == addresses
        assert batch["obs"].ctypes.data == addresses["obs"] and batch.buffer is None
        check_into(batch, out, garbage)
        assert batch.lost == [] and len(batch.keys) == 32
        assert (batch.weights > 0).all() and (batch.weights <= 1).all()
        seen |= set(batch.keys["shard"].tolist())
        for a in out.values():
            a.fill(garbage)  # what the next batch must overwrite
    assert seen == {0, 1, 2}

    torch = require("torch")
    tensors = {"id": torch.full((32, 8), garbage, dtype=torch.int64),
               "t": torch.full((32, 8), garbage, dtype=torch.int32),
               "obs": torch.full((32, 8, OBS), garbage, dtype=torch.uint8)}
    pointers = {name: t.data_ptr() for name, t in tensors.items()}
    for _ in range(6):
        batch = sampler.sample_into(tensors)
        assert {name: t.data_ptr() for name, t in tensors.items()} == pointers
        check_into(batch, tensors, garbage)
        for t in tensors.values():
            t.fill_(garbage)


def test_global_prioritized_distribution_chi_square(local_cluster):
    """Items with priorities 1..24 spread over three shards are drawn with
    probability p^alpha / sum p^alpha, as from one table."""
    lc = local_cluster(max_len=1, capacity=64)
    cluster = gear.Cluster(lc.addrs, TOKEN, mass_refresh=0.0)
    n = 24
    prios = np.arange(1, n + 1, dtype=np.float64)
    ids = np.arange(n, dtype=np.int64)
    cols = {"id": ids, "t": np.zeros(n, np.int32), "obs": np.zeros((n, OBS), np.uint8)}
    # Unequal shards: 4, 8 and 12 items.
    parts = [(0, slice(0, 4)), (1, slice(4, 12)), (2, slice(12, 24))]
    for shard, sl in parts:
        cluster.writer(shard).insert_batch({k: v[sl] for k, v in cols.items()}, priorities=prios[sl])
    counts = np.zeros(n)
    sampler = cluster.sampler(64, window=1)
    draws = 0
    probs_ok = True
    expected = prios ** 0.6 / (prios ** 0.6).sum()
    while draws < 12_000:
        b = sampler.sample()
        got = b["id"][:, 0]
        np.add.at(counts, got, 1)
        probs_ok &= np.allclose(b.probabilities, expected[got], rtol=1e-6)
        draws += len(got)
    assert probs_ok, "reported probabilities are the global ones"
    chi2 = ((counts - draws * expected) ** 2 / (draws * expected)).sum()
    # 23 degrees of freedom: P(chi2 > 49.7) = 0.001.
    assert chi2 < 49.7, f"chi-square {chi2:.1f}: {counts}"
    # Weights: (p_min / p)^beta, the largest 1.
    b = sampler.sample()
    w = (expected.min() / b.probabilities) ** 0.4
    assert np.allclose(b.weights, w)


def test_update_priorities_routed_applied_and_stale(local_cluster):
    lc = local_cluster(max_len=1, capacity=64)
    cluster = gear.Cluster(lc.addrs, TOKEN, mass_refresh=0.0)
    n = 12
    cols = {"id": np.arange(n, dtype=np.int64), "t": np.zeros(n, np.int32), "obs": np.zeros((n, OBS), np.uint8)}
    keys = cluster.writer("round_robin").insert_batch(cols)
    applied, stale = cluster.update_priorities(keys, np.full(n, 3.0))
    assert (applied, stale) == (n, 0)
    # The [n, 3] integer form (what gear.torch hands out) works too.
    words = keys.view("<u8").reshape(-1, 3).astype(np.int64)
    assert cluster.update_priorities(words, np.ones(n)) == (n, 0)
    # Only item 5 gets a large priority: it dominates the draws.
    cluster.update_priorities(keys[5:6], [1e6])
    b = cluster.sampler(32, window=1).sample()
    assert (b["id"][:, 0] == 5).mean() > 0.9
    with pytest.raises(gear.StepError, match="priority"):
        cluster.update_priorities(keys[:1], [float("nan")])
    with pytest.raises(gear.StepError, match="keys"):
        cluster.update_priorities(np.zeros(3), [1.0, 1.0, 1.0])
    # Keys of a shard's earlier run are stale after it restarts.
    lc.restart(1)
    applied, stale = cluster.update_priorities(keys, np.ones(n))
    assert (applied, stale) == (8, 4)


def test_a_killed_shard_is_lost_then_rejoins_batches_keep_coming(local_cluster):
    lc = local_cluster()
    cluster = gear.Cluster(lc.addrs, TOKEN, call_timeout=3.0)
    for tid in range(30):
        write(cluster, tid, 1 + tid % MAX_LEN)
    sampler = cluster.sampler(32, window=8)
    check_rows(sampler.sample())
    lc.servers[1].kill()
    b = sampler.sample()
    assert 1 in b.lost and "1" not in str(b.lost_reasons.keys()) or 1 in b.lost_reasons
    assert check_rows(b) == 32 and 1 not in set(b.keys["shard"].tolist())
    for _ in range(3):
        check_rows(sampler.sample())
    lc.restart(1)
    for tid in range(100, 110):
        write(cluster, tid, 6, target=1)
    rejoined = from_new = False
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (rejoined and from_new):
        b = sampler.sample()
        check_rows(b)
        rejoined |= 1 in b.rejoined
        from_new |= 1 in set(b.keys["shard"].tolist())
    assert rejoined and from_new


def test_wrong_or_missing_token_is_refused(local_cluster, monkeypatch):
    lc = local_cluster(shards=1)
    wrong = gear.Cluster(lc.addrs, "not-the-token-0123456789")
    with pytest.raises(gear.AuthError, match="wrong cluster token"):
        wrong.info() and wrong.columns
    monkeypatch.delenv("GEAR_TOKEN", raising=False)
    with pytest.raises(gear.SpecError, match="GEAR_TOKEN"):
        gear.Cluster(lc.addrs)
    with pytest.raises(gear.SpecError, match="at least 16"):
        gear.Cluster(lc.addrs, "short")
    with pytest.raises(gear.SpecError, match="no port"):
        gear.Cluster(["localhost"], TOKEN)


def test_a_table_named_by_the_cluster_is_used_and_an_unknown_one_is_refused(local_cluster):
    lc = local_cluster(shards=1)
    named = gear.Cluster(lc.addrs, TOKEN, table=lc.table_names[0])
    with named.writer(0).trajectory() as t:
        t.append(id=1, t=0, obs=np.zeros(OBS, np.uint8))
    assert named.info()[0]["size"] == 1
    # The table name survives pickling (a DataLoader worker reopens it).
    assert pickle.loads(pickle.dumps(named)).info()[0]["size"] == 1
    unknown = gear.Cluster(lc.addrs, TOKEN, table="no-such-table")
    # info() reports each shard's answer; the refusal lists the tables.
    error = unknown.info()[0]["error"]
    assert "no-such-table" in error and lc.table_names[0] in error, error
    with pytest.raises(gear.GearError, match=lc.table_names[0]):
        unknown.sampler(batch_size=4).sample()
    with pytest.raises(gear.SpecError, match="table"):
        gear.Cluster(lc.addrs, TOKEN, table="bad name/with slash")


def test_a_writer_process_killed_mid_trajectory_leaves_nothing(local_cluster, tmp_path):
    lc = local_cluster(shards=1)
    ready = tmp_path / "ready"
    code = f"""
import sys, time, numpy as np, gear
cluster = gear.Cluster({lc.addrs!r}, {TOKEN!r})
w = cluster.writer(0, chunk_steps=2)
with w.trajectory() as t:
    for step in range(3):
        t.append(id=7, t=step, obs=np.zeros({OBS}, np.uint8))
with w.trajectory() as t:
    for step in range(9):          # four chunks sent, one step pending
        t.append(id=8, t=step, obs=np.zeros({OBS}, np.uint8))
    open({str(ready)!r}, "w").close()
    time.sleep(60)
"""
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert child.poll() is None, "the writer process failed"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        cluster = gear.Cluster(lc.addrs, TOKEN)
        assert cluster.info()[0]["size"] == 1
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
    time.sleep(0.5)
    info = cluster.info()[0]
    assert info["size"] == 1 and info["inserts"] == 1, info
    b = cluster.sampler(8, window=MAX_LEN).sample()
    assert (b["id"][b.mask] == 7).all()


def test_an_exception_abandons_and_nothing_is_stored(local_cluster):
    lc = local_cluster(shards=1)
    cluster = gear.Cluster(lc.addrs, TOKEN)
    with pytest.raises(RuntimeError):
        with cluster.writer(0, chunk_steps=1).trajectory() as t:
            for step in steps_of(1, 5):
                t.append(**step)
            raise RuntimeError("actor crashed")
    assert t.closed
    with pytest.raises(gear.StepError, match="maximum length"):
        with cluster.writer(0).trajectory() as t:
            for step in steps_of(2, MAX_LEN + 1):
                t.append(**step)
    with pytest.raises(gear.StepError, match="missing"):
        cluster.writer(0).trajectory().append(id=1, t=0)
    time.sleep(0.3)
    assert cluster.info()[0]["size"] == 0
    # A priority given at the end, after chunks went out, is applied.
    with cluster.writer(0, chunk_steps=1).trajectory() as t:
        for step in steps_of(3, 3):
            t.append(**step)
        key = t.end(priority=5.0)
    assert key["shard"] == 0 and t.closed
    assert cluster.update_priorities([key], [1.0]) == (1, 0)


def test_empty_cluster_waits_then_times_out_and_lost_cluster_raises(local_cluster):
    lc = local_cluster()
    cluster = gear.Cluster(lc.addrs, TOKEN, call_timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(gear.TimeoutError) as e:
        cluster.sampler(4, window=2, timeout=0.5).sample()
    assert isinstance(e.value, TimeoutError) and isinstance(e.value, gear.GearError)
    assert 0.4 < time.monotonic() - t0 < 5
    spec_known = cluster.sampler(4, window=2, timeout=0.5)
    lc.close()
    with pytest.raises(gear.ShardLostError):
        spec_known.sample()


def test_pickles_as_configuration_for_multiprocessing(local_cluster):
    lc = local_cluster()
    cluster = gear.Cluster(lc.addrs, TOKEN, call_timeout=4.0, seed=3)
    state = pickle.loads(pickle.dumps(cluster))
    assert state.shards == cluster.shards
    code = f"""
import pickle, sys, numpy as np, gear
cluster = pickle.loads(bytes.fromhex(sys.argv[1]))
cluster.writer("round_robin").insert_batch({{"id": np.arange(6), "t": np.zeros(6, np.int32),
                                             "obs": np.zeros((6, {OBS}), np.uint8)}})
print(sum(i["size"] for i in cluster.info()))
"""
    out = run_child(code, pickle.dumps(cluster).hex())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "6"
    # A token from $GEAR_TOKEN is not pickled: the child reads its own.
    os.environ["GEAR_TOKEN"] = TOKEN
    try:
        from_env = gear.Cluster(lc.addrs)
        assert pickle.loads(pickle.dumps(from_env)).shards == lc.addrs
        assert TOKEN.encode() not in pickle.dumps(from_env)
    finally:
        del os.environ["GEAR_TOKEN"]


def test_a_forked_child_makes_cluster_calls_of_its_own(local_cluster):
    """Cluster calls run on reused call threads; a child forked after the
    parent made calls has none of them (threads are not copied by fork)
    and must start its own instead of handing calls to a thread that does
    not exist there (which would hang)."""
    lc = local_cluster()
    cluster = gear.Cluster(lc.addrs, TOKEN, call_timeout=4.0, seed=5)
    batch = {"id": np.arange(4), "t": np.zeros(4, np.int32), "obs": np.zeros((4, OBS), np.uint8)}
    cluster.writer("round_robin").insert_batch(batch)
    pid = os.fork()
    if pid == 0:  # the child: a client of its own, calls, a clean exit code
        code = 1
        try:
            child = gear.Cluster(lc.addrs, TOKEN, call_timeout=4.0, seed=6)
            child.writer("round_robin").insert_batch(batch)
            code = 0 if sum(i["size"] for i in child.info()) == 8 else 3
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's cluster calls hung")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0
    cluster.writer("round_robin").insert_batch(batch)
    assert sum(i["size"] for i in cluster.info()) == 12


def test_from_file_reads_the_cluster_file(local_cluster):
    lc = local_cluster()
    path = lc.cluster_file(token=f'"{TOKEN}"', call_timeout_ms=2000)
    cluster = gear.Cluster.from_file(path)
    assert cluster.shards == lc.addrs and len(cluster.info()) == 3
    bad = path.with_name("bad.toml")
    bad.write_text('shards = ["a:1"]\ncolour = 1\n')
    with pytest.raises(gear.SpecError, match="colour"):
        gear.Cluster.from_file(bad)


def test_ctrl_c_interrupts_a_waiting_cluster_sample(local_cluster):
    lc = local_cluster(shards=1)
    code = f"""
import signal, threading, time, os, gear
# Started in the background of a non-interactive shell, the suite's
# children inherit SIGINT ignored (as test_waits' Ctrl-C child says).
signal.signal(signal.SIGINT, signal.default_int_handler)
cluster = gear.Cluster({lc.addrs!r}, {TOKEN!r})
sampler = cluster.sampler(4, window=2, timeout=None)
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
try:
    sampler.sample()
except KeyboardInterrupt:
    print("interrupted", round(time.monotonic() - t0, 2))
"""
    out = run_child(code, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("interrupted"), out.stdout + out.stderr
    assert float(out.stdout.split()[1]) < 2.0


def test_fifo_shards_and_overlong_windows_are_refused_clearly(local_cluster):
    lc = local_cluster(sampler="fifo")
    cluster = gear.Cluster(lc.addrs, TOKEN)
    with pytest.raises(gear.SpecError, match="fifo"):
        cluster.sampler(4, window=2)
    lc2 = local_cluster(shards=1)
    cluster2 = gear.Cluster(lc2.addrs, TOKEN)
    with pytest.raises(gear.SpecError, match="window length"):
        cluster2.sampler(4, window=MAX_LEN + 1)
    with pytest.raises(gear.SpecError, match="window length"):
        cluster2.sampler(4, window=MAX_LEN + 1, random_start=True)


def test_random_start_rows_are_whole_windows_starting_anywhere(local_cluster):
    # R2D2-style sequences across the shards: each row is `window` steps
    # of one trajectory from a random step, never padded while the
    # trajectory is long enough, and every start of a full window occurs.
    lc = local_cluster()
    cluster = gear.Cluster(lc.addrs, TOKEN)
    for tid in range(9):
        write(cluster, tid, MAX_LEN)
    write(cluster, 100, 3)  # shorter than the window: all its steps, padded
    window = 5
    sampler = cluster.sampler(64, window=window, random_start=True)
    starts = set()
    for _ in range(10):
        batch = sampler.sample()
        check_rows(batch)
        for r in range(64):
            tid = int(batch["id"][r, np.flatnonzero(batch.mask[r])[0]])
            if tid == 100:
                assert int(batch.lengths[r]) == 3 and int(batch.starts[r]) == 0
                continue
            assert int(batch.lengths[r]) == window and batch.mask[r].all()
            assert 0 <= int(batch.starts[r]) <= MAX_LEN - window
            starts.add(int(batch.starts[r]))
    assert starts == set(range(MAX_LEN - window + 1)), sorted(starts)
    # The offset is not used with random starts, as for a local table.
    batch = cluster.sampler(64, window=window, offset=0, random_start=True).sample()
    assert len(set(batch.starts.tolist())) > 1


def test_an_insert_that_fails_part_way_lists_what_was_committed(local_cluster):
    lc = local_cluster(max_len=1, capacity=64)
    cluster = gear.Cluster(lc.addrs, TOKEN, call_timeout=3.0)
    n = 30
    cols = {"id": np.arange(n, dtype=np.int64), "t": np.zeros(n, np.int32), "obs": np.zeros((n, OBS), np.uint8)}
    writer = cluster.writer("round_robin")
    writer.insert_batch({k: v[:3] for k, v in cols.items()})  # every shard answered once
    lc.servers[2].kill()
    with pytest.raises(gear.PartialInsertError) as e:
        writer.insert_batch(cols)
    err = e.value
    assert isinstance(err, gear.GearError)
    committed = dict(err.committed)
    assert len(committed) == 20 and set(err.keys["shard"].tolist()) == {0, 1}
    assert sorted(committed) == err.indices.tolist()
    # Exactly those are stored: resending the rest to live shards completes the batch.
    rest = np.setdiff1d(np.arange(n), err.indices)
    keys = cluster.writer(0).insert_batch({k: v[rest] for k, v in cols.items()})
    assert len(keys) == 10
    sizes = [i.get("size") for i in cluster.info()]
    assert sizes[:2] == [1 + 10 + 10, 1 + 10] and "error" in cluster.info()[2]


def test_a_round_robin_writer_moves_an_episode_a_full_shard_holds(local_cluster):
    """Per-shard rate limiters: a shard whose limiter holds writers back
    sends a round-robin writer's episode back after 100 ms and the writer
    tries the next shard (before, it waited there 30 s, while a trainer
    could wait on a shard starved of inserts). With every shard holding,
    the call fails once its deadline passes, storing nothing."""
    limiter = "[rate_limiter]\nmin_size_to_sample = 1\nsamples_per_insert = 1\nerror_buffer = 2\n"
    lc = local_cluster(shards=2, extra=limiter)
    cluster = gear.Cluster(lc.addrs, TOKEN, call_timeout=20.0)

    def episode(tid):
        rows = list(steps_of(tid, 4))
        return {k: np.stack([np.asarray(r[k]) for r in rows])[None] for k in rows[0]}

    # Shard 0 takes 3 inserts and no samples: its limiter holds the next.
    for tid in range(3):
        cluster.writer(0).insert_batch(episode(tid), steps=4)
    writer = cluster.writer("round_robin")
    keys = writer.insert_batch(episode(3), steps=4)
    assert keys["shard"].tolist() == [1], "the held episode should have gone to shard 1"
    info = cluster.info()
    assert [i["inserts"] for i in info] == [3, 1]
    assert [i["held_inserts"] for i in info] == [1, 0]
    # Shard 1 full too: nothing can go in before the call's deadline.
    for tid in range(4, 6):
        cluster.writer(1).insert_batch(episode(tid), steps=4)
    short = gear.Cluster(lc.addrs, TOKEN, call_timeout=1.0)
    with pytest.raises(gear.TimeoutError, match="rate limiter"):
        short.writer("round_robin").insert_batch(episode(6), steps=4)
    assert [i["inserts"] for i in cluster.info()] == [3, 3]
