//! `cargo xtask hdf5-bench`: gear-hdf5's imports beside h5py reading the
//! same datasets, in one run. Makes its own files with h5py (as D4RL and
//! Minari make theirs: contiguous datasets) in `target/hdf5-bench/`: a
//! D4RL file of `--steps` rows (default 1,000,000: 238 bytes a step,
//! 238 MB: observations and next observations 17 x f32, actions 6 x f32,
//! rewards, terminals, timeouts, infos/qpos and infos/qvel 9 x f32) and a
//! Minari file of `--episodes` episodes (default 1000, CartPole-like, 20
//! to 500 steps each). Then, `--runs` times (default 3), alternates:
//! gear's import of the D4RL file with verification on and off
//! (`gear-hdf5/examples/import_bench.rs`), h5py's `read_direct` and
//! `ds[()]` of its datasets, gear's import of the Minari file, and h5py's
//! reads of every dataset of every episode (`xtask/hdf5/h5py_side.py`);
//! each process times three repeats and reports their median, all files
//! in the page cache. Ratios are taken within each run. Writes
//! `target/hdf5-bench.md`.
//!
//! h5py comes from `target/gear-py-venv` (made by `gear-py/ci/pytest.sh`)
//! when it has it, else from `target/hdf5-bench-venv`, made here with
//! numpy and h5py from the package registry.

use crate::compare::{check, json_of};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Options of the command.
struct Options {
    runs: usize,
    steps: u64,
    episodes: u64,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options { runs: 3, steps: 1_000_000, episodes: 1000 };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| -> Result<u64> {
            it.next().with_context(|| format!("{name} takes a number"))?.parse().with_context(|| format!("bad {name}"))
        };
        match a.as_str() {
            "--runs" => o.runs = value("--runs")? as usize,
            "--steps" => o.steps = value("--steps")?,
            "--episodes" => o.episodes = value("--episodes")?,
            other => {
                bail!("unknown option {other} (usage: cargo xtask hdf5-bench [--runs N] [--steps N] [--episodes N])")
            }
        }
    }
    if o.runs == 0 || o.steps < 1000 || o.episodes == 0 {
        bail!("--runs and --episodes must be at least 1, --steps at least 1000");
    }
    Ok(o)
}

/// A Python with h5py and numpy.
fn python(root: &Path) -> Result<PathBuf> {
    let has_h5py =
        |p: &Path| p.exists() && Command::new(p).args(["-c", "import h5py, numpy"]).status().is_ok_and(|s| s.success());
    let shared = root.join("target/gear-py-venv/bin/python");
    if has_h5py(&shared) {
        return Ok(shared);
    }
    let venv = root.join("target/hdf5-bench-venv");
    let own = venv.join("bin/python");
    if !has_h5py(&own) {
        eprintln!("xtask hdf5-bench: creating {} with numpy and h5py", venv.display());
        check(Command::new("python3").args(["-m", "venv"]).arg(&venv), "python3 -m venv")?;
        check(Command::new(&own).args(["-m", "pip", "install", "-q", "numpy", "h5py"]), "pip install numpy h5py")?;
    }
    Ok(own)
}

/// The median of the `seconds` a side printed.
fn seconds(v: &serde_json::Value) -> Result<f64> {
    let mut s: Vec<f64> =
        v["seconds"].as_array().context("no seconds in the JSON")?.iter().filter_map(|x| x.as_f64()).collect();
    if s.is_empty() {
        bail!("no seconds in the JSON");
    }
    Ok(crate::median(&mut s))
}

/// One run's times, in seconds.
#[derive(Default)]
struct Run {
    d4rl_verify: f64,
    d4rl_no_verify: f64,
    d4rl_read_direct: f64,
    d4rl_getitem: f64,
    minari: f64,
    minari_read_direct: f64,
    minari_getitem: f64,
}

pub fn run(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    let root = crate::root();
    let py = python(&root)?;
    let script = root.join("xtask/hdf5/h5py_side.py");
    check(
        Command::new(env!("CARGO"))
            .args(["build", "--release", "-p", "gear-hdf5", "--example", "import_bench"])
            .current_dir(&root),
        "cargo build --release -p gear-hdf5 --example import_bench",
    )?;
    let gear = root.join("target/release/examples/import_bench");
    let dir = root.join("target/hdf5-bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (d4rl, minari) = (dir.join("d4rl.hdf5"), dir.join("minari.hdf5"));
    eprintln!(
        "xtask hdf5-bench: writing {} ({} steps) and {} ({} episodes)",
        d4rl.display(),
        o.steps,
        minari.display(),
        o.episodes
    );
    check(
        Command::new(&py).arg(&script).arg("make-d4rl").arg(&d4rl).args(["--steps", &o.steps.to_string()]),
        "h5py_side.py make-d4rl",
    )?;
    check(
        Command::new(&py).arg(&script).arg("make-minari").arg(&minari).args(["--episodes", &o.episodes.to_string()]),
        "h5py_side.py make-minari",
    )?;
    let h5py = |file: &Path, method: &str| -> Result<serde_json::Value> {
        json_of(Command::new(&py).arg(&script).arg("read").arg(file).args(["--method", method]), "h5py_side.py read")
    };
    let ours = |file: &Path, extra: &[&str]| -> Result<serde_json::Value> {
        json_of(Command::new(&gear).arg(file).args(extra), "import_bench")
    };
    // Both files into the page cache before anything is timed.
    h5py(&d4rl, "getitem")?;
    h5py(&minari, "getitem")?;
    let mut runs = Vec::with_capacity(o.runs);
    let mut d4rl_bytes = 0.0;
    for r in 1..=o.runs {
        eprintln!("xtask hdf5-bench: run {r}/{}", o.runs);
        let mut run = Run::default();
        let v = ours(&d4rl, &[])?;
        d4rl_bytes = v["bytes"].as_f64().unwrap_or(0.0);
        run.d4rl_verify = seconds(&v)?;
        run.d4rl_read_direct = seconds(&h5py(&d4rl, "read_direct")?)?;
        run.d4rl_no_verify = seconds(&ours(&d4rl, &["--no-verify"])?)?;
        run.d4rl_getitem = seconds(&h5py(&d4rl, "getitem")?)?;
        run.minari = seconds(&ours(&minari, &[])?)?;
        run.minari_getitem = seconds(&h5py(&minari, "getitem")?)?;
        run.minari_read_direct = seconds(&h5py(&minari, "read_direct")?)?;
        runs.push(run);
    }
    let gb = |s: f64| d4rl_bytes / s / 1e9;
    let mut md = format!(
        "`cargo xtask hdf5-bench --runs {} --steps {} --episodes {}`: medians of 3 repeats per process, all files in \
         the page cache.\n\n\
         D4RL file of {} steps ({:.0} MB of step data, contiguous datasets), GB/s of step data:\n\n\
         | run | gear import (verify) | gear import (no verify) | h5py read_direct | h5py ds[()] | import / read_direct | import / ds[()] |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        o.runs,
        o.steps,
        o.episodes,
        o.steps,
        d4rl_bytes / 1e6
    );
    for (i, r) in runs.iter().enumerate() {
        md += &format!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
            i + 1,
            gb(r.d4rl_verify),
            gb(r.d4rl_no_verify),
            gb(r.d4rl_read_direct),
            gb(r.d4rl_getitem),
            r.d4rl_read_direct / r.d4rl_verify,
            r.d4rl_getitem / r.d4rl_verify
        );
    }
    md += &format!(
        "\nMinari file of {} episodes, seconds to read every dataset of every episode:\n\n\
         | run | gear import (verify) | h5py read_direct | h5py ds[()] | import / faster h5py |\n\
         | --- | ---: | ---: | ---: | ---: |\n",
        o.episodes
    );
    for (i, r) in runs.iter().enumerate() {
        md += &format!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.2} |\n",
            i + 1,
            r.minari,
            r.minari_read_direct,
            r.minari_getitem,
            r.minari / r.minari_read_direct.min(r.minari_getitem)
        );
    }
    print!("{md}");
    let out = root.join("target/hdf5-bench.md");
    std::fs::write(&out, &md).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("xtask hdf5-bench: wrote {}", out.display());
    Ok(())
}
