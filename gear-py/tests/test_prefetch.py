"""Samplers that draw ahead on a Rust thread (`sampler(..., prefetch=N)`):
every row exact, kept batches never overwritten, a transform applied on
the thread, timeouts raised in their turn with sampling going on, a
closed table ending iteration, close() and the arguments refused, the
thread scheduled so that a take's wake-up never preempts the learner."""

import os
import sys
import threading
import time

import numpy as np
import pytest

import gear
from conftest import run_child

MAX_LEN = 12


def table_with(n: int, **kwargs) -> gear.Table:
    """A table of `n` trajectories; step t of trajectory i holds id=i, t=t."""
    table = gear.Table([("id", "int64"), ("t", "int64")], max_len=MAX_LEN, capacity=64, **kwargs)
    write(table, range(n))
    return table


def write(table: gear.Table, ids) -> None:
    writer = table.writer()
    for i in ids:
        n = 1 + i % MAX_LEN
        with writer.trajectory() as traj:
            for t in range(n):
                traj.append(id=i, t=t)


def check_rows(batch) -> None:
    """Every valid step of every row is the step it claims to be."""
    for r in range(batch["id"].shape[0]):
        valid = np.flatnonzero(batch.mask[r])
        assert len(valid) == batch.lengths[r] >= 1
        ids = batch["id"][r, valid]
        assert (ids == ids[0]).all()
        assert (batch["t"][r, valid] == batch.starts[r] + np.arange(len(valid))).all()


def test_prefetched_batches_are_exact_and_kept_ones_never_change():
    table = table_with(40)
    sampler = table.sampler(16, 4, offset=0, prefetch=3)
    assert sampler.prefetch == 3
    kept = [sampler.sample() for _ in range(5)]
    copies = [(b["id"].copy(), b["t"].copy(), b.keys.copy()) for b in kept]
    for _, batch in zip(range(50), sampler):
        check_rows(batch)
        table.update_priorities(batch.keys, np.full(16, 2.0))
    for b, (ids, ts, keys) in zip(kept, copies):
        check_rows(b)
        assert np.array_equal(b["id"], ids) and np.array_equal(b["t"], ts) and np.array_equal(b.keys, keys)
    # Zero copy: the columns are views of the batch's own buffer.
    assert kept[0]["id"].base is not None and kept[0].buffer is not None
    table.close()


def threads_named(name: str):
    """Thread ids of this process whose name is `name`."""
    tids = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == name:
                    tids.append(int(tid))
        except FileNotFoundError:  # ended meanwhile
            pass
    return tids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_BATCH is Linux's")
def test_the_prefetch_thread_is_a_batch_thread_and_the_callers_is_untouched():
    """A take wakes the prefetch thread; as an ordinary thread it often ran
    at once on the learner's core and drew the next batch before the take
    returned (ms instead of µs). As a SCHED_BATCH thread it never preempts
    the thread that woke it."""
    table = table_with(40)
    callers_policy = os.sched_getscheduler(0)
    before = set(threads_named("gear-prefetch"))
    sampler = table.sampler(16, 4, offset=0, prefetch=1)
    check_rows(sampler.sample())
    ours = [t for t in threads_named("gear-prefetch") if t not in before]
    assert len(ours) == 1, ours
    assert os.sched_getscheduler(ours[0]) == os.SCHED_BATCH
    assert os.sched_getscheduler(0) == callers_policy
    sampler.close()
    table.close()


def test_a_transform_runs_on_the_prefetch_thread_and_its_error_ends_sampling():
    table = table_with(40)
    main = threading.get_ident()
    threads = set()

    def as_tuple(batch):
        threads.add(threading.get_ident())
        return ("made", batch["id"].copy(), batch.keys)

    sampler = table.sampler(8, 3, offset=0, prefetch=2, transform=as_tuple)
    for _, got in zip(range(10), sampler):
        tag, ids, keys = got
        assert tag == "made" and ids.shape == (8, 3) and len(keys) == 8
    assert threads and main not in threads
    calls = []

    def failing(batch):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("transform failed on purpose")
        return batch

    sampler = table.sampler(8, 3, prefetch=1, transform=failing)
    check_rows(sampler.sample())
    check_rows(sampler.sample())
    with pytest.raises(ValueError, match="on purpose"):
        sampler.sample()
    with pytest.raises(gear.GearError, match="on purpose"):
        sampler.sample()
    with pytest.raises(gear.SpecError, match="prefetch"):
        table.sampler(8, 3, transform=as_tuple)
    with pytest.raises(gear.SpecError, match="callable"):
        table.sampler(8, 3, prefetch=1, transform=5)
    table.close()


def test_a_transform_sampling_its_own_sampler_is_an_error_not_a_hang():
    out = run_child("""
import sys, numpy as np, gear
t = gear.Table([("v", "int64")], max_len=1, capacity=8)
t.writer().insert_batch({"v": np.arange(4, dtype=np.int64)})
holder = {}
s = t.sampler(2, prefetch=1, transform=lambda b: holder["s"].sample())
holder["s"] = s
try:
    s.sample()
except Exception as e:
    print(type(e).__name__, e)
    sys.exit(0)
sys.exit(3)
""", timeout=60)
    assert out.returncode == 0, out.stderr
    assert "cannot sample from that sampler" in out.stdout or "borrowed" in out.stdout, out.stdout


def test_a_timeout_is_raised_in_its_turn_and_sampling_goes_on():
    table = gear.Table([("id", "int64"), ("t", "int64")], max_len=MAX_LEN, capacity=64)
    sampler = table.sampler(4, 2, timeout=0.3, prefetch=2)
    t0 = time.monotonic()
    with pytest.raises(gear.TimeoutError):
        sampler.sample()
    assert 0.2 < time.monotonic() - t0 < 5
    write(table, range(8))
    deadline = time.monotonic() + 10
    while True:
        try:
            check_rows(sampler.sample())
            break
        except gear.TimeoutError:
            # Timeouts queued before the table held data come first.
            assert time.monotonic() < deadline
    table.close()


def test_closing_the_table_ends_iteration():
    table = table_with(8)
    sampler = table.sampler(4, 2, prefetch=2)
    check_rows(sampler.sample())
    table.close()
    deadline = time.monotonic() + 10
    for batch in sampler:  # ready batches first, then the end
        assert time.monotonic() < deadline
    with pytest.raises(gear.ClosedError):
        sampler.sample()


def test_close_stops_the_thread_promptly_and_later_samples_raise():
    table = table_with(8)
    sampler = table.sampler(4, 2, prefetch=4)
    check_rows(sampler.sample())
    time.sleep(0.2)  # the channel is full: the thread is blocked handing a batch over
    t0 = time.monotonic()
    sampler.close()
    sampler.close()  # idempotent
    assert time.monotonic() - t0 < 2
    with pytest.raises(gear.GearError, match="closed"):
        sampler.sample()
    # The table is untouched: a new sampler draws from it.
    check_rows(table.sampler(4, 2).sample())
    table.close()


def test_sample_into_and_absurd_depths_are_refused():
    table = table_with(8)
    sampler = table.sampler(4, 2, prefetch=1)
    with pytest.raises(gear.SpecError, match="prefetch"):
        sampler.sample_into({"id": np.empty((4, 2), np.int64), "t": np.empty((4, 2), np.int64)})
    check_rows(sampler.sample())
    with pytest.raises(gear.SpecError, match="prefetch must be"):
        table.sampler(4, 2, prefetch=10**6)
    with pytest.raises(OverflowError):
        table.sampler(4, 2, prefetch=-1)
    assert table.sampler(4, 2).prefetch == 0
    table.close()


def test_a_forked_child_is_told_to_make_its_own_sampler():
    out = run_child("""
import os, sys, numpy as np, gear
t = gear.Table([("v", "int64")], max_len=1, capacity=8)
t.writer().insert_batch({"v": np.arange(4, dtype=np.int64)})
s = t.sampler(2, prefetch=2)
s.sample()
pid = os.fork()
if pid == 0:
    try:
        s.sample()
        os._exit(3)
    except gear.SpecError as e:
        os._exit(0 if "forked child" in str(e) else 4)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
""", timeout=60)
    assert out.returncode == 0, out.stderr


def test_a_process_exiting_with_a_prefetching_sampler_exits_cleanly():
    out = run_child("""
import numpy as np, gear
t = gear.Table([("v", "int64")], max_len=1, capacity=8)
t.writer().insert_batch({"v": np.arange(4, dtype=np.int64)})
s = t.sampler(2, prefetch=4)
s.sample()
print("ok")
""", timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_process_exits_cleanly_while_the_thread_is_inside_a_transform():
    """The thread is in Python (making batches, running a transform) when
    the main thread exits: the module's atexit hook ends it first (a
    thread letting go of the GIL during finalization aborted the process,
    in about a third of such exits)."""
    code = """
import sys, time, numpy as np, gear
t = gear.Table([("v", "int64"), ("o", "uint8", (4096,))], max_len=8, capacity=64)
t.writer().insert_batch({"v": np.zeros((16, 8), np.int64), "o": np.zeros((16, 8, 4096), np.uint8)}, steps=8)
def slow(batch):
    time.sleep(float(sys.argv[1]))
    return batch
s = t.sampler(4, 4, prefetch=4, transform=slow)
s.sample()
print("ok", flush=True)
"""
    for delay in ("0", "0.001", "0.01") * 4:
        out = run_child(code, delay, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == "ok", (delay, out.returncode, out.stderr[-500:])
