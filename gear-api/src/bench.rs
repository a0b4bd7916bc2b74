//! `gear bench`: whole-process throughput of inserting trajectories and of
//! sampling and gathering batches, beside a plain `memcpy` of the same bytes
//! measured in the same run (this machine is shared and noisy, so ratios
//! are what to compare).

use crate::error::Result;
use crate::progress::Progress;
use crate::{ReplayTable, SampleConfig, StepValue};
use gear_core::{ColumnSpec, DType, Pad, TableSpec, WindowSpec};
use serde::Serialize;
use std::time::Instant;

/// The bench workload. The table has three columns: `obs` u8
/// `[step_bytes]`, `action` i32 `[]`, `reward` f32 `[]`.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchConfig {
    /// Steps per trajectory (= T).
    pub steps: u64,
    /// Bytes of `obs` per step.
    pub step_bytes: u64,
    /// Table capacity in trajectories.
    pub capacity: u64,
    /// Trajectories to insert.
    pub inserts: u64,
    /// Rows per sampled batch.
    pub batch: usize,
    /// Batches to sample.
    pub batches: u64,
    /// Sampling strategy name (see `gear_sampler::StrategyKind`).
    pub sampler: String,
    /// Window offset (negative: from the end).
    pub window_offset: i64,
    /// Window length; 0 means whole trajectories.
    pub window_len: u64,
    /// Seed of the table's random stream.
    pub seed: u64,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            steps: 128,
            step_bytes: 4096,
            capacity: 2048,
            inserts: 4096,
            batch: 32,
            batches: 400,
            sampler: "uniform".into(),
            window_offset: 0,
            window_len: 0,
            seed: 1,
        }
    }
}

/// What `gear bench --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// Backend measured.
    pub backend: &'static str,
    /// Sampling strategy.
    pub sampler: String,
    /// Bytes of one full trajectory (all columns).
    pub trajectory_bytes: u64,
    /// Trajectories inserted per second.
    pub insert_traj_per_s: f64,
    /// Step bytes inserted per second, in GB/s (1e9).
    pub insert_gb_per_s: f64,
    /// Rows sampled per second.
    pub sample_traj_per_s: f64,
    /// Valid window bytes gathered per second, in GB/s.
    pub sample_gb_per_s: f64,
    /// Plain `memcpy` of trajectory-sized chunks into a table-sized buffer.
    pub memcpy_gb_per_s: f64,
    /// `insert_gb_per_s / memcpy_gb_per_s`.
    pub insert_vs_memcpy: f64,
    /// `sample_gb_per_s / memcpy_gb_per_s`.
    pub sample_vs_memcpy: f64,
    /// Trajectories evicted during the insert phase.
    pub evictions: u64,
}

fn spec_for(c: &BenchConfig) -> Result<TableSpec> {
    Ok(TableSpec::new(
        vec![
            ColumnSpec::new("obs", DType::U8, vec![c.step_bytes]),
            ColumnSpec::new("action", DType::I32, vec![]),
            ColumnSpec::new("reward", DType::F32, vec![]),
        ],
        c.steps,
        c.capacity,
    )?)
}

/// Copies `total` bytes as `chunk`-sized pieces into a `dst_len` buffer,
/// cycling through it like the table's slots; returns GB/s.
fn memcpy_reference(chunk: usize, dst_len: usize, total: u64) -> f64 {
    let src: Vec<u8> = (0..chunk).map(|i| i as u8).collect();
    let mut dst = vec![0u8; dst_len];
    let slots = (dst_len / chunk).max(1);
    // Fault the destination in first, as the table's pool already is.
    dst.iter_mut().step_by(4096).for_each(|b| *b = 1);
    let copies = (total / chunk as u64).max(1);
    let t = Instant::now();
    for i in 0..copies {
        let off = (i as usize % slots) * chunk;
        dst[off..off + chunk].copy_from_slice(&src);
    }
    let secs = t.elapsed().as_secs_f64();
    std::hint::black_box(&dst);
    (copies * chunk as u64) as f64 / secs / 1e9
}

/// Runs the bench; `progress` shows what runs while it runs.
pub fn run_bench(c: &BenchConfig, progress: &mut Progress) -> Result<BenchReport> {
    let spec = spec_for(c)?;
    let window = if c.window_len == 0 {
        WindowSpec::whole(c.steps)
    } else {
        WindowSpec { offset: c.window_offset, len: c.window_len, pad: Pad::Tail }
    };
    window.validate(c.steps)?;
    let strategy: gear_sampler::StrategyKind = c.sampler.parse()?;
    let table = ReplayTable::builder(spec.clone()).sampler_kind(strategy, Default::default()).seed(c.seed).build()?;

    let steps = c.steps as usize;
    let obs: Vec<u8> = (0..steps * c.step_bytes as usize).map(|i| (i * 31) as u8).collect();
    let actions: Vec<i32> = (0..steps as i32).collect();
    let rewards: Vec<f32> = (0..steps).map(|i| i as f32 * 0.5).collect();
    let traj_bytes = spec.step_bytes() * c.steps;

    let writer = table.writer();
    progress.phase("insert", c.inserts);
    let t = Instant::now();
    for i in 0..c.inserts {
        let mut traj = writer.begin(Some(1.0 + (i % 7) as f64))?;
        traj.append_column("obs", c.steps, StepValue::typed(&obs))?;
        traj.append_column("action", c.steps, StepValue::typed(&actions))?;
        traj.append_column("reward", c.steps, StepValue::typed(&rewards))?;
        traj.end()?;
        progress.tick(i + 1);
    }
    let insert_s = t.elapsed().as_secs_f64();
    progress.done();

    let mut sampler = table.sampler(SampleConfig::new(c.batch, window))?;
    let before = table.info()?.bytes_gathered;
    progress.phase("sample", c.batches);
    let t = Instant::now();
    for i in 0..c.batches {
        std::hint::black_box(sampler.sample()?);
        progress.tick(i + 1);
    }
    let sample_s = t.elapsed().as_secs_f64();
    progress.done();
    let info = table.info()?;
    let gathered = info.bytes_gathered - before;

    progress.phase("memcpy reference", 1);
    let data_bytes = table.shared.region.layout().total_bytes() as usize;
    let memcpy = memcpy_reference(traj_bytes as usize, data_bytes, c.inserts * traj_bytes);
    progress.done();

    let insert_gb = (c.inserts * traj_bytes) as f64 / insert_s / 1e9;
    let sample_gb = gathered as f64 / sample_s / 1e9;
    Ok(BenchReport {
        backend: "cpu",
        sampler: strategy.name().to_owned(),
        trajectory_bytes: traj_bytes,
        insert_traj_per_s: c.inserts as f64 / insert_s,
        insert_gb_per_s: insert_gb,
        sample_traj_per_s: (c.batches * c.batch as u64) as f64 / sample_s,
        sample_gb_per_s: sample_gb,
        memcpy_gb_per_s: memcpy,
        insert_vs_memcpy: insert_gb / memcpy,
        sample_vs_memcpy: sample_gb / memcpy,
        evictions: info.evictions,
    })
}
