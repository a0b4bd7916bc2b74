"""The end-to-end training benchmark (issue 29): a decision-transformer-style
learner fed by N actor processes through each replay system, side by side.

    python3 gear-py/bench/train.py            # default grid, < 30 min on 2 cores
    python3 gear-py/bench/train.py --full     # every model x L x batch
    python3 gear-py/bench/train.py --systems gear-local --windows 32 --configs 0:32 --runs 1

It needs only the standard library: it makes one virtual environment per
system under target/train-bench/ from the package registry (GEAR: numpy
and this package built in release mode; DeepMind Reverb 0.14 with
TensorFlow 2.15, which has wheels for CPython 3.8 to 3.11 only; TorchRL;
cpprb), and one for torch (from the ordinary index, with its CUDA
libraries) that the others see through a .pth file, so the 5 GB of
torch is installed once. A system that cannot be installed is reported
unavailable with the reason, and the others still run. It builds the
`gear` binary (shard servers) in release mode, then runs
gear-py/bench/train_run.py for each (run, L, system), interleaved: run 1
of every system, then run 2, ..., and reports medians.

Writes target/train-bench/results.jsonl (every configuration of every
run), results.md (the table) and chart.svg (learner steps/s against L,
one line per system, one panel per model size).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]

SYSTEMS = ["gear-local", "gear-cluster", "reverb", "torchrl", "cpprb"]
OPTIONAL = ["reverb-client", "gear-items"]
# What the runs (train_run.py) can do: an episode's steps (EPISODE there),
# the model sizes (train_model.SIZES, and "0": no model), the episodes
# every system holds before sampling starts (--min-episodes there).
EPISODE_STEPS = 1000
MODELS = ("0", "S", "M")
MIN_EPISODES = 4
"""Run only when named: Reverb read with ``Client.sample`` (its docstring
says not to train with it; the default "reverb" reads a TrajectoryDataset);
GEAR with R2D2-style per-window priorities (items: a window of L steps every
L/2 steps, as Reverb's items here), for issue 28's sequence comparison."""

# System -> (venv, packages, import check). Torch comes from the shared venv.
VENVS: Dict[str, Tuple[str, List[str], str]] = {
    "gear-local": ("gear-venv", ["maturin>=1.5,<2", "numpy>=1.22"], "import numpy, maturin"),
    "gear-cluster": ("gear-venv", ["maturin>=1.5,<2", "numpy>=1.22"], "import numpy, maturin"),
    "gear-items": ("gear-venv", ["maturin>=1.5,<2", "numpy>=1.22"], "import numpy, maturin"),
    "reverb": ("reverb-venv", ["dm-reverb[tensorflow]==0.14.0"], "import reverb, tensorflow"),
    "reverb-client": ("reverb-venv", ["dm-reverb[tensorflow]==0.14.0"], "import reverb, tensorflow"),
    "torchrl": ("torchrl-venv", ["torchrl"], "import torchrl, tensordict"),
    "cpprb": ("cpprb-venv", ["numpy", "cpprb"], "import numpy, cpprb"),
}

DEFAULT_GRID: Dict[int, List[Tuple[str, int]]] = {
    32: [("0", 32), ("S", 32)],
    128: [("0", 32)],
    512: [("0", 32)],
}
"""L -> (model, batch) measured in one pipeline: 4 configurations x 5
systems x 3 runs, about 30 minutes on the 2-core development machine
while others build on it (model S takes seconds a step on two shared
cores, four times as long at L 128: model S beyond L 32, model M and
batch 256 are in --full)."""

FULL_GRID: Dict[int, List[Tuple[str, int]]] = {
    window: [(m, b) for m in ("0", "S", "M") for b in (32, 256)] for window in (32, 128, 512)
}


def log(msg: str) -> None:
    print(f"train-bench: {msg}", file=sys.stderr, flush=True)


def pip(python: pathlib.Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def venv(root: pathlib.Path, name: str) -> pathlib.Path:
    path = root / name
    if not (path / "bin/python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    return path / "bin/python"


def site_packages(python: pathlib.Path) -> str:
    return subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()


def setup_torch(root: pathlib.Path) -> str:
    """The torch venv; returns its site-packages."""
    python = venv(root, "torch-venv")
    if subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode != 0:
        log("installing torch (the ordinary index: ~5 GB with its CUDA libraries)")
        pip(python, "torch")
    return site_packages(python)


def setup(root: pathlib.Path, system: str, torch_site: str) -> pathlib.Path:
    """A system's venv with torch visible; returns its Python. Raises with
    the reason when the system cannot be installed here."""
    name, packages, check = VENVS[system]
    python = venv(root, name)
    # torch's venv after this one's own packages on sys.path: a .pth line.
    pathlib.Path(site_packages(python), "gear-train-bench-torch.pth").write_text(torch_site + "\n")
    if subprocess.run([str(python), "-c", check + ", torch"], capture_output=True).returncode != 0:
        log(f"installing {' '.join(packages)} into {root / name}")
        try:
            pip(python, *packages)
        except subprocess.CalledProcessError as e:
            tail = (e.stderr or b"").decode(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"pip install {' '.join(packages)} failed: {' '.join(tail)}") from None
        r = subprocess.run([str(python), "-c", check + ", torch"], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"installed but `{check}` fails: {r.stderr.strip().splitlines()[-1:]}")
    return python


def build_gear(python: pathlib.Path) -> str:
    """The release `gear` binary and the package, built into the gear venv."""
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "gear-cli", "--bin", "gear"], cwd=REPO, check=True)
    env = dict(os.environ, VIRTUAL_ENV=str(python.parent.parent), PATH=f"{python.parent}:{os.environ['PATH']}")
    subprocess.run([str(python.parent / "maturin"), "develop", "--quiet", "--release"], cwd=REPO / "gear-py",
                   env=env, check=True)
    return str(REPO / "target/release/gear")


def run_one(python: pathlib.Path, system: str, window: int, configs: Sequence[Tuple[str, int]],
            args: argparse.Namespace, gear_bin: Optional[str]) -> Tuple[List[dict], Optional[str]]:
    """One pipeline; returns its configurations' figures and an error, if any."""
    cmd = [str(python), str(HERE / "train_run.py"), "--system", system, "--window", str(window),
           "--configs", ",".join(f"{m}:{b}" for m, b in configs), "--actors", str(args.actors),
           "--seconds", str(args.seconds), "--warmup", str(args.warmup), "--obs", args.obs, "--capacity", str(args.capacity),
           "--device", args.device]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if gear_bin:
        env["GEAR_BIN"] = gear_bin
    # A bound on each pipeline: startup, warmup and the timed parts, with room
    # for a slow machine; a hang is reported, not waited on.
    limit = 240 + len(configs) * (args.seconds * 20 + 60)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return parse(out), f"timed out after {limit:.0f} s"
    rows = parse(r.stdout)
    if r.returncode != 0:
        tail = r.stderr.strip().splitlines()[-5:]
        return rows, f"exit {r.returncode}: {' / '.join(tail)}"
    return rows, None


def parse(stdout: str) -> List[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def median(xs: List[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarise(rows: List[dict]) -> Dict[Tuple[str, int, int, str], dict]:
    """(model, L, batch, system) -> medians over runs."""
    groups: Dict[Tuple[str, int, int, str], List[dict]] = {}
    for r in rows:
        if "error" in r:
            continue
        groups.setdefault((r["model"], r["window"], r["batch"], r["system"]), []).append(r)
    out = {}
    for k, rs in groups.items():
        m = {f: median([r[f] for r in rs]) for f in ("learner_steps_per_s", "windows_per_s", "data_wait_share",
                                                   "update_share", "actor_steps_per_s", "cpu_s_per_step")}
        roles = sorted({role for r in rs for role in r["cpu_share"]})
        m["cpu_share"] = {role: median([r["cpu_share"].get(role, 0.0) for r in rs]) for role in roles}
        m["runs"] = len(rs)
        m["parameters"] = rs[0]["parameters"]
        m["model_step_s"] = median([(1 - r["data_wait_share"] - r["update_share"]) / r["learner_steps_per_s"]
                                    for r in rs if r["learner_steps_per_s"] > 0])
        out[k] = m
    return out


def table(summary: Dict[Tuple[str, int, int, str], dict], systems: Sequence[str],
          errors: Dict[str, str], runs: int) -> str:
    md = (f"Medians of {runs} interleaved runs. Steps: learner steps/s; windows: trajectories (windows of L steps) "
          "consumed/s; wait: the share of the learner's time spent waiting for its next batch; update: the share "
          "spent updating priorities; actors: steps inserted/s by all actors; CPU: CPU seconds per learner step "
          "across every process of the run (learner / actors / servers, shares of one core); x GEAR: GEAR "
          "local's steps/s over this system's (gear-items' where gear-local did not run).\n\n"
          "| model | L | batch | system | steps/s | windows/s | wait | update | actors steps/s | CPU s/step "
          "(learner / actors / server cores) | x GEAR |\n"
          "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
    keys = sorted({k[:3] for k in summary}, key=lambda k: ("0SM".index(k[0]), k[1], k[2]))
    for model, window, batch in keys:
        ref = summary.get((model, window, batch, "gear-local")) or summary.get((model, window, batch, "gear-items"))
        for s in systems:
            m = summary.get((model, window, batch, s))
            if m is None:
                why = errors.get(s, "no figures")
                md += f"| {model} | {window} | {batch} | {s} | unavailable: {why.replace('|', '/')} | | | | | | |\n"
                continue
            share = m["cpu_share"]
            cores = " / ".join(f"{share.get(r, 0.0):.2f}" for r in ("learner", "actors", "server"))
            ratio = (ref["learner_steps_per_s"] / m["learner_steps_per_s"]
                     if ref and m["learner_steps_per_s"] > 0 else float("nan"))
            md += (f"| {model} | {window} | {batch} | {s} | {m['learner_steps_per_s']:.2f} | "
                   f"{m['windows_per_s']:.0f} | {m['data_wait_share'] * 100:.0f}% | {m['update_share'] * 100:.0f}% | "
                   f"{m['actor_steps_per_s']:.0f} | {m['cpu_s_per_step']:.3f} ({cores}) | {ratio:.2f} |\n")
    return md


COLORS = {"gear-local": "#d62728", "gear-cluster": "#ff7f0e", "reverb": "#1f77b4", "torchrl": "#2ca02c",
          "cpprb": "#9467bd", "reverb-client": "#17becf", "gear-items": "#8c564b"}


def chart(summary: Dict[Tuple[str, int, int, str], dict], systems: Sequence[str], batch: int) -> str:
    """Learner steps/s against L (log-log), one line per system, one panel
    per model size, at `batch`."""
    models = [m for m in ("0", "S", "M") if any(k[0] == m and k[2] == batch for k in summary)]
    windows = sorted({k[1] for k in summary if k[2] == batch})
    values = [v["learner_steps_per_s"] for k, v in summary.items() if k[2] == batch and v["learner_steps_per_s"] > 0]
    if not models or not values:
        return '<svg xmlns="http://www.w3.org/2000/svg" width="300" height="40"><text x="10" y="25">no figures' \
               "</text></svg>\n"
    lo, hi = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
    hi = max(hi, lo + 1)
    pw, ph, left, top, gap = 260.0, 240.0, 60.0, 50.0, 40.0
    width = left + len(models) * (pw + gap) + 130
    height = top + ph + 60
    s = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
         f'font-family="sans-serif" font-size="12">\n<rect width="100%" height="100%" fill="white"/>\n'
         f'<text x="10" y="20" font-size="14">Learner steps/s against window length L (batch {batch}; '
         f'medians; log scales)</text>\n')
    wlo, whi = math.log2(min(windows)), math.log2(max(windows))

    def x(panel: int, w: int) -> float:
        frac = 0.5 if whi == wlo else (math.log2(w) - wlo) / (whi - wlo)
        return left + panel * (pw + gap) + 10 + frac * (pw - 20)

    def y(v: float) -> float:
        return top + ph - (math.log10(v) - lo) / (hi - lo) * ph

    for i, model in enumerate(models):
        x0 = left + i * (pw + gap)
        title = {"0": "no model (replay ceiling)", "S": "model S (~1 M params)", "M": "model M (~10 M params)"}[model]
        s += f'<rect x="{x0:.1f}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>\n'
        s += f'<text x="{x0 + pw / 2:.1f}" y="{top - 8}" text-anchor="middle">{title}</text>\n'
        for e in range(lo, hi + 1):
            s += (f'<line x1="{x0:.1f}" y1="{y(10 ** e):.1f}" x2="{x0 + pw:.1f}" y2="{y(10 ** e):.1f}" '
                  f'stroke="#eee"/>\n')
            if i == 0:
                s += f'<text x="{x0 - 6:.1f}" y="{y(10 ** e) + 4:.1f}" text-anchor="end">{10 ** e:g}</text>\n'
        for w in windows:
            s += f'<text x="{x(i, w):.1f}" y="{top + ph + 16}" text-anchor="middle">{w}</text>\n'
        s += f'<text x="{x0 + pw / 2:.1f}" y="{top + ph + 34}" text-anchor="middle">L (steps)</text>\n'
        for system in systems:
            pts = [(x(i, w), y(summary[(model, w, batch, system)]["learner_steps_per_s"])) for w in windows
                   if (model, w, batch, system) in summary and
                   summary[(model, w, batch, system)]["learner_steps_per_s"] > 0]
            if not pts:
                continue
            color = COLORS.get(system, "black")
            if len(pts) > 1:
                s += (f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
                      + " ".join(f"{a:.1f},{b:.1f}" for a, b in pts) + '"/>\n')
            for a, b in pts:
                s += f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{color}"/>\n'
    lx = left + len(models) * (pw + gap)
    for j, system in enumerate(systems):
        yy = top + 10 + 18 * j
        s += (f'<line x1="{lx:.1f}" y1="{yy}" x2="{lx + 20:.1f}" y2="{yy}" stroke="{COLORS.get(system, "black")}" '
              f'stroke-width="3"/><text x="{lx + 26:.1f}" y="{yy + 4}">{system}</text>\n')
    s += (f'<text x="14" y="{top + ph / 2:.1f}" transform="rotate(-90 14 {top + ph / 2:.1f})" '
          f'text-anchor="middle">learner steps/s</text>\n')
    return s + "</svg>\n"


def load_average() -> str:
    try:
        return " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuses, naming it, an argument no run could use (before anything
    is installed or started)."""

    def positive_int(text: str, what: str, most: Optional[int] = None) -> int:
        try:
            value = int(text)
        except ValueError:
            ap.error(f"{what}: {text!r} is not a whole number")
        if value < 1 or (most is not None and value > most):
            ap.error(f"{what}: {value} must be between 1 and {most}" if most else f"{what}: {value} must be at least 1")
        return value

    if args.windows is not None:
        for w in args.windows.split(","):
            positive_int(w, "--windows (L, steps per window, at most an episode's)", EPISODE_STEPS)
    if args.configs is not None:
        for c in args.configs.split(","):
            model, sep, batch = c.partition(":")
            if not sep or model not in MODELS:
                ap.error(f"--configs: {c!r} is not MODEL:BATCH with MODEL one of {', '.join(MODELS)}")
            positive_int(batch, f"--configs {c!r}: the batch")
    if args.actors < 1:
        ap.error(f"--actors: {args.actors} must be at least 1")
    if not (args.seconds > 0 and math.isfinite(args.seconds)):
        ap.error(f"--seconds: {args.seconds} must be a positive number of seconds")
    if not (args.warmup >= 0 and math.isfinite(args.warmup)):
        ap.error(f"--warmup: {args.warmup} must be zero or more seconds")
    if args.obs != "frames":
        positive_int(args.obs, "--obs (bytes of an observation, or 'frames')", 1 << 20)
    if args.capacity < MIN_EPISODES:
        ap.error(f"--capacity: {args.capacity} episodes cannot hold the {MIN_EPISODES} that sampling waits for")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="every model x L x batch (takes hours here)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated, of " + ", ".join(SYSTEMS))
    ap.add_argument("--windows", help="comma-separated L (default: the grid's)")
    ap.add_argument("--configs", help="MODEL:BATCH,... for every L (default: the grid's)")
    ap.add_argument("--runs", type=int, default=3, help="interleaved runs (medians reported)")
    ap.add_argument("--actors", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5.0, help="timed seconds per configuration")
    ap.add_argument("--warmup", type=float, default=1.5, help="untimed seconds before each configuration")
    ap.add_argument("--obs", default="frames", help="'frames' (84x84 u8) or a byte count")
    ap.add_argument("--capacity", type=int, default=64, help="episodes each replay system holds")
    ap.add_argument("--device", default="host",
                    help="'host' (train where the replay system puts the batch) or a torch device such as cuda: "
                         "the model there, each batch staged to it one step ahead (train_device.py)")
    ap.add_argument("--out", default=str(REPO / "target/train-bench"), help="where venvs and results go")
    ap.add_argument("--python", action="append", default=[], metavar="SYSTEM=PYTHON",
                    help="use this interpreter for a system instead of making its venv (CI)")
    args = ap.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    unknown = [s for s in systems if s not in SYSTEMS + OPTIONAL]
    if unknown:
        ap.error(f"unknown system(s) {unknown}; known: {SYSTEMS + OPTIONAL}")
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    check_args(ap, args)
    grid = FULL_GRID if args.full else DEFAULT_GRID
    if args.windows:
        windows = [int(w) for w in args.windows.split(",")]
        grid = {w: grid.get(w, DEFAULT_GRID[32]) for w in windows}
    if args.configs:
        configs = [(c.split(":")[0], int(c.split(":")[1])) for c in args.configs.split(",")]
        grid = {w: configs for w in grid}
    out = pathlib.Path(args.out).resolve()  # children run in other directories
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    log(f"load average at start: {load_average()}")

    given = dict(p.split("=", 1) for p in args.python)
    pythons: Dict[str, pathlib.Path] = {}
    errors: Dict[str, str] = {}
    torch_site: Optional[str] = None
    for s in systems:
        if s in given:
            pythons[s] = pathlib.Path(given[s])
            continue
        try:
            if torch_site is None:
                torch_site = setup_torch(out)
            pythons[s] = setup(out, s, torch_site)
        except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
            errors[s] = str(e)
            log(f"{s} unavailable: {e}")
    gear_bin = os.environ.get("GEAR_BIN")
    gear_systems = [s for s in systems if s.startswith("gear") and s in pythons and s not in given]
    if gear_systems:
        log("building gear (release) and the Python package")
        try:
            gear_bin = build_gear(pythons[gear_systems[0]])
        except subprocess.CalledProcessError as e:
            for s in gear_systems:
                errors[s] = f"build failed: {e}"
                pythons.pop(s)
    log(f"setup took {time.time() - started:.0f} s")

    rows: List[dict] = []
    jsonl = out / "results.jsonl"
    with jsonl.open("w") as f:
        for run in range(1, args.runs + 1):
            for window, configs in grid.items():
                for s in systems:
                    if s not in pythons:
                        continue
                    log(f"run {run}/{args.runs}, L {window}, {s} (load {load_average()})")
                    t = time.time()
                    got, err = run_one(pythons[s], s, window, configs, args, gear_bin)
                    for r in got:
                        r.update(run=run, load_average=load_average())
                        rows.append(r)
                        f.write(json.dumps(r) + "\n")
                    if err:
                        errors.setdefault(s, f"L {window}, run {run}: {err}")
                        rec = {"system": s, "window": window, "run": run, "error": err}
                        rows.append(rec)
                        f.write(json.dumps(rec) + "\n")
                        log(f"{s} failed: {err}")
                    f.flush()
                    log(f"  {time.time() - t:.0f} s: " + "; ".join(
                        f"{r['model']}:{r['batch']} {r['learner_steps_per_s']:.2f} steps/s, "
                        f"wait {r['data_wait_share'] * 100:.0f}%" for r in got))
    summary = summarise(rows)
    md = table(summary, systems, errors, args.runs)
    md += (f"\n{len(systems)} systems, {args.actors} actors, {args.obs} observations, learner on {args.device}, "
           f"whole run {(time.time() - started) / 60:.1f} min, load average at the end {load_average()}.\n")
    (out / "results.md").write_text(md)
    batch = min(b for cs in grid.values() for _, b in cs)
    (out / "chart.svg").write_text(chart(summary, systems, batch))
    print(md)
    log(f"wrote {jsonl}, {out / 'results.md'} and {out / 'chart.svg'}")
    return 0


def remove_stale_tables() -> None:
    """Removes what killed runs left behind: the GEAR tables and shard
    directories the runs name `gear-train-bench-<pid>-...`, in /dev/shm and
    the temporary directory, whose process is gone (a run killed by
    SIGKILL, or by this script's timeout, cannot remove its own)."""
    for base in sorted({"/dev/shm", tempfile.gettempdir()}):
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            m = re.match(r"gear-train-bench-(\d+)-", name)
            if not m or process_alive(int(m.group(1))):
                continue
            path = os.path.join(base, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


if __name__ == "__main__":
    # SIGTERM ends a run as an error would: the running configuration's
    # process is stopped and what it left is removed.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    remove_stale_tables()
    try:
        sys.exit(main())
    finally:
        remove_stale_tables()
