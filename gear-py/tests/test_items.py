"""Items from Python: tables whose rows are windows of stored trajectories
with priorities of their own (patterns, items added while writing and
after commit), the chi-square per item, eviction taking exactly a
trajectory's items, DQN transitions against a step-by-step reference, a
writer killed between writing and adding items, checkpoints, and items
through gear.Cluster."""

import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import gear
from conftest import TOKEN

OBS = 3


def columns():
    return [("obs", "uint8", (OBS,)), ("action", "int64", ()), ("reward", "float32", ()), ("done", "bool", ())]


def frame(tid, t):
    """Trajectory `tid`'s observation at step t."""
    return np.array([tid, t, (tid * 7 + t) % 251], np.uint8)


def write(table, tid, steps, priority=None, done_at=None):
    with table.writer().trajectory(priority) as tr:
        for t in range(steps):
            tr.append(obs=frame(tid, t), action=tid * 100 + t, reward=float(t + 1),
                      done=done_at is not None and t == done_at)
    return tr.key


def check_windows(batch, length):
    """Every row is `length` consecutive steps of one trajectory from its start."""
    for r in range(batch.rows):
        obs = batch["obs"][r]
        tid, start = int(obs[0, 0]), int(batch.starts[r])
        assert batch.lengths[r] == length
        for j in range(length):
            np.testing.assert_array_equal(obs[j], frame(tid, start + j))
            assert batch["action"][r, j] == tid * 100 + start + j


def test_a_window_pattern_makes_items_sampled_as_windows_and_prioritized_per_item():
    table = gear.Table(columns(), max_len=16, capacity=8, sampler="prioritized", alpha=1.0, beta=1.0,
                       items_per_trajectory=8, item_pattern=gear.ItemPattern.windows(4, 2))
    assert table.items_per_trajectory == 8
    keys = [write(table, tid, 10) for tid in range(1, 4)]
    assert len(table) == 12, "windows at 0, 2, 4, 6 of each 10-step trajectory"
    items = table.items_of(keys[0])
    np.testing.assert_array_equal(items["starts"], [0, 2, 4, 6])
    np.testing.assert_array_equal(items["lengths"], [4, 4, 4, 4])
    # A priority per item: item i of trajectory 1 gets i + 1, the rest 0.5.
    all_items = np.concatenate([table.items_of(k)["keys"] for k in keys])
    prios = np.full(len(all_items), 0.5)
    prios[:4] = [1.0, 2.0, 3.0, 4.0]
    assert table.update_priorities(all_items, prios) == 12
    expected = prios / prios.sum()
    sampler = table.sampler(256, window=4, offset=0)
    counts = np.zeros(len(all_items))
    index = {int(k): i for i, k in enumerate(all_items)}
    draws = 0
    for _ in range(40):
        b = sampler.sample()
        check_windows(b, 4)
        for k, p in zip(b.keys, b.probabilities):
            counts[index[int(k)]] += 1
            assert abs(p - expected[index[int(k)]]) < 1e-9
        draws += b.rows
    chi2 = (((counts - draws * expected) ** 2) / (draws * expected)).sum()
    assert chi2 < 31.3, f"chi-square {chi2:.1f} over 11 degrees of freedom: {counts}"  # p = 0.001


def test_items_added_while_writing_and_after_commit_and_bad_ones_refused():
    table = gear.Table(columns(), max_len=16, capacity=4, items_per_trajectory=4,
                       item_pattern=gear.ItemPattern.whole())
    with table.writer().trajectory() as tr:
        for t in range(6):
            tr.append(obs=frame(1, t), action=100 + t, reward=0.0, done=False)
        first = tr.add_item(1, 3, priority=2.0)
        with pytest.raises(gear.GearError, match="step"):
            tr.add_item(4, 5)  # past the steps written
        more = tr.add_items(gear.ItemPattern.windows(2, 4))
        assert len(table) == 0, "items become selectable at commit"
    assert len(table) == 3, "the writer's items, not the table's pattern"
    items = table.items_of(tr.key)
    assert sorted(zip(items["starts"], items["lengths"])) == [(0, 2), (1, 3), (4, 2)]
    assert first in items["keys"] and set(more) <= set(items["keys"])
    added = table.add_items(tr.key, [0], [6], priorities=[5.0])
    assert len(table) == 4
    with pytest.raises(gear.GearError, match="room"):
        table.add_items(tr.key, [0], [1])
    with pytest.raises(gear.GearError):
        table.add_items(tr.key, [3], [4])
    with pytest.raises(gear.GearError):
        table.add_items(added[0], [0], [1])  # an item's key, not a trajectory's
    b = table.sampler(64, window=6, offset=0).sample()
    for r in range(b.rows):
        n, s = int(b.lengths[r]), int(b.starts[r])
        np.testing.assert_array_equal(b["action"][r, :n], 100 + s + np.arange(n))
        assert not b.mask[r, n:].any()
    plain = gear.Table(columns(), max_len=4, capacity=2)
    key = write(plain, 1, 2)
    with pytest.raises(gear.GearError, match="items"):
        plain.add_items(key, [0], [1])
    with pytest.raises(gear.SpecError, match="items_per_trajectory"):
        gear.Table(columns(), max_len=4, capacity=2, item_pattern=gear.ItemPattern.transitions())
    with pytest.raises(gear.SpecError):
        gear.ItemPattern.windows(0, 1)


def test_evicting_a_trajectory_takes_exactly_its_items_and_their_keys_go_stale():
    table = gear.Table(columns(), max_len=8, capacity=2, items_per_trajectory=8,
                       item_pattern=gear.ItemPattern.transitions(1))
    a, b = write(table, 1, 5), write(table, 2, 4)
    items_a, items_b = table.items_of(a)["keys"], table.items_of(b)["keys"]
    assert (len(items_a), len(items_b), len(table)) == (4, 3, 7)
    c = write(table, 3, 3)  # evicts a (FIFO)
    assert table.items_of(a)["keys"].size == 0
    assert len(table) == 3 + 2
    assert table.update_priorities(items_a, np.ones(4)) == 0, "an evicted trajectory's item keys are stale"
    assert table.update_priorities(items_b, np.ones(3)) == 3, "the other trajectory's items stay"
    with pytest.raises(gear.StaleKeyError):
        table.add_items(a, [0], [1])
    seen = set()
    for _ in range(20):
        batch = table.sampler(32, window=2, offset=0).sample()
        seen |= {int(k) for k in batch.keys}
        assert set(batch["obs"][:, 0, 0].tolist()) <= {2, 3}
    assert seen == {int(k) for k in items_b} | {int(k) for k in table.items_of(c)["keys"]}


def reference_transition(episode, t, k, n, gamma):
    """obs stack at t, next stack at t + m, n-step return, done, discount, m."""
    steps = len(episode)

    def stack(u):
        return np.stack([episode[max(u - i, 0)]["obs"] for i in reversed(range(k))])

    ret, m, done = 0.0, 0, False
    for i in range(n):
        if t + i + 1 >= steps:
            break
        ret += gamma ** i * episode[t + i]["reward"]
        m += 1
        if episode[t + i]["done"]:
            done = True
            break
    return stack(t), stack(t + m), ret, done, 0.0 if done else gamma ** m, m


def transition_table(n):
    """A table of n-step transition items over four episodes of 6 to 9
    steps (the odd ones terminal, the others cut off); returns it and the
    episodes' steps by episode id (an action is `id * 100 + t`)."""
    table = gear.Table(columns(), max_len=12, capacity=6, items_per_trajectory=12,
                       item_pattern=gear.ItemPattern.transitions(n))
    episodes = {}
    for tid in range(1, 5):
        steps = 5 + tid
        done_at = steps - 2 if tid % 2 else None
        episodes[tid] = [dict(obs=frame(tid, t), action=tid * 100 + t, reward=float(t + 1), done=done_at == t)
                         for t in range(steps)]
        with table.writer().trajectory() as tr:
            for s in episodes[tid]:
                tr.append(**s)
    return table, episodes


@pytest.mark.parametrize("k,n", [(1, 1), (4, 1), (4, 3), (2, 3)])
def test_transitions_match_a_step_by_step_reference(k, n):
    gamma = 0.9
    table, episodes = transition_table(n)
    sampler = table.transition_sampler(64, obs="obs", action="action", reward="reward", done="done",
                                       frame_stack=k, n_step=n, gamma=gamma)
    assert sampler.frame_stack == k
    for _ in range(5):
        b = sampler.sample()
        obs, nxt = b["obs"], b["next_obs"]
        want_shape = (64, OBS) if k == 1 else (64, k, OBS)
        assert obs.shape == want_shape and nxt.shape == want_shape, "no window axis"
        assert b["action"].shape == (64,) and b["reward"].shape == (64,)
        for r in range(64):
            t = int(b["action"][r]) % 100
            ep = episodes[int(b["action"][r]) // 100]
            o, no, ret, done, disc, m = reference_transition(ep, t, k, n, gamma)
            got_o = obs[r] if k > 1 else obs[r][None]
            got_n = nxt[r] if k > 1 else nxt[r][None]
            np.testing.assert_array_equal(got_o, o)
            assert int(b["n_step"][r]) == m
            if not done:
                np.testing.assert_array_equal(got_n, no)
            assert abs(b["reward"][r] - ret) < 1e-4, (r, t, m)
            assert bool(b["done"][r]) == done
            assert abs(b["discount"][r] - disc) < 1e-6
        assert (b.probabilities > 0).all() and (b.weights > 0).all()
        assert table.update_priorities(b.keys, np.full(64, 2.0)) == 64


def test_transitions_store_each_frame_once():
    """A trajectory of 65 frames gives 64 transitions (each frame stored
    once), and a batch's obs and next_obs are two strided views of one
    buffer of the k + n frames gathered per row."""
    frames = 64
    table = gear.Table([("obs", "uint8", (84, 84)), ("action", "int64", ()), ("reward", "float32", ())],
                       max_len=frames + 1, capacity=1, items_per_trajectory=frames,
                       item_pattern=gear.ItemPattern.transitions(1))
    with table.writer().trajectory() as tr:
        for t in range(frames + 1):
            tr.append(obs=np.full((84, 84), t % 256, np.uint8), action=t, reward=0.0)
    assert len(table) == frames
    b = table.transition_sampler(32).sample()
    t = b["action"]
    assert (b["obs"][:, 0, 0] == t % 256).all() and (b["next_obs"][:, 0, 0] == (t + 1) % 256).all()
    obs, nxt = b["obs"], b["next_obs"]
    assert obs.strides == nxt.strides == (2 * 84 * 84, 84, 1)
    assert nxt.ctypes.data - obs.ctypes.data == 84 * 84
    assert np.may_share_memory(obs, nxt)



@pytest.mark.parametrize("k,n", [(4, 1), (4, 2)])
def test_kept_transition_batches_stay_exact_while_later_ones_are_drawn(k, n):
    """obs and next_obs view the batch's own buffers: drawing more batches
    than the sampler pools leaves each kept batch's frames exactly as
    written (n < k included: next observations in a buffer of their own
    for short returns), and a batch let go has its buffers reused."""
    gamma = 0.9
    table, episodes = transition_table(n)
    sampler = table.transition_sampler(16, obs="obs", action="action", reward="reward", done="done",
                                       frame_stack=k, n_step=n, gamma=gamma)

    def expected(b):
        rows = []
        for r in range(b.rows):
            action = int(b["action"][r])
            o, no, _, done, _, m = reference_transition(episodes[action // 100], action % 100, k, n, gamma)
            rows.append((o, no if not done else None, m))
        return rows

    def check(b, rows):
        for r, (o, no, m) in enumerate(rows):
            np.testing.assert_array_equal(b["obs"][r], o)
            if no is not None:
                np.testing.assert_array_equal(b["next_obs"][r], no)
            assert int(b["n_step"][r]) == m

    kept = []
    for _ in range(12):
        b = sampler.sample()
        kept.append((b, expected(b), b["obs"].copy(), b["next_obs"].copy(), b["action"].copy()))
    separate = [b["next_obs"].strides[0] == k * OBS for b, *_ in kept]
    assert any(separate) == (n == 2), "short returns with n < k keep next_obs in a buffer of its own"
    for b, rows, obs, nxt, action in kept:
        check(b, rows)
        np.testing.assert_array_equal(b["obs"], obs)
        np.testing.assert_array_equal(b["next_obs"], nxt)
        np.testing.assert_array_equal(b["action"], action)
        assert b["obs"].base is b["next_obs"].base is b["action"].base
    addresses = {b["obs"].base.address for b, *_ in kept}
    assert len(addresses) == len(kept), "no two kept batches share a buffer"
    # Arrays outlive their batch; a buffer still viewed is never reused.
    obs0, rows0 = kept[0][0]["obs"], kept[0][1]
    del kept
    later = [sampler.sample() for _ in range(8)]
    for r, (o, _, _) in enumerate(rows0):
        np.testing.assert_array_equal(obs0[r], o)
    assert obs0.base.address not in {b["obs"].base.address for b in later}
    # Batches let go come back from the pool.
    del later
    seen = {sampler.sample()["obs"].base.address for _ in range(8)}
    assert len(seen) <= 2, seen

KILLED_WRITER = """
import sys, numpy as np, gear
table = gear.Table.attach(sys.argv[1], timeout=10)
tr = table.writer().trajectory()
for t in range(6):
    tr.append(obs=np.array([9, t, 0], np.uint8), action=900 + t, reward=0.0, done=False)
if sys.argv[2] == "after":
    tr.add_item(2, 3, priority=1.0)
print("written", flush=True)
import time
time.sleep(60)
"""


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_writer_killed_around_adding_items_leaves_no_dangling_item(shm_name, when):
    table = gear.Table(columns(), max_len=8, capacity=4, name=shm_name, items_per_trajectory=8,
                       item_pattern=gear.ItemPattern.windows(2, 2))
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, shm_name, when],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.strip() == "written", child.stderr.read()
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
    deadline = time.monotonic() + 10
    while table.reclaim_dead() == 0 and len(table) == 0:
        assert time.monotonic() < deadline, "the dead writer's slot was never reclaimed"
        time.sleep(0.05)
    # Its published steps are kept with the items it added (after), or with
    # the table's pattern over them (before); every item inside the steps.
    b = table.sampler(64, window=3, offset=0).sample()
    starts = sorted({int(s) for s in b.starts})
    assert starts == ([2] if when == "after" else [0, 2, 4])
    for r in range(b.rows):
        n, s = int(b.lengths[r]), int(b.starts[r])
        assert s + n <= 6
        np.testing.assert_array_equal(b["action"][r, :n], 900 + s + np.arange(n))
    info = table.info()
    assert info["slots_writing"] == 0 and info["slots_committed"] == 1


def test_a_checkpoint_keeps_items_and_their_priorities(tmp_path):
    kw = dict(sampler="prioritized", alpha=1.0, items_per_trajectory=4, item_pattern=gear.ItemPattern.windows(3, 3))
    table = gear.Table(columns(), max_len=9, capacity=4, **kw)
    keys = [write(table, tid, 9) for tid in (1, 2)]
    items = table.items_of(keys[0])["keys"]
    table.update_priorities(items, [7.0, 1.0, 1.0])
    table.checkpoint(tmp_path / "items.ckpt")
    back = gear.Table.restore(tmp_path / "items.ckpt", columns(), max_len=9, capacity=4, **kw)
    assert len(back) == 6
    restored = back.items_of(keys[0])
    np.testing.assert_array_equal(restored["keys"], items)
    np.testing.assert_array_equal(restored["priorities"], [7.0, 1.0, 1.0])
    np.testing.assert_array_equal(restored["starts"], [0, 3, 6])
    b = back.sampler(512, window=3, offset=0).sample()
    check_windows(b, 3)
    assert abs((b.keys == items[0]).mean() - 7 / 12) < 0.1


def test_items_through_a_cluster(local_cluster):
    lc = local_cluster(shards=2, max_len=8, capacity=8,
                       top='items_per_trajectory = 8',
                       extra='[items]\npattern = "windows"\nlen = 3\nstride = 2\n')
    cluster = gear.Cluster(lc.addrs, TOKEN, mass_refresh=0.0)
    for tid in range(6):
        with cluster.writer("round_robin").trajectory() as tr:
            for t in range(7):
                tr.append(id=tid, t=t, obs=np.full(48, tid, np.uint8))
    assert sum(i["size"] for i in cluster.info()) == 18, "three windows of each 7-step trajectory"
    sampler = cluster.sampler(64, window=3, offset=0)
    seen = set()
    for _ in range(6):
        b = sampler.sample()
        for r in range(b.rows):
            assert b.lengths[r] == 3 and int(b.starts[r]) in (0, 2, 4)
            np.testing.assert_array_equal(b["t"][r], int(b.starts[r]) + np.arange(3))
            assert (b["id"][r] == b["id"][r, 0]).all()
        seen |= {k.item() for k in b.keys}
    assert len(seen) == 18
    b = sampler.sample()
    assert cluster.update_priorities(b.keys, np.full(64, 2.0))[1] == 0


EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def test_the_dqn_example_learns_on_transition_items():
    """cartpole_dqn.py's CI form: actors write episodes once, the learner's
    TD loss falls on transition items."""
    run = subprocess.run([sys.executable, str(EXAMPLES / "cartpole_dqn.py"), "--steps", "3000", "--check-loss-falls"],
                         capture_output=True, text=True, timeout=300, cwd=EXAMPLES)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "updates; loss at the start" in run.stdout


def test_the_r2d2_example_sets_a_priority_per_window():
    run = subprocess.run([sys.executable, str(EXAMPLES / "r2d2_sequences.py"), "--updates", "100"],
                         capture_output=True, text=True, timeout=300, cwd=EXAMPLES)
    assert run.returncode == 0, run.stdout + run.stderr
    windows = int(run.stdout.strip().splitlines()[-1].split()[0])
    # The learner starts once 20 windows are stored (its rate limiter's
    # min_size) and draws 100 batches of 32 by priority, so it trains on
    # every stored window; on a busy machine the actor process may add
    # only a few more during those updates (32 seen while CI compiled).
    assert windows >= 20, run.stdout
