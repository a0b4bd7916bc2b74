//! The offline training loop GEAR's paper measures: import a D4RL dataset
//! once, then sample windows of 64 steps as fast as the trainer takes them.
//!
//! ```text
//! cargo run --release -p gear-hdf5 --example offline_d4rl -- [FILE.hdf5] [--iters N] [--batch B]
//! ```
//!
//! Without a file, a synthetic Hopper-sized one (obs 11 x f32, actions
//! 3 x f32, 1000-step episodes ending in timeouts, chunked and deflated
//! like D4RL's) of `--steps` rows (default 200 000) is written to the
//! temporary directory first.

use anyhow::{bail, Context, Result};
use gear_api::{ReplayTable, SampleConfig};
use gear_core::WindowSpec;
use gear_hdf5::{ImportOptions, Phase};
use hdf5_pure::{EnumTypeBuilder, FileBuilder};
use std::path::{Path, PathBuf};
use std::time::Instant;

fn main() -> Result<()> {
    let mut file: Option<PathBuf> = None;
    let (mut iters, mut batch, mut steps, mut window) = (2000u64, 256usize, 200_000u64, 64u64);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |name: &str| -> Result<u64> {
            args.next().with_context(|| format!("{name} needs a value"))?.parse().with_context(|| format!("bad {name}"))
        };
        match a.as_str() {
            "--iters" => iters = num("--iters")?,
            "--batch" => batch = num("--batch")? as usize,
            "--steps" => steps = num("--steps")?,
            "--window" => window = num("--window")?,
            s if s.starts_with("--") => bail!("unknown option {s}"),
            s => file = Some(PathBuf::from(s)),
        }
    }
    let synthetic = file.is_none();
    let path = match file {
        Some(p) => p,
        None => {
            let p = std::env::temp_dir().join(format!("gear-offline-d4rl-{}.hdf5", std::process::id()));
            let t = Instant::now();
            write_synthetic(&p, steps)?;
            println!("wrote a synthetic D4RL file of {steps} steps to {} in {:.2?}", p.display(), t.elapsed());
            p
        }
    };
    let result = run(&path, iters, batch, window);
    if synthetic {
        let _ = std::fs::remove_file(&path);
    }
    result
}

fn run(path: &Path, iters: u64, batch: usize, window: u64) -> Result<()> {
    // A table for the file: its datasets as columns, T = the longest
    // episode, room for every episode.
    let info = gear_hdf5::describe(path, None)?;
    let spec = info.table_spec(None, None)?;
    if window > spec.max_len() {
        bail!("window {window} is longer than the longest episode ({})", spec.max_len());
    }
    println!(
        "{}: {} episodes, {} steps, columns {:?}",
        path.display(),
        info.episodes,
        info.steps,
        spec.columns().iter().map(|c| c.name()).collect::<Vec<_>>()
    );
    let table = ReplayTable::builder(spec).build()?;
    let t = Instant::now();
    let mut last = Instant::now();
    let mut shown = Phase::Verify;
    let report = gear_hdf5::import_with_progress(&table, path, &ImportOptions::default(), &mut |p| {
        if p.phase != shown {
            eprintln!();
            shown = p.phase;
        }
        if last.elapsed().as_millis() > 500 || p.steps_done == p.total_steps {
            let phase = if p.phase == Phase::Verify { "verify" } else { "insert" };
            eprint!("\r{phase}: {}/{} steps   ", p.steps_done, p.total_steps);
            last = Instant::now();
        }
    })?;
    eprintln!();
    println!(
        "imported {} trajectories ({:.1} MB) in {:.2?} ({:.0} steps/s)",
        report.trajectories,
        report.bytes as f64 / 1e6,
        t.elapsed(),
        report.steps as f64 / t.elapsed().as_secs_f64()
    );

    let mut sampler = table.sampler(SampleConfig::new(batch, WindowSpec::first(window)).random_start())?;
    sampler.sample()?; // warm the buffers
    let t = Instant::now();
    let mut bytes = 0u64;
    for _ in 0..iters {
        let b = sampler.sample()?;
        bytes += b.lengths().iter().sum::<u64>() * table.spec().step_bytes();
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "sampled {iters} batches of {batch} windows x {window} steps in {secs:.2} s: {:.0} samples/s, {:.2} GB/s \
         of valid step data",
        (iters * batch as u64) as f64 / secs,
        bytes as f64 / secs / 1e9
    );
    Ok(())
}

/// A Hopper-sized D4RL file: obs (N, 11) f32, actions (N, 3) f32,
/// rewards (N,) f32, terminals and timeouts (N,) bool, 1000-step episodes.
fn write_synthetic(path: &Path, n: u64) -> Result<()> {
    let obs: Vec<f32> = (0..n * 11).map(|i| (i % 977) as f32 * 1e-3).collect();
    let act: Vec<f32> = (0..n * 3).map(|i| (i % 13) as f32 - 6.0).collect();
    let rew: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let timeouts: Vec<u8> = (0..n).map(|i| u8::from(i % 1000 == 999)).collect();
    let terminals = vec![0u8; n as usize];
    let bool_type = EnumTypeBuilder::with_base(hdf5_pure::make_i8_type()).value("FALSE", 0).value("TRUE", 1).build()?;
    let mut fb = FileBuilder::new();
    fb.create_dataset("observations").with_f32_data(&obs).with_shape(&[n, 11]).with_chunks(&[4096, 11]).with_deflate(4);
    fb.create_dataset("actions").with_f32_data(&act).with_shape(&[n, 3]).with_chunks(&[4096, 3]).with_deflate(4);
    fb.create_dataset("rewards").with_f32_data(&rew).with_chunks(&[4096]).with_deflate(4);
    fb.create_dataset("terminals").with_raw_data(bool_type.clone(), terminals, n);
    fb.create_dataset("timeouts").with_raw_data(bool_type, timeouts, n);
    fb.write(path)?;
    Ok(())
}
