//! `cargo xtask <command>`: repository tasks for GEAR-rs.
//!
//! * `bench [--quick] [--runs N]`: builds `gear` in release mode, runs
//!   `gear bench --json` over the standard workloads (each N times, default
//!   3, 1 with --quick) and writes a Markdown table of medians, with each
//!   ratio's range over the runs, to stdout and `target/bench.md`.
//!   `--quick` cuts every workload to a few hundred inserts: a smoke run
//!   whose figures (the memcpy reference above all) mean little.
//! * `compare [--runs N]`: `gear bench` beside cpprb on the same workloads
//!   (a virtual environment of its own), medians and ratios from one run,
//!   a table and an SVG chart (`compare.rs`).
//! * `soak [--seconds N]`: the multi-process stress test (4 writer and 2
//!   sampler processes on one shared table, every sampled row checked) for N
//!   seconds instead of the test suite's few, then the corrupted-table fuzz
//!   (`gear-api/tests/corruption.rs`) over thousands of cases.
//! * `gpu-test [--out DIR] [--run | --build-only]`: packs
//!   gear-cuda's test and bench binaries into a folder a GPU machine without
//!   cargo can run (`run.sh`), and runs it when a GPU is present.
//! * `hdf5-bench [--runs N] [--steps N] [--episodes N]`: gear-hdf5's D4RL
//!   and Minari imports beside h5py reading the same datasets, files made
//!   by h5py in `target/hdf5-bench/` (`hdf5_bench.rs`); writes
//!   `target/hdf5-bench.md`.
//! * `rdma-test [ARGS]`: on a machine with an RDMA device, installs the
//!   rdma feature's build needs (`gear-rdma/ci/install-build-deps.sh`),
//!   then runs gear-rdma's loopback example over the real device: register,
//!   connect queue pairs by GID, READ, check every byte, print a throughput
//!   figure. ARGS go to the example (`--device`, `--port`, `--gid-index`,
//!   `--mib`, `--read-kib`, `--batch`, `--seconds`). Fails without a device
//!   unless `GEAR_REQUIRE_RDMA=0`.

// No unsafe code here; keep it that way (Miri and review focus on the crates that have some).
#![forbid(unsafe_code)]

mod compare;
mod gpu_test;
mod hdf5_bench;

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("bench") => bench(&args[1..]),
        Some("gpu-test") => gpu_test::run(&args[1..]),
        Some("soak") => soak(&args[1..]),
        Some("compare") => compare::run(&args[1..]),
        Some("hdf5-bench") => hdf5_bench::run(&args[1..]),
        Some("rdma-test") => rdma_test(&args[1..]),
        Some("help") | Some("--help") | None => {
            println!(
                "cargo xtask <command>\n\ncommands:\n  bench [--quick] [--runs N]   run gear bench over the standard workloads \
                 (medians of N runs, default 3), write target/bench.md\n  compare [--runs N]  gear bench beside cpprb on the same workloads (own venv), writes target/compare.md and .svg\n  hdf5-bench [--runs N] [--steps N] [--episodes N]  gear-hdf5 imports beside h5py reading the same datasets, writes target/hdf5-bench.md\n  soak [--seconds N]  4 writer + 2 sampler processes for N seconds (default 60), every row checked, then the corrupted-table fuzz\n  rdma-test [--device NAME] [--port N] [--gid-index N] [--seconds N]  loopback RDMA READs over a real device, bytes checked, throughput\n  {}",
                gpu_test::USAGE
            );
            Ok(())
        }
        Some(other) => bail!("unknown xtask command `{other}` (try `cargo xtask help`)"),
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// `gear bench` arguments of the small-item workloads: one-step
/// trajectories of 64 bytes (56 B obs + i32 + f32), a million slots,
/// inserted 256 per call and sampled 256 a batch. Callers add `--inserts`
/// and `--sampler`.
const SMALL_ITEMS: &[&str] = &[
    "--steps",
    "1",
    "--step-bytes",
    "56",
    "--capacity",
    "1000000",
    "--insert-batch",
    "256",
    "--batch",
    "256",
    "--batches",
    "20000",
];

/// (name, gear bench arguments)
fn workloads(quick: bool) -> Vec<(&'static str, Vec<&'static str>)> {
    let scale: &[&str] = if quick { &["--inserts", "512", "--batches", "50"] } else { &[] };
    let mut w = vec![
        ("default, uniform", vec!["--sampler", "uniform"]),
        ("default, prioritized", vec!["--sampler", "prioritized"]),
        (
            "windows 64 of 1000 steps",
            vec![
                "--steps",
                "1000",
                "--capacity",
                "256",
                "--inserts",
                "512",
                "--window-len",
                "64",
                "--window-offset",
                "-64",
            ],
        ),
        (
            "windows 64 of 1000 steps, random starts",
            vec!["--steps", "1000", "--capacity", "256", "--inserts", "512", "--window-len", "64", "--random-offsets"],
        ),
        (
            "small items (64 B), prioritized",
            [SMALL_ITEMS, &["--inserts", "2000000", "--sampler", "prioritized"]].concat(),
        ),
        // 16384 inserts (8.6 GB) keep the timed span near a second.
        ("2 writer processes + 1 sampler", vec!["--writers", "2", "--inserts", "16384"]),
    ];
    // The small items again, sampled by two threads of the process at once.
    let small = w.iter().find(|(name, _)| name.starts_with("small items")).expect("the small-items workload").1.clone();
    w.insert(
        5,
        ("small items (64 B), prioritized, 2 sampler threads", [small, vec!["--sampler-threads", "2"]].concat()),
    );
    for (_, a) in &mut w {
        // A quick run's counts replace the workload's own (gear bench
        // refuses a flag given twice).
        for pair in scale.chunks(2) {
            match a.iter().position(|x| *x == pair[0]) {
                Some(i) => a[i + 1] = pair[1],
                None => a.extend_from_slice(pair),
            }
        }
    }
    w
}

/// The median of `xs` (NaN when empty).
fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

fn bench(args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let runs: usize = match args.iter().position(|a| a == "--runs") {
        Some(i) => args.get(i + 1).context("--runs takes a number")?.parse().context("--runs takes a whole number")?,
        None if quick => 1,
        None => 3,
    };
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    let root = root();
    let status = Command::new(env!("CARGO"))
        .args(["build", "--release", "--bin", "gear"])
        .current_dir(&root)
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("cargo build --release --bin gear failed");
    }
    let gear = root.join("target/release/gear");
    let mut table = format!(
        "Median of {runs} run(s) per workload; ratios are taken within each run, with their range over the runs in \
         parentheses.\n\n\
         | workload | insert traj/s | insert GB/s | insert / memcpy | sample traj/s | sample GB/s | sample / memcpy | memcpy GB/s | insert / 2-thread memcpy | random line reads/s |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for (name, extra) in workloads(quick) {
        let mut reports = Vec::with_capacity(runs);
        for run in 1..=runs {
            eprintln!("xtask bench: {name} ({run}/{runs})");
            let out =
                Command::new(&gear).arg("bench").arg("--json").args(&extra).output().context("running gear bench")?;
            if !out.status.success() {
                bail!("gear bench {extra:?} failed: {}", String::from_utf8_lossy(&out.stderr));
            }
            let r: serde_json::Value = serde_json::from_slice(&out.stdout).context("parsing gear bench --json")?;
            reports.push(r);
        }
        let values = |k: &str| -> Vec<f64> { reports.iter().filter_map(|r| r[k].as_f64()).collect() };
        let mid = |k: &str| median(&mut values(k));
        let ratio = |k: &str| -> String {
            let mut v = values(k);
            if v.is_empty() {
                return "-".to_owned();
            }
            let m = median(&mut v);
            if v.len() == 1 {
                format!("{m:.2}")
            } else {
                format!("{m:.2} ({:.2}-{:.2})", v[0], v[v.len() - 1])
            }
        };
        table += &format!(
            "| {name} | {:.0} | {:.2} | {} | {:.0} | {:.2} | {} | {:.2} | {} | {:.1} M |\n",
            mid("insert_traj_per_s"),
            mid("insert_gb_per_s"),
            ratio("insert_vs_memcpy"),
            mid("sample_traj_per_s"),
            mid("sample_gb_per_s"),
            ratio("sample_vs_memcpy"),
            mid("memcpy_gb_per_s"),
            ratio("insert_vs_memcpy_2t"),
            mid("random_line_reads_per_s") / 1e6,
        );
    }
    print!("{table}");
    std::fs::write(root.join("target/bench.md"), &table).context("writing target/bench.md")?;
    Ok(())
}

fn soak(args: &[String]) -> Result<()> {
    let seconds: u64 = match args {
        [] => 60,
        [flag, n] if flag == "--seconds" => n.parse().context("--seconds takes a whole number")?,
        _ => bail!("usage: cargo xtask soak [--seconds N]"),
    };
    eprintln!("xtask soak: 4 writer + 2 sampler processes for {seconds} s");
    let status = Command::new(env!("CARGO"))
        .args(["test", "--release", "-p", "gear-api", "--test", "processes", "four_writer", "--", "--nocapture"])
        .env("GEAR_STRESS_MS", (seconds * 1000).to_string())
        .current_dir(root())
        .status()
        .context("running cargo test")?;
    if !status.success() {
        bail!("the soak failed");
    }
    // The corrupted-table fuzz, scaled to the soak's length (CI runs 240
    // cases; here about 200 a second, 2000 at least), with a seed of its
    // own each run so that every soak tries new corruptions.
    let cases = (seconds * 200).max(2000);
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_secs());
    eprintln!("xtask soak: {cases} corrupted tables (GEAR_FUZZ_SEED={seed})");
    let status = Command::new(env!("CARGO"))
        .args(["test", "--release", "-p", "gear-api", "--test", "corruption", "corrupted", "--", "--nocapture"])
        .env("GEAR_FUZZ_CASES", cases.to_string())
        .env("GEAR_FUZZ_SEED", seed.to_string())
        .current_dir(root())
        .status()
        .context("running cargo test")?;
    if !status.success() {
        bail!("the corrupted-table fuzz failed (rerun with GEAR_FUZZ_SEED={seed})");
    }
    Ok(())
}

/// Builds and runs gear-rdma's loopback example over the real device. The
/// build needs of the `rdma` feature come from the repository's own script;
/// `GEAR_REQUIRE_RDMA=1` makes a missing device a failure.
fn rdma_test(args: &[String]) -> Result<()> {
    let script = "build_env=\"$(bash gear-rdma/ci/install-build-deps.sh)\" && eval \"$build_env\" && \
        exec \"$CARGO\" run --release -p gear-rdma --features rdma --example rdma_loopback -- \"$@\"";
    let status = Command::new("bash")
        .arg("-c")
        .arg(script)
        .arg("rdma-test")
        .args(args)
        .env("CARGO", env!("CARGO"))
        .env("GEAR_REQUIRE_RDMA", std::env::var("GEAR_REQUIRE_RDMA").unwrap_or_else(|_| "1".into()))
        .current_dir(root())
        .status()
        .context("running bash")?;
    if !status.success() {
        bail!("the rdma loopback test failed");
    }
    Ok(())
}
