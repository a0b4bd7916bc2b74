"""The torch adapter (skipped where torch is not installed: CI installs
NumPy only; np.from_dlpack proves the DLPack export in test_zero_copy)."""

import numpy as np
import pytest

import gear

torch = pytest.importorskip("torch", reason="torch is not installed (set GEAR_PY_TORCH=1 for ci/pytest.sh)")


def test_dataloader_workers_sample_a_shared_table(shm_name):
    from gear.torch import ReplayDataset

    table = gear.Table([("obs", "bfloat16", (2,)), ("r", "float32")], max_len=1, capacity=64, name=shm_name)
    table.writer().insert_batch({"obs": np.zeros((32, 2), np.uint16), "r": np.ones(32, np.float32)})
    loader = torch.utils.data.DataLoader(ReplayDataset(table, batch_size=8), batch_size=None, num_workers=2)
    for i, batch in enumerate(loader):
        assert batch["obs"].dtype == torch.bfloat16
        assert batch["r"].shape == (8, 1) and float(batch["r"].sum()) == 8.0
        if i == 3:
            break
