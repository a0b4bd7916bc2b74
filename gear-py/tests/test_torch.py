"""The torch adapter: tensors over batches, sample_into torch tensors
(bfloat16 and pinned ones), DataLoader workers over a shared table and
over a cluster. ci/pytest.sh installs torch and sets GEAR_REQUIRE_TORCH=1,
so these run (not skip) in `.ci/run`."""

import numpy as np
import pytest

import gear
from conftest import TOKEN, require

torch = require("torch")


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


def test_sample_into_bfloat16_tensors():
    table = gear.Table([("obs", "bfloat16", (2,)), ("r", "float32")], max_len=1, capacity=8)
    bits = torch.tensor([[1.5, -2.0]] * 4, dtype=torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    table.writer().insert_batch({"obs": bits, "r": np.ones(4, np.float32)})
    out = {"obs": torch.zeros((4, 1, 2), dtype=torch.bfloat16), "r": torch.zeros((4, 1))}
    batch = table.sampler(4, window=1).sample_into(out)
    assert batch["obs"] is out["obs"]
    assert out["obs"].float().tolist() == [[[1.5, -2.0]]] * 4 and float(out["r"].sum()) == 4.0
    with pytest.raises(gear.StepError, match="shape"):
        table.sampler(4, window=1).sample_into({"obs": torch.zeros((4, 1, 3), dtype=torch.bfloat16), "r": out["r"]})


def test_sample_into_pinned_tensors():
    if not torch.cuda.is_available():
        pytest.skip("pinned host memory needs a CUDA device (torch.cuda.is_available() is False)")
    table = gear.Table([("obs", "float32", (2,))], max_len=1, capacity=8)
    table.writer().insert_batch({"obs": np.ones((4, 2), np.float32)})
    out = torch.zeros((4, 1, 2)).pin_memory()
    table.sampler(4, window=1).sample_into({"obs": out})
    assert out.is_pinned() and float(out.sum()) == 8.0


def test_to_tensors_and_dataloader_workers_over_a_cluster(local_cluster):
    from gear.torch import ReplayDataset, to_tensors

    lc = local_cluster(max_len=1, capacity=64)
    cluster = gear.Cluster(lc.addrs, TOKEN)
    n = 30
    ids = np.arange(n, dtype=np.int64)
    cluster.writer("round_robin").insert_batch(
        {"id": ids, "t": np.zeros(n, np.int32), "obs": (ids[:, None] % 251 + np.zeros((n, 48))).astype(np.uint8)})
    tensors = to_tensors(cluster.sampler(8, window=1).sample())
    assert tensors["obs"].shape == (8, 1, 48) and tensors["keys"].shape == (8, 3)
    # The key words go back as they are.
    assert cluster.update_priorities(tensors["keys"], torch.ones(8)) == (8, 0)
    loader = torch.utils.data.DataLoader(ReplayDataset(cluster, batch_size=8, window=1), batch_size=None,
                                         num_workers=2)
    seen = set()
    for i, batch in enumerate(loader):
        ids_drawn = batch["id"][:, 0]
        assert torch.equal(batch["obs"][:, 0, 0].long(), ids_drawn % 251)
        seen |= set(ids_drawn.tolist())
        if i == 9:
            break
    assert len(seen) > 10
    # The cluster batch from sample_into fills torch tensors too.
    out = {"id": torch.zeros((8, 1), dtype=torch.int64), "t": torch.zeros((8, 1), dtype=torch.int32),
           "obs": torch.zeros((8, 1, 48), dtype=torch.uint8)}
    cluster.sampler(8, window=1).sample_into(out)
    assert torch.equal(out["obs"][:, 0, 0].long(), out["id"][:, 0] % 251)
