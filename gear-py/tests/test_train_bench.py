"""The end-to-end training benchmark's own logic (gear-py/bench/train.py,
train_run.py, train_model.py), so it cannot rot: a tiny grid with GEAR
local only (no peers, nothing installed), the model's sizes and step, the
harness rate limiter, and the table and chart from given figures."""

import json
import math
import multiprocessing as mp
import os
import pathlib
import subprocess
import sys
import types

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import train  # noqa: E402
import train_run  # noqa: E402


def test_a_tiny_grid_runs_end_to_end_and_writes_table_jsonl_and_chart(tmp_path):
    pytest.importorskip("torch")
    cmd = [sys.executable, str(BENCH / "train.py"), "--systems", "gear-local", "--windows", "16",
           "--configs", "0:8,S:4", "--runs", "2", "--seconds", "0.5", "--warmup", "0.3", "--actors", "2", "--obs", "256",
           "--capacity", "8", "--out", str(tmp_path), "--python", f"gear-local={sys.executable}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert not [row for row in rows if "error" in row], rows
    assert sorted((row["run"], row["model"]) for row in rows) == [(1, "0"), (1, "S"), (2, "0"), (2, "S")]
    for row in rows:
        assert row["system"] == "gear-local" and row["window"] == 16 and row["obs"] == [256]
        # At least --min-steps (2) timed steps, however slow the machine.
        assert row["steps"] >= 2 and row["learner_steps_per_s"] > 0
        assert math.isclose(row["windows_per_s"], row["learner_steps_per_s"] * row["batch"], rel_tol=1e-9)
        assert 0 <= row["data_wait_share"] <= 1 and 0 <= row["update_share"] <= 1
        assert row["cpu_s_per_step"] > 0 and row["cpu_share"]["learner"] > 0
    # Without a model the learner consumes episodes faster than the limiter's
    # slack lasts, so the actors must have inserted while it ran (with one,
    # they may all be held back: the limit is reached and nothing is due).
    assert all(row["actor_steps_per_s"] > 0 and row["cpu_share"]["actors"] > 0
               for row in rows if row["model"] == "0"), rows
    s_rows = [row for row in rows if row["model"] == "S"]
    assert all(0.5e6 < row["parameters"] < 2e6 for row in s_rows), s_rows
    md = (tmp_path / "results.md").read_text()
    assert "| 0 | 16 | 8 | gear-local |" in md and "| S | 16 | 4 | gear-local |" in md, md
    svg = (tmp_path / "chart.svg").read_text()
    assert svg.startswith("<svg") and "<circle" in svg and "gear-local" in svg
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("gear-train-bench-")]


def test_model_sizes_are_about_1m_and_10m_parameters_and_a_step_returns_one_priority_per_row():
    torch = pytest.importorskip("torch")
    import train_model

    small = train_model.Learner("S", (84, 84), 512)
    medium = train_model.Learner("M", (84, 84), 512)
    assert 0.8e6 < small.parameters < 1.3e6, small.parameters
    assert 8e6 < medium.parameters < 12e6, medium.parameters
    b, t = 3, 8
    obs = torch.randint(0, 256, (b, t, 84, 84), dtype=torch.uint8)
    action = torch.randint(0, train_model.ACTIONS, (b, t))
    reward = torch.rand(b, t)
    before = [p.detach().clone() for p in small.model.parameters()]
    prio = small.step(obs, action, reward, None, torch.ones(b, dtype=torch.float64))
    assert prio.shape == (b,) and bool((prio > 0).all())
    assert any(not torch.equal(p0, p1) for p0, p1 in zip(before, small.model.parameters())), "Adam changed nothing"
    # Causal: a later frame does not change an earlier step's logits.
    model = small.model.eval()
    with torch.no_grad():
        a = model(obs, action, reward)
        obs2 = obs.clone()
        obs2[:, -1] = 255 - obs2[:, -1]
        c = model(obs2, action, reward)
    assert torch.allclose(a[:, :-1], c[:, :-1]) and not torch.allclose(a[:, -1], c[:, -1])


def test_the_harness_limiter_keeps_reverbs_ratio():
    spec = types.SimpleNamespace(spi=2.0, min_episodes=2, error_buffer=4.0)
    lim = train_run.SharedLimiter(mp.get_context("fork"), spec)
    # max_diff = 2 * 2 + 4 = 8: four episodes may go in before any sample.
    for _ in range(4):
        lim.wait_insert()
        lim.inserted_one()
    assert (lim.inserted.value + 1) * lim.spi - lim.sampled.value > lim.max_diff, "a fifth would pass the limit"
    # min_diff = 0: 8 samples may be drawn from 4 episodes, not a ninth.
    lim.wait_sample(8)
    assert lim.sampled.value == 8
    assert lim.inserted.value * lim.spi - (lim.sampled.value + 1) < lim.min_diff


def test_table_and_chart_from_given_figures_name_unavailable_systems():
    def row(system, steps, run):
        return {"system": system, "model": "0", "window": 128, "batch": 32, "learner_steps_per_s": steps,
                "windows_per_s": steps * 32, "data_wait_share": 0.9, "update_share": 0.05,
                "actor_steps_per_s": 1000.0, "cpu_s_per_step": 0.1, "cpu_share": {"learner": 1.0, "actors": 0.5},
                "parameters": 0, "run": run}

    rows = [row("gear-local", s, i) for i, s in enumerate((10.0, 30.0, 20.0))]
    rows += [row("cpprb", s, i) for i, s in enumerate((5.0, 4.0, 6.0))]
    rows.append({"system": "reverb", "window": 128, "run": 1, "error": "exit 1"})
    summary = train.summarise(rows)
    assert summary[("0", 128, 32, "gear-local")]["learner_steps_per_s"] == 20.0
    assert summary[("0", 128, 32, "cpprb")]["learner_steps_per_s"] == 5.0
    md = train.table(summary, ["gear-local", "cpprb", "reverb"], {"reverb": "no wheel | here"}, 3)
    assert "| 0 | 128 | 32 | cpprb | 5.00 | 160 | 90% | 5% | 1000 | 0.100 (1.00 / 0.50 / 0.00) | 4.00 |" in md, md
    assert "| 0 | 128 | 32 | reverb | unavailable: no wheel / here |" in md, md
    svg = train.chart(summary, ["gear-local", "cpprb", "reverb"], 32)
    assert svg.count("<circle") == 2 and "no model" in svg


class NumberedFeed:
    """A host feed whose n-th batch is filled with n; records updates."""

    def __init__(self, limit=None):
        import torch

        self.torch = torch
        self.n = 0
        self.limit = limit
        self.updates = []

    def next(self):
        if self.limit is not None and self.n >= self.limit:
            raise OSError("the table is closed")
        n = self.n
        self.n += 1
        t = self.torch
        return {"obs": t.full((4, 8, 16), n % 251, dtype=t.uint8), "reward": t.full((4, 8), float(n)),
                "weights": t.ones(4, dtype=t.float64)}, n

    def update(self, handle, priorities):
        self.updates.append((handle, priorities))


class CountingSampler:
    """Stands in for a prefetching gear sampler: its n-th batch holds
    `base + n`, made into tensors by the bench's transform; `close()` is
    recorded."""

    def __init__(self, base):
        self.base, self.n, self.closed = base, 0, False

    def sample(self):
        import numpy as np

        value = self.base + self.n
        self.n += 1
        columns = {"obs": np.full((4, 8, 16), value % 251, np.uint8), "action": np.full((4, 8), value, np.int64),
                   "reward": np.full((4, 8), float(value), np.float32)}
        return train_run.gear_tensors(types.SimpleNamespace(columns=columns, weights=np.ones(4), keys=value))

    def close(self):
        self.closed = True


def test_gear_source_takes_batches_round_robin_as_tensors_sharing_their_memory_and_closes_its_samplers():
    pytest.importorskip("torch")
    import numpy as np

    samplers = [CountingSampler(0), CountingSampler(1000)]
    source = train_run.GearSource(samplers, lambda keys, priorities: None)
    assert train_run.GearLocal.own_prefetch and train_run.GearCluster.own_prefetch
    assert train_run.GearSource.PREFETCH["prefetch"] == 1
    seen = []
    for _ in range(10):
        cols, key = source.next()
        assert bool((cols["obs"] == key % 251).all()) and bool((cols["reward"] == key).all()), key
        assert cols["weights"].dtype.is_floating_point and tuple(cols["action"].shape) == (4, 8)
        seen.append(key)
    assert seen == [0, 1000, 1, 1001, 2, 1002, 3, 1003, 4, 1004]
    source.close()
    assert all(s.closed for s in samplers)
    batch = types.SimpleNamespace(columns={"obs": np.zeros((2, 3, 4), np.uint8), "action": np.zeros((2, 3), np.int64),
                                           "reward": np.zeros((2, 3), np.float32)}, weights=np.ones(2), keys="k")
    cols, keys = train_run.gear_tensors(batch)
    assert keys == "k" and np.shares_memory(cols["obs"].numpy(), batch.columns["obs"])


def test_device_feed_hands_over_every_batch_in_order_and_never_overwrites_the_one_in_use():
    torch = pytest.importorskip("torch")
    import time

    import train_device

    inner = NumberedFeed()
    feed = train_device.DeviceFeed(inner, torch.device("cpu"))
    try:
        for n in range(20):
            cols, handle = feed.next()
            assert handle == n
            # The stager fills every other slot meanwhile; the held one stays.
            time.sleep(0.01)
            assert bool((cols["obs"] == n % 251).all()) and bool((cols["reward"] == n).all()), n
            assert cols["weights"].dtype == torch.float64
            feed.update(handle, [float(n)])
        # At most the other slots are staged ahead: it never runs away.
        assert inner.n <= 20 + train_device.DEPTH
        assert [h for h, _ in inner.updates] == list(range(20))
    finally:
        feed.close()


def test_device_feed_reports_the_inner_feeds_error_and_rejects_missing_devices():
    torch = pytest.importorskip("torch")
    import train_device

    feed = train_device.DeviceFeed(NumberedFeed(limit=2), torch.device("cpu"))
    try:
        feed.next()
        feed.next()
        with pytest.raises(RuntimeError, match="staging to cpu failed.*the table is closed"):
            feed.next()
    finally:
        feed.close()
    with pytest.raises(ValueError, match="depth must be at least 2"):
        train_device.DeviceFeed(NumberedFeed(), torch.device("cpu"), depth=1)
    with pytest.raises(ValueError, match="only cpu and cuda"):
        train_device.resolve("meta")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch sees no CUDA device"):
            train_device.resolve("cuda")


def test_the_learner_trains_through_the_device_path(tmp_path):
    pytest.importorskip("torch")
    cmd = [sys.executable, str(BENCH / "train_run.py"), "--system", "gear-local", "--window", "8", "--configs",
           "0:4,S:2", "--actors", "1", "--obs", "64", "--capacity", "4", "--min-episodes", "1", "--seconds", "0.3",
           "--warmup", "0.2", "--device", "cpu"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    # The largest model first (a faster learner would leave the limiter's slack drained).
    assert [(row["model"], row["device"]) for row in rows] == [("S", "cpu"), ("0", "cpu")], rows
    assert all(row["steps"] >= 2 and 0 <= row["data_wait_share"] <= 1 for row in rows), rows
    if not __import__("torch").cuda.is_available():
        bad = subprocess.run(cmd[:-1] + ["cuda"], capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and "torch sees no CUDA device" in bad.stderr, bad.stderr


def test_async_priority_updates_arrive_in_order_and_report_errors():
    import threading
    import time

    seen, gate = [], threading.Event()

    def slow(handle, priorities):
        gate.wait(5)
        seen.append((handle, list(priorities)))

    u = train_run.AsyncUpdates(slow)
    t = time.perf_counter()
    u.submit(1, [0.5])  # taken by the thread, which waits on the gate
    u.submit(2, [0.25])  # queued: submit returns without waiting
    assert time.perf_counter() - t < 2 and seen == []
    gate.set()
    u.close()
    assert seen == [(1, [0.5]), (2, [0.25])]
    u.close()  # idempotent

    def failing(handle, priorities):
        raise ValueError(f"stale handle {handle}")

    u = train_run.AsyncUpdates(failing)
    u.submit(7, [1.0])
    u.close()
    with pytest.raises(RuntimeError, match="stale handle 7"):
        u.check()
    with pytest.raises(RuntimeError, match="stale handle 7"):
        u.submit(8, [1.0])


@pytest.mark.parametrize("argument, named", [
    (["--windows", "0"], "--windows"), (["--windows", "1001"], "--windows"), (["--windows", "abc"], "--windows"),
    (["--configs", "X:32"], "--configs"), (["--configs", "0:0"], "--configs"), (["--configs", "S"], "--configs"),
    (["--actors", "0"], "--actors"), (["--seconds", "-1"], "--seconds"), (["--seconds", "nan"], "--seconds"),
    (["--warmup", "-1"], "--warmup"), (["--obs", "-5"], "--obs"), (["--capacity", "0"], "--capacity"),
    (["--runs", "0"], "--runs"),
])
def test_absurd_arguments_are_refused_by_name_before_anything_is_installed(tmp_path, argument, named):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(BENCH / "train.py"), "--out", str(out), *argument],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert named in r.stderr.splitlines()[-1], r.stderr
    assert not out.exists(), "something was made before the arguments were checked"
