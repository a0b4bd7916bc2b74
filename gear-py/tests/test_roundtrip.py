"""Every dtype through a table and back; windows, masks, lengths, starts;
insert_batch."""

import numpy as np
import pytest

import gear

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def values(dtype: str, shape, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype == "bfloat16":  # raw bits, as uint16
        return rng.integers(0, 2**16, size=shape, dtype=np.uint16)
    if dtype.startswith("float"):
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_round_trips(dtype):
    table = gear.Table([("x", dtype, (2, 3)), ("y", dtype)], max_len=6, capacity=4)
    xs = values(dtype, (6, 2, 3), 1)
    ys = values(dtype, (6,), 2)
    with table.writer().trajectory() as t:
        for x, y in zip(xs, ys):
            t.append(x=x, y=y)
    batch = table.sampler(batch_size=3).sample()
    want = "uint16" if dtype == "bfloat16" else dtype
    assert batch["x"].dtype == np.dtype(want)
    assert batch["x"].shape == (3, 6, 2, 3)
    assert batch["y"].shape == (3, 6)
    for r in range(3):
        np.testing.assert_array_equal(batch["x"][r], xs)
        np.testing.assert_array_equal(batch["y"][r], ys)
    assert list(batch.lengths) == [6, 6, 6]
    assert batch.mask.all()


def fill(table, lengths):
    """One trajectory per length; step t of trajectory i holds 100*i + t + 1."""
    keys = []
    for i, n in enumerate(lengths):
        with table.writer().trajectory() as t:
            for s in range(n):
                t.append(v=np.int32(100 * i + s + 1))
        keys.append(t.key)
    return keys


def test_last_steps_window_is_head_padded_with_a_mask():
    table = gear.Table([("v", "int32")], max_len=10, capacity=4, sampler="fifo", remover="fifo")
    fill(table, [2])
    batch = table.sampler(batch_size=1, window=4).sample()
    np.testing.assert_array_equal(batch["v"][0], [0, 0, 1, 2])
    np.testing.assert_array_equal(batch.mask[0], [False, False, True, True])
    assert batch.lengths[0] == 2


def test_offset_window_is_tail_padded_and_starts_are_reported():
    table = gear.Table([("v", "int32")], max_len=10, capacity=4, sampler="fifo")
    fill(table, [5])
    s = table.sampler(batch_size=1, window=4, offset=3)
    batch = s.sample()
    np.testing.assert_array_equal(batch["v"][0], [4, 5, 0, 0])
    np.testing.assert_array_equal(batch.mask[0], [True, True, False, False])
    assert batch.starts[0] == 3
    head = table.sampler(batch_size=1, window=4, offset=-3, pad="head").sample()
    np.testing.assert_array_equal(head["v"][0], [0, 3, 4, 5])
    whole = table.sampler(batch_size=1).sample()
    assert whole["v"].shape == (1, 10)
    np.testing.assert_array_equal(whole["v"][0][:5], [1, 2, 3, 4, 5])


def test_random_start_windows_are_whole_windows_of_the_trajectory():
    table = gear.Table([("v", "int32")], max_len=20, capacity=4, seed=3)
    fill(table, [20])
    s = table.sampler(batch_size=64, window=5, random_start=True)
    batch = s.sample()
    starts = set()
    for r in range(64):
        row = batch["v"][r]
        start = int(batch.starts[r])
        np.testing.assert_array_equal(row, np.arange(start + 1, start + 6))
        starts.add(start)
    assert len(starts) > 5, "random starts should vary"


def test_column_subset_sampler():
    table = gear.Table([("v", "int32"), ("w", "float32", (3,))], max_len=4, capacity=4)
    with table.writer().trajectory() as t:
        t.append(v=1, w=[1.0, 2.0, 3.0])
    batch = table.sampler(batch_size=2, columns=["w"]).sample()
    assert list(batch.columns) == ["w"]
    assert "v" not in batch


def test_insert_batch_of_transitions_and_of_sequences():
    table = gear.Table([("obs", "float32", (4,)), ("act", "int64")], max_len=3, capacity=1000)
    obs = np.arange(256 * 4, dtype=np.float32).reshape(256, 4)
    act = np.arange(256, dtype=np.int64)
    keys = table.writer().insert_batch({"obs": obs, "act": act})
    assert keys.dtype == np.uint64 and len(keys) == 256 and len(set(keys.tolist())) == 256
    assert len(table) == 256
    batch = table.sampler(batch_size=64, window=1).sample()
    for r in range(64):
        a = int(batch["act"][r, 0])
        np.testing.assert_array_equal(batch["obs"][r, 0], obs[a])
    seq = np.arange(10 * 3 * 4, dtype=np.float32).reshape(10, 3, 4)
    keys = table.writer().insert_batch({"obs": seq, "act": np.zeros((10, 3), np.int64)}, steps=3, priorities=np.ones(10))
    assert len(keys) == 10


def test_iteration_stops_when_the_table_is_closed():
    table = gear.Table([("v", "int32")], max_len=2, capacity=4)
    fill(table, [1])
    sampler = table.sampler(batch_size=2)
    seen = 0
    for batch in sampler:
        seen += 1
        assert batch.rows == 2
        if seen == 3:
            table.close()
    assert seen == 3


def test_sequence_priority_matches_the_r2d2_formula():
    d = np.array([1.0, -3.0, 2.0])
    assert gear.sequence_priority(d, eta=0.9) == pytest.approx(0.9 * 3 + 0.1 * 2)
