"""Every sampling and eviction strategy through Python, priorities and
importance weights, max-times-sampled, queue and stack."""

import numpy as np
import pytest

import gear


def table_with(n, **kwargs):
    """A table of `n` one-step trajectories holding 0..n-1, priorities 1..n."""
    table = gear.Table([("v", "int64")], max_len=1, capacity=kwargs.pop("capacity", 64), **kwargs)
    keys = []
    for i in range(n):
        with table.writer().trajectory(priority=float(i + 1)) as t:
            t.append(v=i)
        keys.append(t.key)
    return table, keys


def drawn(table, batch_size=1, draws=1):
    s = table.sampler(batch_size=batch_size, timeout=1.0)
    return [int(v) for _ in range(draws) for v in s.sample()["v"][:, 0]]


def test_fifo_lifo_and_heaps_draw_in_their_order():
    assert drawn(table_with(5, sampler="fifo")[0], batch_size=3) == [0, 1, 2]
    assert drawn(table_with(5, sampler="lifo")[0], batch_size=3) == [4, 3, 2]
    assert drawn(table_with(5, sampler="max-heap")[0], batch_size=3) == [4, 3, 2]
    assert drawn(table_with(5, sampler="min_heap")[0], batch_size=3) == [0, 1, 2]


def test_uniform_draws_every_item_about_equally():
    table, _ = table_with(4, sampler="uniform", seed=7)
    counts = np.bincount(drawn(table, batch_size=1000), minlength=4)
    assert counts.min() > 180, counts
    batch = table.sampler(batch_size=8).sample()
    np.testing.assert_allclose(batch.probabilities, 0.25)
    np.testing.assert_allclose(batch.weights, 1.0)


def test_prioritized_follows_priorities_and_updates():
    table, keys = table_with(4, sampler="prioritized", alpha=1.0, beta=1.0, seed=11)
    counts = np.bincount(drawn(table, batch_size=4000), minlength=4)
    expected = 4000 * np.arange(1, 5) / 10
    assert np.all(np.abs(counts - expected) < 0.15 * expected + 30), counts
    batch = table.sampler(batch_size=16).sample()
    p = np.arange(1, 5) / 10
    np.testing.assert_allclose(batch.probabilities, p[batch["v"][:, 0]])
    w = (4 * p) ** -1.0
    np.testing.assert_allclose(batch.weights, (w / w.max())[batch["v"][:, 0]])
    # All mass onto item 0.
    applied = table.update_priorities(keys, [1.0, 0.0, 0.0, 0.0])
    assert applied == 4
    assert set(drawn(table, batch_size=100)) == {0}


def test_remover_evicts_by_its_order_when_full():
    table, _ = table_with(4, sampler="fifo", remover="min-heap", capacity=4)
    with table.writer().trajectory(priority=10.0) as t:
        t.append(v=99)
    # Priority 1 (value 0) was the smallest: it is gone.
    assert sorted(drawn(table, batch_size=4)) == [1, 2, 3, 99]
    assert table.info()["evictions"] == 1


def test_max_times_sampled_removes_items():
    table, _ = table_with(3, sampler="fifo", max_times_sampled=1)
    assert drawn(table, batch_size=3) == [0, 1, 2]
    assert len(table) == 0


@pytest.mark.parametrize("kind,order", [("queue", [0, 1, 2]), ("stack", [2, 1, 0])])
def test_queue_and_stack(kind, order):
    limiter = getattr(gear.RateLimiter, kind)(3)
    table = gear.Table([("v", "int64")], max_len=1, capacity=8, rate_limiter=limiter)
    w = table.writer(timeout=0.2)
    for i in range(3):
        with w.trajectory() as t:
            t.append(v=i)
    with pytest.raises(gear.TimeoutError):
        w.trajectory()  # the queue is full
    assert drawn(table, batch_size=3) == order
    with pytest.raises(gear.TimeoutError):
        table.sampler(batch_size=1, timeout=0.2).sample()  # every item taken


def test_unknown_strategy_is_a_spec_error():
    with pytest.raises(gear.SpecError, match="unknown"):
        gear.Table([("v", "int64")], max_len=1, capacity=4, sampler="best-first")
