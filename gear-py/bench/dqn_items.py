"""Atari-like DQN replay beside cpprb, each case in a fresh child process
(issue 28): resident memory, transition sampling, prioritized inserts.

    target/compare-venv/bin/python gear-py/bench/dqn_items.py --transitions 25000 50000 --rounds 3

(any interpreter with `gear` and `cpprb` importable; with `--gear-path`
the `gear` package is taken from that directory.)

Memory: 84x84 uint8 frames, frame stack 4, episodes of `--episode` steps,
`N` transitions stored. Resident memory is the child's VmRSS after the
buffer is full minus its VmRSS before the buffer was created (numpy and
the package imported), so it is the buffer's own. Cases:

* gear: a table of transition items (`ItemPattern.transitions(1)`), each
  frame stored once, stacks of 4 read at sample time
  (`Table.transition_sampler(frame_stack=4)`);
* cpprb next_of+stack_compress: `ReplayBuffer(next_of="obs",
  stack_compress="obs")` with obs `(84, 84, 4)` (its most compact form);
* cpprb next_of: `ReplayBuffer(next_of="obs")` with obs `(4, 84, 84)`
  (next observations not stored twice, stacks stored whole);
* stacked obs+next_obs: `ReplayBuffer` with `obs` and `next_obs` both
  `(4, 84, 84)`, what storing transitions as rows does.

Sampling: batches of 32 and 256 from the full buffer, obs and next_obs
`[B, 4, 84, 84]` (cpprb's `[B, 84, 84, 4]`), rows per second (median of
`--batches` timed batches after 5 warm-up ones).

Inserts: prioritized batched adds of 256 transitions of 64 bytes (obs 56 B
uint8, action int32, reward float32) with priorities into a 1 M capacity
prioritized buffer, transitions per second over `--inserts` transitions:
gear `Writer.insert_batch(columns, priorities)` vs cpprb
`PrioritizedReplayBuffer.add(..., priorities=)`.

Prints one JSON object per case and round, then a summary.
"""

import argparse
import json
import os
import subprocess
import sys
import time

FRAME = (84, 84)
STACK = 4


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def episode_frames(rng, length):
    import numpy as np

    return rng.integers(0, 256, size=(length + 1,) + FRAME, dtype=np.uint8)


def case_gear(n, episode, batches):
    import numpy as np

    import gear

    rng = np.random.default_rng(0)
    episodes = -(-n // episode)
    base = rss_bytes()
    table = gear.Table([("obs", "uint8", FRAME), ("action", "int64", ()), ("reward", "float32", ()),
                        ("done", "bool", ())],
                       max_len=episode + 1, capacity=episodes, items_per_trajectory=episode,
                       item_pattern=gear.ItemPattern.transitions(1))
    w = table.writer()
    t0 = time.perf_counter()
    for e in range(episodes):
        frames = episode_frames(rng, episode)
        with w.trajectory() as tr:
            for t in range(episode + 1):
                tr.append(obs=frames[t], action=t % 4, reward=1.0, done=t == episode - 1)
    fill_s = time.perf_counter() - t0
    stored = len(table)
    rss = rss_bytes() - base
    out = dict(stored=stored, rss=rss, fill_s=fill_s)
    for b in (32, 256):
        s = table.transition_sampler(b, obs="obs", action="action", reward="reward", done="done",
                                     frame_stack=STACK)
        times = []
        for i in range(5 + batches):
            t0 = time.perf_counter()
            x = s.sample()
            o, no = x["obs"], x["next_obs"]
            assert o.shape == (b, STACK) + FRAME and no.shape == o.shape
            if i >= 5:
                times.append(time.perf_counter() - t0)
        out[f"sample{b}_rows_per_s"] = b / float(np.median(times))
    return out


def cpprb_buffer(kind, n):
    import cpprb
    import numpy as np

    if kind == "cpprb-stack-compress":
        env = {"obs": {"shape": FRAME + (STACK,), "dtype": np.uint8}, "action": {"dtype": np.int64},
               "reward": {}, "done": {}}
        return cpprb.ReplayBuffer(n, env, next_of="obs", stack_compress="obs")
    if kind == "cpprb-next-of":
        env = {"obs": {"shape": (STACK,) + FRAME, "dtype": np.uint8}, "action": {"dtype": np.int64},
               "reward": {}, "done": {}}
        return cpprb.ReplayBuffer(n, env, next_of="obs")
    env = {"obs": {"shape": (STACK,) + FRAME, "dtype": np.uint8},
           "next_obs": {"shape": (STACK,) + FRAME, "dtype": np.uint8}, "action": {"dtype": np.int64},
           "reward": {}, "done": {}}
    return cpprb.ReplayBuffer(n, env)


def case_cpprb(kind, n, episode, batches):
    import numpy as np

    rng = np.random.default_rng(0)
    episodes = -(-n // episode)
    base = rss_bytes()
    rb = cpprb_buffer(kind, n)
    last_axis = kind == "cpprb-stack-compress"
    t0 = time.perf_counter()
    for e in range(episodes):
        frames = episode_frames(rng, episode)
        for t in range(episode):
            def stack(u):
                s = frames[[max(u - i, 0) for i in reversed(range(STACK))]]
                return np.moveaxis(s, 0, -1) if last_axis else s

            rb.add(obs=stack(t), next_obs=stack(t + 1), action=t % 4, reward=1.0, done=float(t == episode - 1))
        rb.on_episode_end()
    fill_s = time.perf_counter() - t0
    stored = rb.get_stored_size()
    rss = rss_bytes() - base
    out = dict(stored=stored, rss=rss, fill_s=fill_s)
    for b in (32, 256):
        times = []
        for i in range(5 + batches):
            t0 = time.perf_counter()
            x = rb.sample(b)
            assert x["obs"].shape[0] == b and x["next_obs"].shape == x["obs"].shape
            if i >= 5:
                times.append(time.perf_counter() - t0)
        out[f"sample{b}_rows_per_s"] = b / float(np.median(times))
    return out


def insert_gear(total):
    import numpy as np

    import gear

    table = gear.Table([("obs", "uint8", (56,)), ("action", "int32", ()), ("reward", "float32", ())],
                       max_len=1, capacity=1_000_000, sampler="prioritized")
    w = table.writer()
    cols = {"obs": np.random.randint(0, 255, (256, 56), dtype=np.uint8), "action": np.zeros(256, np.int32),
            "reward": np.zeros(256, np.float32)}
    p = np.random.default_rng(0).uniform(0.1, 2.0, 256)
    t0 = time.perf_counter()
    for _ in range(total // 256):
        w.insert_batch(cols, priorities=p)
    return dict(insert_per_s=total // 256 * 256 / (time.perf_counter() - t0))


def insert_cpprb(total):
    import cpprb
    import numpy as np

    env = {"obs": {"shape": (56,), "dtype": np.uint8}, "action": {"dtype": np.int32}, "reward": {"dtype": np.float32}}
    rb = cpprb.PrioritizedReplayBuffer(1_000_000, env)
    o = np.random.randint(0, 255, (256, 56), dtype=np.uint8)
    a, r = np.zeros(256, np.int32), np.zeros(256, np.float32)
    p = np.random.default_rng(0).uniform(0.1, 2.0, 256)
    t0 = time.perf_counter()
    for _ in range(total // 256):
        rb.add(obs=o, action=a, reward=r, priorities=p)
    return dict(insert_per_s=total // 256 * 256 / (time.perf_counter() - t0))


def child(args):
    if args.gear_path:
        sys.path.insert(0, args.gear_path)
    if args.case == "gear":
        out = case_gear(args.n, args.episode, args.batches)
    elif args.case.startswith("cpprb") or args.case == "stacked":
        out = case_cpprb(args.case, args.n, args.episode, args.batches)
    elif args.case == "insert-gear":
        out = insert_gear(args.inserts)
    else:
        out = insert_cpprb(args.inserts)
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transitions", type=int, nargs="*", default=[25_000, 50_000],
                    help="buffer sizes of the memory and sampling cases (none: inserts only)")
    ap.add_argument("--peers", default="cpprb-stack-compress,cpprb-next-of,stacked",
                    help="comma-separated memory and sampling peers (at 1 M transitions only "
                         "cpprb-stack-compress fits 24 GB beside GEAR: cpprb-next-of needs 28 GB, stacked 56 GB)")
    ap.add_argument("--episode", type=int, default=1000)
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--inserts", type=int, default=256_000, help="transitions per insert case (0: no insert cases)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gear-path", default=None)
    ap.add_argument("--case", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        return child(args)
    results = {}
    cases = [("gear", n) for n in args.transitions]
    peers = [p for p in args.peers.split(",") if p]
    unknown = set(peers) - {"cpprb-stack-compress", "cpprb-next-of", "stacked"}
    if unknown:
        ap.error(f"unknown peers {sorted(unknown)}")
    cases += [(k, n) for n in args.transitions for k in peers]
    if args.inserts > 0:
        cases += [("insert-gear", 0), ("insert-cpprb", 0)]
    for r in range(args.rounds):
        # Alternating: every case once per round.
        for case, n in cases:
            cmd = [sys.executable, __file__, "--case", case, "--n", str(n), "--episode", str(args.episode),
                   "--batches", str(args.batches), "--inserts", str(args.inserts)]
            if args.gear_path:
                cmd += ["--gear-path", args.gear_path]
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            if run.returncode != 0:
                print(json.dumps(dict(case=case, n=n, round=r, error=run.stderr[-2000:])), flush=True)
                continue
            out = json.loads(run.stdout.strip().splitlines()[-1])
            out.update(case=case, n=n, round=r)
            print(json.dumps(out), flush=True)
            results.setdefault((case, n), []).append(out)
    import statistics

    def med(case, n, key):
        vals = [o[key] for o in results.get((case, n), []) if key in o]
        return statistics.median(vals) if vals else float("nan")

    print("\nsummary (medians over rounds; ratios gear / peer)")
    for n in args.transitions:
        g = med("gear", n, "rss")
        print(f"N = {n}: gear rss {g / 2**20:.0f} MiB")
        for peer in peers:
            p = med(peer, n, "rss")
            s32 = med("gear", n, "sample32_rows_per_s") / med(peer, n, "sample32_rows_per_s")
            s256 = med("gear", n, "sample256_rows_per_s") / med(peer, n, "sample256_rows_per_s")
            print(f"  {peer:22s} rss {p / 2**20:7.0f} MiB  memory ratio {g / p:.3f}  "
                  f"sample 32 {s32:.2f}x  sample 256 {s256:.2f}x")
    ratios = [a["insert_per_s"] / b["insert_per_s"]
              for a, b in zip(results.get(("insert-gear", 0), []), results.get(("insert-cpprb", 0), []))]
    print("prioritized insert_batch of 256, gear / cpprb per round: " + ", ".join(f"{x:.2f}" for x in ratios))


if __name__ == "__main__":
    sys.exit(main())
