"""Several processes on one shared table: attach by name, write while
another samples, a writer killed with SIGKILL, multiprocessing."""

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import gear
from conftest import run_child

WRITER_CHILD = """
import sys, numpy as np, gear
table = gear.Table.attach(sys.argv[1], timeout=10)
w = table.writer(timeout=10)
for i in range(200):
    with w.trajectory() as t:
        for s in range(4):
            t.append(obs=np.full(16, i, np.float32), step=s)
print("wrote", table.info()["inserts"], flush=True)
"""


def make_shared(name, capacity=64):
    return gear.Table([("obs", "float32", (16,)), ("step", "int32")], max_len=4, capacity=capacity, name=name)


def test_a_second_process_attaches_and_writes_while_this_one_samples(shm_name):
    table = make_shared(shm_name)
    child = subprocess.Popen([sys.executable, "-c", WRITER_CHILD, shm_name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        sampler = table.sampler(batch_size=8, window=4, timeout=20.0)
        batches = 0
        while child.poll() is None or batches < 20:
            batch = sampler.sample()
            # Every row is one whole trajectory: one value, steps 0..3.
            for r in range(8):
                obs = batch["obs"][r]
                assert (obs == obs[0, 0]).all()
                np.testing.assert_array_equal(batch["step"][r], [0, 1, 2, 3])
            batches += 1
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    assert "wrote" in out
    assert table.info()["inserts"] == 200
    assert batches >= 20


KILLED_CHILD = """
import sys, numpy as np, gear
table = gear.Table.attach(sys.argv[1], timeout=10)
w = table.writer()
t = w.trajectory()
t.append(obs=np.ones(16, np.float32), step=1)
open(sys.argv[2], "w").close()
import time
time.sleep(60)  # killed here, mid-trajectory
"""


def test_a_writer_killed_with_sigkill_loses_only_its_unfinished_trajectory(shm_name, tmp_path):
    table = make_shared(shm_name, capacity=4)
    ready = tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, shm_name, str(ready)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert child.poll() is None, child.stderr.read()
            assert time.monotonic() < deadline, "child never started writing"
            time.sleep(0.05)
        assert table.info()["slots_writing"] == 1
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
    # Its slot comes back: the published step is committed as a shorter trajectory.
    deadline = time.monotonic() + 10
    while table.info()["slots_writing"] and time.monotonic() < deadline:
        table.reclaim_dead()
        time.sleep(0.05)
    info = table.info()
    assert info["slots_writing"] == 0
    assert info["reclaimed"] == 1
    w = table.writer(timeout=5)
    for i in range(4):  # the whole capacity is usable
        with w.trajectory() as t:
            t.append(obs=np.zeros(16, np.float32), step=i)
    assert len(table) == 4


def child_writes(table, n):
    w = table.writer(timeout=10)
    w.insert_batch({"obs": np.ones((n, 16), np.float32), "step": np.zeros(n, np.int32)})


def test_multiprocessing_children_get_the_table_by_pickling(shm_name):
    table = make_shared(shm_name)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=child_writes, args=(table, 5)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert table.info()["inserts"] == 10


def test_attach_to_a_missing_table_fails_clearly(shm_name):
    with pytest.raises(gear.GearError, match=shm_name):
        gear.Table.attach(shm_name, timeout=1)


def test_attachers_see_the_creators_close(shm_name):
    table = make_shared(shm_name)
    code = """
import sys, gear
t = gear.Table.attach(sys.argv[1])
try:
    t.sampler(1, timeout=20).sample()
except gear.ClosedError as e:
    print("closed:", e)
"""
    child = subprocess.Popen([sys.executable, "-c", code, shm_name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        table.close()
        out, err = child.communicate(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
    assert "closed: table is closed" in out, err
    assert run_child("import gear").returncode == 0
