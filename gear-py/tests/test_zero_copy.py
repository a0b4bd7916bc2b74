"""Batches are views of buffers they own: no copy, no reuse under a view."""

import numpy as np
import pytest

import gear
from conftest import require


def make_table():
    table = gear.Table([("obs", "float32", (8,)), ("r", "float64")], max_len=4, capacity=16, seed=1)
    for i in range(16):
        with table.writer().trajectory() as t:
            for s in range(4):
                t.append(obs=np.full(8, i * 10 + s, np.float32), r=float(i))
    return table


def test_column_arrays_point_into_the_batch_buffer():
    table = make_table()
    batch = table.sampler(batch_size=8, window=4).sample()
    start, size = batch.buffer.address, batch.buffer.nbytes
    for name, array in batch.columns.items():
        assert start <= array.ctypes.data and array.ctypes.data + array.nbytes <= start + size, name
        assert not array.flags.owndata
        assert array.base is batch.buffer


def test_dlpack_shares_memory_with_numpy():
    table = make_table()
    batch = table.sampler(batch_size=8, window=4).sample()
    view = np.from_dlpack(batch.dlpack("obs"))
    assert np.shares_memory(view, batch["obs"])
    assert view.ctypes.data == batch["obs"].ctypes.data
    np.testing.assert_array_equal(view, batch["obs"])
    assert batch.dlpack("obs").__dlpack_device__() == (1, 0)


def test_a_referenced_buffer_is_never_reused_and_a_released_one_is():
    table = make_table()
    sampler = table.sampler(batch_size=8, window=4)
    first = sampler.sample()
    obs = first["obs"]
    exported = np.from_dlpack(first.dlpack("r"))
    snapshot, r_snapshot = obs.copy(), exported.copy()
    address = first.buffer.address
    del first
    for _ in range(20):
        other = sampler.sample()
        assert other.buffer.address != address
        del other
    np.testing.assert_array_equal(obs, snapshot)
    np.testing.assert_array_equal(exported, r_snapshot)
    # Once nothing references it, the sampler takes it back.
    del obs, exported
    addresses = {sampler.sample().buffer.address for _ in range(8)}
    assert address in addresses


def test_sample_into_fills_the_callers_arrays():
    table = make_table()
    sampler = table.sampler(batch_size=8, window=4)
    out = {"obs": np.empty((8, 4, 8), np.float32), "r": np.empty((8, 4), np.float64)}
    batch = sampler.sample_into(out)
    assert batch["obs"] is out["obs"]
    for row in range(8):
        i = int(out["r"][row, 0])
        np.testing.assert_array_equal(out["obs"][row, :, 0], [i * 10 + s for s in range(4)])
    spec = sampler.output_spec()
    assert spec["obs"] == ("float32", (8, 4, 8))
    with pytest.raises(gear.StepError, match="dtype"):
        sampler.sample_into({"obs": np.empty((8, 4, 8), np.float64), "r": out["r"]})
    with pytest.raises(gear.StepError, match="shape"):
        sampler.sample_into({"obs": np.empty((8, 4, 7), np.float32), "r": out["r"]})
    with pytest.raises(gear.StepError, match="contiguous"):
        sampler.sample_into({"obs": np.empty((8, 4, 16), np.float32)[:, :, ::2], "r": out["r"]})


def test_torch_from_dlpack_shares_memory():
    torch = require("torch")
    table = make_table()
    batch = table.sampler(batch_size=8, window=4).sample()
    t = torch.from_dlpack(batch.dlpack("obs"))
    assert t.data_ptr() == batch["obs"].ctypes.data
    from gear.torch import to_tensors

    tensors = to_tensors(batch)
    assert tensors["obs"].data_ptr() == batch["obs"].ctypes.data
    out = torch.empty((8, 4, 8), dtype=torch.float32)
    table.sampler(batch_size=8, window=4, columns=["obs"]).sample_into({"obs": out})
    assert out.abs().sum() > 0
