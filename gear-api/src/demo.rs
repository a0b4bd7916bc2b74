//! `gear demo`: the main job on the CPU default. Actor threads write
//! Atari-shaped episodes (84x84 u8 frames, action, reward, done) while a
//! trainer thread samples windows with prioritized replay, checks every row
//! it gets, and feeds back sequence priorities (R2D2's eta-mix of TD errors).

use crate::error::{Error, Result};
use crate::progress::Progress;
use crate::{RateLimiterConfig, ReplayTable, SampleConfig, StepValue};
use gear_core::{ColumnSpec, DType, RandomSource, TableSpec, WindowSpec, Xoshiro256};
use gear_sampler::{sequence_priority, StrategyKind, StrategyParams};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Demo settings.
#[derive(Clone, Debug, PartialEq)]
pub struct DemoConfig {
    /// Actor threads.
    pub actors: usize,
    /// How long to run.
    pub duration: Duration,
    /// Table capacity in episodes.
    pub capacity: u64,
    /// Maximum episode length T.
    pub max_len: u64,
    /// Rows per training batch.
    pub batch: usize,
    /// Steps per window.
    pub window: u64,
    /// Seed.
    pub seed: u64,
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig {
            actors: 3,
            duration: Duration::from_secs(5),
            capacity: 512,
            max_len: 100,
            batch: 64,
            window: 32,
            seed: 7,
        }
    }
}

/// What the demo did.
#[derive(Clone, Debug, PartialEq)]
pub struct DemoSummary {
    /// Episodes committed.
    pub trajectories: u64,
    /// Batches sampled.
    pub batches: u64,
    /// Rows whose steps were checked and found consistent.
    pub rows_checked: u64,
    /// Priority updates applied (stale ones are skipped).
    pub priority_updates: u64,
    /// Episodes evicted.
    pub evictions: u64,
    /// Write throughput, GB/s.
    pub write_gb_per_s: f64,
    /// Gather throughput, GB/s.
    pub sample_gb_per_s: f64,
    /// Wall time.
    pub seconds: f64,
}

const FRAME: u64 = 84 * 84;

fn demo_spec(c: &DemoConfig) -> Result<TableSpec> {
    Ok(TableSpec::new(
        vec![
            ColumnSpec::new("obs", DType::U8, vec![84, 84]),
            ColumnSpec::new("action", DType::I32, vec![]),
            ColumnSpec::new("reward", DType::F32, vec![]),
            ColumnSpec::new("done", DType::Bool, vec![]),
        ],
        c.max_len,
        c.capacity,
    )?)
}

/// One actor: episodes of random length whose frames and actions encode
/// (episode id, step) so the trainer can check every row it samples.
fn actor(table: ReplayTable, id: u64, seed: u64, stop: Arc<AtomicBool>, written: Arc<AtomicU64>) -> Result<()> {
    let writer = table.writer().with_timeout(Duration::from_secs(5));
    let t_max = table.spec().max_len();
    let mut rng = Xoshiro256::seed_from_u64(seed ^ id.wrapping_mul(0x9e37_79b9));
    let mut frame = vec![0u8; FRAME as usize];
    let mut episode = id << 40;
    while !stop.load(Ordering::Relaxed) {
        episode += 1;
        let len = 8 + rng.below(t_max - 7);
        let mut traj = writer.begin(None)?;
        for step in 0..len {
            // A moving gradient stands in for the emulator's frame; its first
            // byte carries the step so rows can be checked.
            let shade = (episode as u8).wrapping_add(step as u8);
            frame.iter_mut().enumerate().for_each(|(i, p)| *p = shade.wrapping_add((i / 84) as u8));
            frame[0] = step as u8;
            let reward = (rng.next_f64() as f32 - 0.5) * 2.0;
            let done = step + 1 == len;
            traj.append_step(&[
                StepValue::typed(&frame),
                StepValue::typed(&[step as i32]),
                StepValue::typed(&[reward]),
                StepValue::typed(&[done]),
            ])?;
        }
        traj.end()?;
        written.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Runs the demo, printing progress through `progress`.
pub fn run_demo(c: &DemoConfig, progress: &mut Progress) -> Result<DemoSummary> {
    if c.actors == 0 {
        return Err(Error::Config("the demo needs at least one actor".into()));
    }
    // Each episode is sampled about 8 times on average; writers wait when
    // trainers fall behind (and samplers when actors do), with a few
    // batches of slack either way.
    let slack = (4 * c.batch) as f64;
    let limiter = RateLimiterConfig::sample_to_insert_ratio(8.0, c.batch as u64, slack)?;
    let table = ReplayTable::builder(demo_spec(c)?)
        .sampler_kind(StrategyKind::Prioritized, StrategyParams { alpha: 0.6, beta: 0.4, stratified: true })
        .rate_limiter(limiter)
        .seed(c.seed)
        .build()?;
    progress.line(&format!(
        "gear demo: {} actors, 1 trainer (prioritized, 8 samples per insert), \
         table of {} episodes x {} steps x {} B/step ({:.0} MB, {})",
        c.actors,
        c.capacity,
        c.max_len,
        table.spec().step_bytes(),
        table.spec().data_bytes() as f64 / 1e6,
        table.shared.region.region().kind().name(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let actors: Vec<_> = (0..c.actors as u64)
        .map(|id| {
            let (t, s, w) = (table.clone(), stop.clone(), written.clone());
            let seed = c.seed;
            std::thread::spawn(move || actor(t, id, seed, s, w))
        })
        .collect();

    let start = Instant::now();
    let mut sampler = table.sampler(
        SampleConfig::new(c.batch, WindowSpec::last(c.window))
            .columns(["obs", "action", "reward"])
            .timeout(Some(Duration::from_secs(5))),
    )?;
    let (mut batches, mut rows_checked, mut updates) = (0u64, 0u64, 0u64);
    let mut last_report = Instant::now();
    let mut new_priorities = Vec::with_capacity(c.batch);
    let trainer_result = (|| -> Result<()> {
        while start.elapsed() < c.duration {
            let batch = sampler.sample()?;
            rows_checked += check_rows(batch, c.window)?;
            // Stand-in TD errors: reward-shaped, so priorities move.
            let rewards: &[f32] = batch.column("reward")?.as_slice()?;
            new_priorities.clear();
            for (r, key) in batch.keys().iter().enumerate() {
                let row = &rewards[r * c.window as usize..(r + 1) * c.window as usize];
                new_priorities.push((*key, sequence_priority(row, gear_sampler::DEFAULT_ETA) + 1e-3));
            }
            updates += table.update_priorities(&new_priorities)? as u64;
            batches += 1;
            if last_report.elapsed() >= Duration::from_secs(1) {
                last_report = Instant::now();
                let info = table.info()?;
                let secs = start.elapsed().as_secs_f64();
                progress.line(&format!(
                    "[{secs:4.1}s] written {} episodes ({:.2} GB/s), sampled {batches} batches ({:.2} GB/s), \
                     size {}/{}, evicted {}",
                    written.load(Ordering::Relaxed),
                    info.bytes_written as f64 / secs / 1e9,
                    info.bytes_gathered as f64 / secs / 1e9,
                    info.size,
                    info.capacity,
                    info.evictions
                ));
            }
        }
        Ok(())
    })();
    stop.store(true, Ordering::Relaxed);
    table.close();
    for a in actors {
        match a.join() {
            Ok(Ok(())) | Ok(Err(Error::Closed)) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(Error::Config("an actor thread panicked".into())),
        }
    }
    trainer_result?;
    let secs = start.elapsed().as_secs_f64();
    let info = table.info()?;
    Ok(DemoSummary {
        trajectories: info.inserts,
        batches,
        rows_checked,
        priority_updates: updates,
        evictions: info.evictions,
        write_gb_per_s: info.bytes_written as f64 / secs / 1e9,
        sample_gb_per_s: info.bytes_gathered as f64 / secs / 1e9,
        seconds: secs,
    })
}

/// Checks that each row's steps are consecutive steps of one episode (the
/// actions count up, the first frame byte carries the step) and that the
/// padding is zero. Returns the rows checked.
fn check_rows(batch: &crate::SampledBatch, window: u64) -> Result<u64> {
    let actions: &[i32] = batch.column("action")?.as_slice()?;
    let obs = batch.column("obs")?.bytes;
    let w = window as usize;
    for (r, &len) in batch.lengths().iter().enumerate() {
        let pad = w - len as usize;
        let row = &actions[r * w..(r + 1) * w];
        let first = row[pad];
        for (j, &a) in row.iter().enumerate() {
            let want = if j < pad { 0 } else { first + (j - pad) as i32 };
            let frame0 = obs[(r * w + j) * FRAME as usize];
            let want0 = if j < pad { 0 } else { want as u8 };
            if a != want || frame0 != want0 {
                return Err(Error::Integrity(format!(
                    "row {r} step {j} has action {a} frame byte {frame0}, \
                     expected {want} and {want0}"
                )));
            }
        }
    }
    Ok(batch.rows() as u64)
}
