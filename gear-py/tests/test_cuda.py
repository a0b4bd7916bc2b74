"""The CUDA sampler through Python (wheels built with the `cuda` feature;
skipped otherwise). Without a usable GPU it must fail with a clear
GearError, unless GEAR_REQUIRE_GPU=1 demands one."""

import os

import numpy as np
import pytest

import gear

if not hasattr(gear._gear, "CudaSampler"):
    pytest.skip("gear was built without the cuda feature", allow_module_level=True)


def make_table():
    table = gear.Table([("obs", "float32", (8,)), ("step", "int32")], max_len=4, capacity=16)
    for i in range(16):
        with table.writer().trajectory() as t:
            for s in range(4):
                t.append(obs=np.full(8, i, np.float32), step=s)
    return table


def cuda_sampler(table, **kwargs):
    try:
        return table.cuda_sampler(**kwargs)
    except gear.GearError as e:
        if os.environ.get("GEAR_REQUIRE_GPU") == "1":
            raise
        pytest.skip(f"no usable GPU: {e}")


def test_device_batches_arrive_as_cuda_dlpack_columns():
    table = make_table()
    sampler = cuda_sampler(table, batch_size=8, window=4)
    batch = sampler.sample()
    assert batch["obs"].__dlpack_device__()[0] == 2
    assert batch.keys.shape == (8,) and batch.mask.all()
    torch = pytest.importorskip("torch")
    obs = torch.from_dlpack(batch["obs"])
    step = torch.from_dlpack(batch.dlpack("step"))
    assert obs.is_cuda and obs.shape == (8, 4, 8)
    assert (step.cpu() == torch.arange(4, dtype=torch.int32)).all()
    assert (obs[:, :, 0:1] == obs).all()
