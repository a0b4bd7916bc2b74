"""Bad input raises a clear exception of its kind; nothing panics."""

import numpy as np
import pytest

import gear


@pytest.fixture
def table():
    return gear.Table([("obs", "float32", (3,)), ("done", "bool")], max_len=4, capacity=8)


def test_wrong_dtype(table):
    with table.writer().trajectory() as t:
        with pytest.raises(gear.StepError, match=r"column `obs`.*float64"):
            t.append(obs=np.zeros(3), done=False)
        t.append(obs=np.zeros(3, np.float32), done=False)


def test_python_numbers_are_converted(table):
    with table.writer().trajectory() as t:
        t.append(obs=[1, 2, 3], done=True)
    assert table.sampler(1).sample()["obs"][0, 0].tolist() == [1.0, 2.0, 3.0]


def test_wrong_shape(table):
    t = table.writer().trajectory()
    with pytest.raises(gear.StepError, match=r"shape \[4\], expected \[3\]"):
        t.append(obs=np.zeros(4, np.float32), done=False)
    t.abandon()


def test_unknown_and_missing_columns(table):
    t = table.writer().trajectory()
    with pytest.raises(gear.StepError, match="unknown column `reward`"):
        t.append(obs=np.zeros(3, np.float32), done=False, reward=1.0)
    with pytest.raises(gear.StepError, match="column `done` is missing"):
        t.append(obs=np.zeros(3, np.float32))
    with pytest.raises(gear.SpecError, match="unknown column `reward`"):
        table.sampler(1, columns=["reward"])
    t.abandon()


def test_nan_priority(table):
    with table.writer().trajectory() as t:
        t.append(obs=np.zeros(3, np.float32), done=False)
    with pytest.raises(gear.StepError, match="invalid priority NaN"):
        table.update_priorities([t.key], [float("nan")])
    with pytest.raises(gear.StepError, match="invalid priority"):
        table.writer().trajectory(priority=-1.0)
    with pytest.raises(gear.StepError, match="invalid priority"):
        table.writer().insert_batch(
            {"obs": np.zeros((2, 3), np.float32), "done": np.zeros(2, bool)}, priorities=[1.0, float("inf")]
        )
    with pytest.raises(gear.StepError, match="2 keys but 1 priorities"):
        table.update_priorities([t.key, t.key], [1.0])


def test_stale_keys_are_ignored_by_priority_updates():
    table = gear.Table([("v", "int32")], max_len=1, capacity=1)
    with table.writer().trajectory() as t:
        t.append(v=1)
    old = t.key
    with table.writer().trajectory() as t:
        t.append(v=2)  # evicts the first
    assert table.update_priorities([old], [2.0]) == 0
    assert table.update_priorities([t.key], [2.0]) == 1


def test_bad_specs():
    with pytest.raises(gear.SpecError, match="not supported"):
        gear.Table([("x", "uint32")], max_len=4, capacity=4)
    with pytest.raises(gear.SpecError, match="not a dtype"):
        gear.Table([("x", "nonsense")], max_len=4, capacity=4)
    with pytest.raises(gear.SpecError):
        gear.Table([("x", "f32")], max_len=0, capacity=4)
    with pytest.raises(gear.SpecError, match="tuple"):
        gear.Table(["x"], max_len=4, capacity=4)
    with pytest.raises(gear.SpecError, match="narrower"):
        gear.RateLimiter.sample_to_insert_ratio(4.0, 10, 3.0)
    with pytest.raises(gear.SpecError, match="pad"):
        gear.Table([("x", "f32")], max_len=4, capacity=4).sampler(1, pad="middle")


def test_trajectory_protocol_errors(table):
    t = table.writer().trajectory()
    with pytest.raises(gear.StepError, match="empty trajectory"):
        t.end()
    t.append(obs=np.zeros(3, np.float32), done=False)
    t.end()
    with pytest.raises(gear.StepError, match="already ended"):
        t.append(obs=np.zeros(3, np.float32), done=False)
    long = table.writer().trajectory()
    for _ in range(4):
        long.append(obs=np.zeros(3, np.float32), done=False)
    with pytest.raises(gear.StepError, match="maximum length"):
        long.append(obs=np.zeros(3, np.float32), done=False)
    long.abandon()


def test_an_exception_in_a_with_block_abandons_the_trajectory(table):
    with pytest.raises(RuntimeError):
        with table.writer().trajectory() as t:
            t.append(obs=np.zeros(3, np.float32), done=False)
            raise RuntimeError("actor failed")
    assert t.closed
    assert len(table) == 0
    assert table.info()["slots_writing"] == 0


def test_closed_table_raises_closed_error(table):
    table.close()
    with pytest.raises(gear.ClosedError, match="closed"):
        table.writer().trajectory()
    with pytest.raises(gear.ClosedError):
        table.sampler(1).sample()
    assert issubclass(gear.ClosedError, gear.GearError)


def test_a_private_table_cannot_be_pickled(table):
    import pickle

    with pytest.raises(TypeError, match="process-private"):
        pickle.dumps(table)
