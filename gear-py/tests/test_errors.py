"""Bad input raises a clear exception of its kind; nothing panics."""

import numpy as np
import pytest

import gear


@pytest.fixture
def table():
    return gear.Table([("obs", "float32", (3,)), ("done", "bool")], max_len=4, capacity=8)


def test_wrong_dtype(table):
    with table.writer().trajectory() as t:
        with pytest.raises(gear.StepError, match=r"column `obs`.*not numbers"):
            t.append(obs=np.array(["a", "b", "c"]), done=False)
        with pytest.raises(gear.StepError, match=r"column `obs`.*not numbers"):
            t.append(obs=np.zeros(3, np.complex64), done=False)
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


# --- one conversion rule for scalars and arrays (gear/_convert.py) ---------

CONVERT_COLUMNS = [("i", "int64"), ("f", "float32"), ("b", "bool"), ("u", "uint8"), ("h", "bfloat16")]


@pytest.fixture
def typed():
    return gear.Table(CONVERT_COLUMNS, max_len=4, capacity=8)


OK_STEP = dict(i=1, f=0.5, b=True, u=3, h=1.0)


@pytest.mark.parametrize("column,value,why", [
    ("i", 1.5, "1.5 cannot be stored in int64"),
    ("i", -2.7, "-2.7 cannot be stored in int64"),
    ("i", float("nan"), "nan cannot be stored in int64"),
    ("i", 2 ** 70, "not numbers"),
    ("f", 1e40, "1e\\+40 overflows float32"),
    ("b", 2, "2 cannot be stored in bool"),
    ("u", 300, "300 cannot be stored in uint8"),
    ("u", -1, "-1 cannot be stored in uint8"),
    ("h", 1e39, "overflows bfloat16"),
    ("i", "7", "not numbers"),
])
def test_lossy_conversions_are_refused_for_scalars_and_arrays_alike(typed, column, value, why):
    w = typed.writer()
    scalar = dict(OK_STEP, **{column: value})
    with w.trajectory() as t:
        with pytest.raises(gear.StepError, match=f"column `{column}`: .*{why}"):
            t.append(**scalar)
        if not isinstance(value, str) and abs(value) < 2 ** 63:
            # The same value in a NumPy array (and a NumPy scalar) is refused alike.
            arr = np.array([value])
            with pytest.raises(gear.StepError, match=f"column `{column}`"):
                t.append(**dict(OK_STEP, **{column: arr[0]}))
            batch = {k: np.array([v] * 2) for k, v in OK_STEP.items()}
            batch[column] = np.array([value, value])
            with pytest.raises(gear.StepError, match=f"column `{column}`"):
                w.insert_batch(batch)
        t.append(**OK_STEP)
    assert typed.info()["size"] == 1, "nothing refused was stored"


def test_lossless_conversions_are_taken_for_scalars_and_arrays_alike(typed):
    w = typed.writer()
    with w.trajectory() as t:
        t.append(i=3.0, f=0.1, b=1, u=np.int64(255), h=1.5)
        t.append(i=np.float64(-4.0), f=np.float64(2.5), b=np.float32(0.0), u=np.uint16(7), h=np.float32(-2.0))
    w.insert_batch({"i": np.array([1.0, 2.0]), "f": np.zeros(2), "b": np.array([0, 1]),
                    "u": np.array([1, 2], np.int64), "h": np.array([0.5, 3.0])})
    b = typed.sampler(8, window=2, offset=0).sample()
    rows = {int(b.lengths[r]): r for r in range(b.rows)}
    r = rows[2]
    assert b["i"][r].tolist() == [3, -4] and b["u"][r].tolist() == [255, 7]
    assert b["f"][r, 0] == np.float32(0.1) and b["b"][r].tolist() == [True, False]
    # bfloat16 bits of 1.5 and -2.0.
    assert b["h"][r].tolist() == [0x3FC0, 0xC000]


def test_float32_style_names_and_short_names_are_both_accepted():
    long = gear.Table([("a", "float32"), ("b", "int64"), ("c", "uint8"), ("d", "bfloat16")], max_len=1, capacity=2)
    short = gear.Table([("a", "f32"), ("b", "i64"), ("c", "u8"), ("d", "bf16")], max_len=1, capacity=2)
    assert long.columns == short.columns
    assert gear.Table([("a", np.float32)], max_len=1, capacity=2).columns == [("a", "f32", [])]


def test_bad_windows_and_shared_memory_names_are_spec_errors(table):
    with pytest.raises(gear.SpecError, match="window length 9 exceeds"):
        table.sampler(4, window=9)
    with pytest.raises(gear.SpecError, match="window length is zero"):
        table.sampler(4, window=0)
    with pytest.raises(gear.SpecError, match="shared memory name"):
        gear.Table([("a", "f32")], max_len=1, capacity=2, name="bad/name")


def test_gear_timeout_error_is_also_the_builtin_timeout_error(table):
    assert issubclass(gear.TimeoutError, TimeoutError) and issubclass(gear.TimeoutError, gear.GearError)
    with pytest.raises(TimeoutError):
        table.sampler(1, timeout=0.05).sample()
