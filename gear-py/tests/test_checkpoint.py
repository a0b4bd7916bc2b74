"""Checkpoints from Python: written while the table is used, restored with
everything (rows, keys, priorities), refused when corrupt, truncated or of
another spec, and never half-written by a process killed mid-checkpoint."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import gear

COLUMNS = [("obs", "float32", (3,)), ("action", "int64")]


def filled_table(**kw):
    table = gear.Table(COLUMNS, max_len=8, capacity=64, sampler="prioritized", seed=5, **kw)
    for i in range(20):
        with table.writer().trajectory() as t:
            for s in range(1 + i % 8):
                t.append(obs=np.full(3, i + s / 10, np.float32), action=i)
    return table


def rows(table):
    """Every stored trajectory: {(action, steps, obs bytes)}, drawn until
    all `len(table)` were seen."""
    sampler = table.sampler(256, window=8, offset=0, timeout=1)
    out = set()
    for _ in range(100):
        b = sampler.sample()
        for r in range(b.rows):
            n = int(b.lengths[r])
            out.add((int(b["action"][r, 0]), n, b["obs"][r, :n].tobytes()))
        if len(out) == len(table):
            break
    return out


def test_checkpoint_and_restore_bring_back_every_trajectory_and_priority(tmp_path):
    table = filled_table()
    before = rows(table)
    assert len(before) == 20
    keys = table.sampler(20, window=1, timeout=1).sample().keys
    table.update_priorities(keys[:1], [1e6])
    report = table.checkpoint(tmp_path / "t.gear")
    assert report["trajectories"] == 20 and report["file_bytes"] > report["data_bytes"] > 0
    assert pytest.approx(report["elapsed_s"], abs=60) == report["elapsed_s"] and report["pause_s"] >= 0
    restored = gear.Table.restore(tmp_path / "t.gear", COLUMNS, max_len=8, capacity=64, sampler="prioritized")
    assert len(restored) == 20
    # The key with the huge priority is still the one drawn (keys and
    # priorities survive).
    b = restored.sampler(64, window=1).sample()
    assert (b.keys == keys[0]).mean() > 0.9
    assert restored.update_priorities(keys[:1], [1.0]) == 1
    assert rows(restored) == before


def test_checkpoint_into_keeps_the_newest_and_restore_reads_the_newest(tmp_path):
    table = filled_table()
    ckpts = tmp_path / "ckpts"
    for _ in range(4):
        table.checkpoint_into(ckpts, keep=2)
    with table.writer().trajectory() as t:
        t.append(obs=np.zeros(3, np.float32), action=99)
    last = table.checkpoint_into(ckpts, keep=2)
    assert sorted(os.listdir(ckpts)) == ["checkpoint-0000000004.gear", "checkpoint-0000000005.gear"]
    assert os.path.basename(last["path"]) == "checkpoint-0000000005.gear"
    restored = gear.Table.restore(ckpts, COLUMNS, max_len=8, capacity=64, sampler="prioritized")
    assert len(restored) == 21


def test_corrupted_truncated_and_other_spec_checkpoints_are_refused(tmp_path):
    table = filled_table()
    path = tmp_path / "t.gear"
    table.checkpoint(path)
    data = bytearray(path.read_bytes())
    bad = tmp_path / "flipped.gear"
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(gear.CheckpointError, match="flipped.gear"):
        gear.Table.restore(bad, COLUMNS, max_len=8, capacity=64)
    short = tmp_path / "short.gear"
    short.write_bytes(path.read_bytes()[: len(data) // 3])
    with pytest.raises(gear.CheckpointError, match="short.gear"):
        gear.Table.restore(short, COLUMNS, max_len=8, capacity=64)
    with pytest.raises(gear.CheckpointError):
        gear.Table.restore(path, [("obs", "float32", (4,)), ("action", "int64")], max_len=8, capacity=64)
    with pytest.raises(gear.CheckpointError, match="missing"):
        gear.Table.restore(tmp_path / "missing.gear", COLUMNS, max_len=8, capacity=64)
    # A refused restore made no table; the original is intact.
    assert gear.Table.restore(path, COLUMNS, max_len=8, capacity=64, sampler="prioritized").inserts >= 0
    assert issubclass(gear.CheckpointError, gear.GearError)


def test_a_process_killed_while_checkpointing_leaves_a_restorable_file(tmp_path):
    path = tmp_path / "t.gear"
    first = gear.Table(COLUMNS, max_len=8, capacity=4096)
    first.writer().insert_batch({"obs": np.ones((20, 3), np.float32), "action": np.ones(20, np.int64)})
    first.checkpoint(path)
    code = f"""
import numpy as np, gear
table = gear.Table({COLUMNS!r}, max_len=8, capacity=4096)
table.writer().insert_batch({{"obs": np.ones((4096, 8, 3), np.float32), "action": np.ones((4096, 8), np.int64)}},
                            steps=8)
print("ready", flush=True)
while True:
    table.checkpoint({str(path)!r})
"""
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
    restored = gear.Table.restore(path, COLUMNS, max_len=8, capacity=4096)
    assert len(restored) in (20, 4096)


def test_checkpoint_targets_that_are_not_regular_files_are_refused_and_left_alone(tmp_path, not_regular_targets):
    targets, kept = not_regular_targets
    table = filled_table()
    for target, words in targets:
        with pytest.raises(gear.CheckpointError, match=words):
            table.checkpoint(target)
    assert kept.read_bytes() == b"not mine"
    assert not [p for p in tmp_path.iterdir() if ".tmp." in p.name]
    # A regular file is replaced; a checkpoint directory that is a file is refused.
    table.checkpoint(kept)
    assert len(gear.Table.restore(kept, COLUMNS, max_len=8, capacity=64, sampler="prioritized")) == 20
    with pytest.raises(gear.CheckpointError):
        table.checkpoint_into(kept, keep=2)
