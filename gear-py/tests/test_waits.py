"""Rate-limiter timeouts, the GIL released while waiting, Ctrl-C."""

import os
import signal
import threading
import time

import numpy as np
import pytest

import gear
from conftest import run_child


def one_step_table(**kwargs):
    return gear.Table([("v", "int64")], max_len=1, capacity=64, **kwargs)


def test_sampling_an_empty_table_times_out():
    table = one_step_table(rate_limiter=gear.RateLimiter.min_size(2))
    started = time.monotonic()
    with pytest.raises(gear.TimeoutError, match="timed out after"):
        table.sampler(batch_size=1, timeout=0.3).sample()
    assert time.monotonic() - started >= 0.3


def test_info_lists_a_waiting_writer_with_its_limit_until_it_is_released():
    limiter = gear.RateLimiter.sample_to_insert_ratio(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=2.0)
    table = one_step_table(rate_limiter=limiter)
    writer = table.writer(timeout=30.0)
    for i in range(3):
        with writer.trajectory() as t:
            t.append(v=i)
    assert table.info()["waiting"] == [] and table.info()["waiting_writers"] == 0
    blocked = threading.Thread(target=lambda: writer.insert_batch({"v": np.arange(1)}))
    blocked.start()
    deadline = time.monotonic() + 10
    while not table.info()["waiting"]:
        assert time.monotonic() < deadline, "the blocked writer was never listed"
        time.sleep(0.01)
    info = table.info()
    (w,) = info["waiting"]
    assert (w["role"], w["reason"], w["pid"]) == ("writer", "samples per insert", os.getpid())
    assert w["waited_s"] >= 0 and abs(w["since"] - time.time()) < 60
    assert (info["waiting_writers"], info["waiting_samplers"]) == (1, 0)
    table.sampler(batch_size=1, timeout=5).sample()
    blocked.join(timeout=30)
    assert not blocked.is_alive() and table.info()["waiting"] == []


def test_the_ratio_limiter_blocks_writers_and_samplers():
    limiter = gear.RateLimiter.sample_to_insert_ratio(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=2.0)
    table = one_step_table(rate_limiter=limiter)
    writer = table.writer(timeout=0.2)
    inserted = 0
    with pytest.raises(gear.TimeoutError):
        for i in range(10):
            with writer.trajectory() as t:
                t.append(v=i)
            inserted += 1
    assert 1 <= inserted < 10
    with pytest.raises(gear.TimeoutError):
        writer.insert_batch({"v": np.arange(4)})
    sampler = table.sampler(batch_size=1, timeout=0.2)
    sampled = 0
    with pytest.raises(gear.TimeoutError):
        for _ in range(20):
            sampler.sample()
            sampled += 1
    assert 1 <= sampled < 20


def test_a_thread_runs_while_another_blocks_in_sample():
    table = one_step_table()
    sampler = table.sampler(batch_size=1, timeout=5.0)
    result = {}

    def learner():
        result["batch"] = sampler.sample()

    thread = threading.Thread(target=learner)
    thread.start()
    # The learner waits in Rust; with the GIL held this loop could not run.
    counter = 0
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        counter += 1
    assert thread.is_alive(), "sample returned from an empty table"
    assert counter > 1000
    with table.writer().trajectory() as t:
        t.append(v=7)
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert int(result["batch"]["v"][0, 0]) == 7


def test_a_thread_writes_while_another_samples_in_a_loop():
    table = gear.Table([("obs", "float32", (1024,))], max_len=8, capacity=256)
    stop = threading.Event()
    errors = []

    def actor():
        w = table.writer()
        try:
            while not stop.is_set():
                w.insert_batch({"obs": np.ones((16, 1024), np.float32)})
        except Exception as e:  # surfaced by the assertion below
            errors.append(e)

    thread = threading.Thread(target=actor)
    thread.start()
    try:
        sampler = table.sampler(batch_size=32, window=1, timeout=10.0)
        for _ in range(50):
            assert sampler.sample()["obs"].sum() == 32 * 1024
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not errors


CTRL_C_CHILD = """
import signal, sys, time, numpy as np, gear
# A runner that starts this suite in the background of a non-interactive
# shell passes SIGINT down ignored, and Python then never raises
# KeyboardInterrupt; what is tested here is gear's waits, so restore it.
signal.signal(signal.SIGINT, signal.default_int_handler)
table = gear.Table([("v", "int64")], max_len=1, capacity=4, rate_limiter=gear.RateLimiter.queue(2))
writer = table.writer(timeout=None)
if sys.argv[1] == "sample":
    wait = table.sampler(batch_size=1, timeout=None).sample
elif sys.argv[1] == "sample-prefetch":
    wait = table.sampler(batch_size=1, timeout=None, prefetch=2).sample
else:
    writer.insert_batch({"v": np.zeros(2, np.int64)})  # the queue is full now
    wait = writer.trajectory if sys.argv[1] == "trajectory" else lambda: writer.insert_batch({"v": np.zeros(1, np.int64)})
print("waiting", flush=True)
started = time.monotonic()
try:
    wait()
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - started:.2f}", flush=True)
    sys.exit(0)
sys.exit(3)
"""


@pytest.mark.parametrize("blocked_in", ["sample", "sample-prefetch", "trajectory", "insert_batch"])
def test_ctrl_c_interrupts_a_blocked_wait(blocked_in):
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", CTRL_C_CHILD, blocked_in], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "waiting"
        time.sleep(0.5)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    assert "interrupted" in out


def test_run_child_helper_reports_failures():
    done = run_child("import sys; sys.exit(4)", timeout=30)
    assert done.returncode == 4
