//! `gear demo`: the main job on the CPU default. Actor processes write
//! Atari-shaped episodes (84x84 u8 frames, action, reward, done) into a
//! shared-memory table while a trainer process samples windows with
//! prioritized replay, checks every row it gets, and feeds back sequence
//! priorities (R2D2's eta-mix of TD errors). `--threads` runs the same
//! actors and trainer as threads of one process.

use crate::children::{print_stats, spawn, GearChild};
use crate::progress::Progress;
use gear_api::{AttachOptions, RateLimiterConfig, ReplayTable, SampleConfig, StepValue};
use gear_api::{Error, Result};
use gear_core::{ColumnSpec, DType, RandomSource, TableSpec, WindowSpec, Xoshiro256};
use gear_sampler::{sequence_priority, StrategyKind, StrategyParams};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Demo settings.
#[derive(Clone, Debug, PartialEq)]
pub struct DemoConfig {
    /// Actors (processes, or threads with `threads`).
    pub actors: usize,
    /// Run actors and trainer as threads of one process instead of separate
    /// processes on a shared-memory table.
    pub threads: bool,
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
            threads: false,
            duration: Duration::from_secs(5),
            capacity: 512,
            max_len: 100,
            batch: 64,
            window: 32,
            seed: 7,
        }
    }
}

/// What one actor did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ActorStats {
    /// Process id (or 0 for a thread).
    pub pid: u32,
    /// Episodes committed.
    pub episodes: u64,
    /// Step bytes written.
    pub bytes: u64,
    /// Seconds spent.
    pub seconds: f64,
}

/// What the trainer did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainerStats {
    /// Process id (or 0 for a thread).
    pub pid: u32,
    /// Batches sampled.
    pub batches: u64,
    /// Rows whose steps were checked and found consistent.
    pub rows_checked: u64,
    /// Priority updates applied (stale ones are skipped).
    pub priority_updates: u64,
    /// Valid bytes gathered.
    pub bytes: u64,
    /// Seconds spent.
    pub seconds: f64,
}

/// What the demo did.
#[derive(Clone, Debug, PartialEq)]
pub struct DemoSummary {
    /// Each actor.
    pub actors: Vec<ActorStats>,
    /// The trainer.
    pub trainer: TrainerStats,
    /// Episodes evicted.
    pub evictions: u64,
    /// Wall time.
    pub seconds: f64,
    /// Whether SIGINT or SIGTERM ended the run before its time.
    pub interrupted: bool,
}

impl DemoSummary {
    /// Episodes committed by all actors.
    pub fn episodes(&self) -> u64 {
        self.actors.iter().map(|a| a.episodes).sum()
    }

    /// Write throughput of all actors together, GB/s.
    pub fn write_gb_per_s(&self) -> f64 {
        self.actors.iter().map(|a| a.bytes).sum::<u64>() as f64 / self.seconds / 1e9
    }

    /// Gather throughput, GB/s.
    pub fn sample_gb_per_s(&self) -> f64 {
        self.trainer.bytes as f64 / self.seconds / 1e9
    }
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

fn demo_table(c: &DemoConfig, shared_name: Option<&str>) -> Result<ReplayTable> {
    // Each episode is sampled about 8 times on average; writers wait when
    // the trainer falls behind (and the trainer when actors do), with a few
    // batches of slack either way.
    let slack = (4 * c.batch) as f64;
    let limiter = RateLimiterConfig::sample_to_insert_ratio(8.0, c.batch as u64, slack)?;
    let mut b = ReplayTable::builder(demo_spec(c)?)
        .sampler_kind(StrategyKind::Prioritized, StrategyParams { alpha: 0.6, beta: 0.4, stratified: true })
        .rate_limiter(limiter)
        .seed(c.seed);
    if let Some(name) = shared_name {
        b = b.shared_memory(name);
    }
    b.build()
}

/// Whether an error only means the table closed under us (the demo's way
/// of stopping everyone).
fn stopped(e: &Error) -> bool {
    matches!(e, Error::Closed | Error::ServerGone { .. })
}

/// One actor until `deadline`: episodes of random length whose frames and
/// actions encode the step, so the trainer can check every row.
pub fn actor_loop(table: &ReplayTable, id: u64, seed: u64, deadline: Instant) -> Result<ActorStats> {
    let start = Instant::now();
    let writer = table.writer().with_timeout(Duration::from_secs(5));
    let t_max = table.spec().max_len();
    let mut rng = Xoshiro256::seed_from_u64(seed ^ id.wrapping_mul(0x9e37_79b9));
    let mut frame = vec![0u8; FRAME as usize];
    let mut stats = ActorStats { pid: std::process::id(), ..Default::default() };
    let step_bytes = table.spec().step_bytes();
    let mut episode = id << 40;
    while Instant::now() < deadline && !crate::signals::stop_requested() {
        episode += 1;
        let len = 8 + rng.below(t_max - 7);
        let mut traj = match writer.begin(None) {
            Ok(t) => t,
            Err(e) if stopped(&e) => break,
            Err(e) => return Err(e),
        };
        for step in 0..len {
            // A moving gradient stands in for the emulator's frame; its
            // first byte carries the step.
            let shade = (episode as u8).wrapping_add(step as u8);
            frame.iter_mut().enumerate().for_each(|(i, p)| *p = shade.wrapping_add((i / 84) as u8));
            frame[0] = step as u8;
            let reward = (rng.next_f64() as f32 - 0.5) * 2.0;
            traj.append_step(&[
                StepValue::typed(&frame),
                StepValue::typed(&[step as i32]),
                StepValue::typed(&[reward]),
                StepValue::typed(&[step + 1 == len]),
            ])?;
        }
        match traj.end() {
            Ok(_) => {}
            Err(e) if stopped(&e) => break,
            Err(e) => return Err(e),
        }
        stats.episodes += 1;
        stats.bytes += len * step_bytes;
    }
    stats.seconds = start.elapsed().as_secs_f64();
    Ok(stats)
}

/// The trainer until `deadline`: sample, check, update priorities.
/// `report` is called about once a second.
pub fn trainer_loop(
    table: &ReplayTable,
    batch: usize,
    window: u64,
    deadline: Instant,
    report: &mut dyn FnMut(&TrainerStats),
) -> Result<TrainerStats> {
    let start = Instant::now();
    let mut sampler = table.sampler(
        SampleConfig::new(batch, WindowSpec::last(window))
            .columns(["obs", "action", "reward"])
            .timeout(Some(Duration::from_secs(5))),
    )?;
    let mut stats = TrainerStats { pid: std::process::id(), ..Default::default() };
    let mut last_report = Instant::now();
    let mut new_priorities = Vec::with_capacity(batch);
    let row_bytes = table.spec().step_bytes() - 1; // obs, action, reward: all but `done`
    while Instant::now() < deadline && !crate::signals::stop_requested() {
        let b = match sampler.sample() {
            Ok(b) => b,
            Err(e) if stopped(&e) => break,
            Err(e) => return Err(e),
        };
        stats.rows_checked += check_rows(b, window)?;
        stats.bytes += b.lengths().iter().sum::<u64>() * row_bytes;
        // Stand-in TD errors: reward-shaped, so priorities move.
        let rewards: &[f32] = b.column("reward")?.as_slice()?;
        new_priorities.clear();
        for (r, key) in b.keys().iter().enumerate() {
            let row = &rewards[r * window as usize..(r + 1) * window as usize];
            new_priorities.push((*key, sequence_priority(row, gear_sampler::DEFAULT_ETA) + 1e-3));
        }
        stats.priority_updates += table.update_priorities(&new_priorities)? as u64;
        stats.batches += 1;
        if last_report.elapsed() >= Duration::from_secs(1) {
            last_report = Instant::now();
            stats.seconds = start.elapsed().as_secs_f64();
            report(&stats);
        }
    }
    stats.seconds = start.elapsed().as_secs_f64();
    Ok(stats)
}

fn progress_line(progress: &Progress, table: &ReplayTable, start: Instant) -> Result<()> {
    let info = table.info()?;
    let secs = start.elapsed().as_secs_f64();
    progress.line(&format!(
        "[{secs:4.1}s] written {} episodes ({:.2} GB/s), sampled {} rows ({:.2} GB/s), size {}/{}, evicted {}",
        info.inserts,
        info.bytes_written as f64 / secs / 1e9,
        info.samples,
        info.bytes_gathered as f64 / secs / 1e9,
        info.size,
        info.capacity,
        info.evictions
    ));
    Ok(())
}

/// Runs the demo, printing progress through `progress`.
pub fn run_demo(c: &DemoConfig, progress: &mut Progress) -> Result<DemoSummary> {
    if c.actors == 0 {
        return Err(Error::Config("the demo needs at least one actor".into()));
    }
    if c.window == 0 || c.window > c.max_len || c.batch == 0 {
        return Err(Error::Config(format!(
            "the demo needs 1 <= window <= {} and a batch of at least 1 (got window {}, batch {})",
            c.max_len, c.window, c.batch
        )));
    }
    let name = format!("gear-demo-{}", std::process::id());
    let table = demo_table(c, (!c.threads).then_some(name.as_str()))?;
    // A second Ctrl-C ends the demo at once: the file goes with it.
    let _remove_file = (!c.threads).then(|| crate::signals::remove_on_exit(format!("/dev/shm/{name}").into()));
    progress.line(&format!(
        "gear demo: {} actor {}, 1 trainer (prioritized, 8 samples per insert), \
         table of {} episodes x {} steps x {} B/step ({:.0} MB of {})",
        c.actors,
        if c.threads { "threads" } else { "processes" },
        c.capacity,
        c.max_len,
        table.spec().step_bytes(),
        table.spec().data_bytes() as f64 / 1e6,
        table.memory_kind().name(),
    ));
    let start = Instant::now();
    let deadline = start + c.duration;
    let summary =
        if c.threads { run_threads(c, &table, deadline, progress) } else { run_processes(c, &name, &table, progress) };
    table.close();
    let (actors, trainer) = summary?;
    Ok(DemoSummary {
        actors,
        trainer,
        evictions: table.info()?.evictions,
        seconds: start.elapsed().as_secs_f64(),
        interrupted: crate::signals::stop_requested(),
    })
}

fn run_threads(
    c: &DemoConfig,
    table: &ReplayTable,
    deadline: Instant,
    progress: &mut Progress,
) -> Result<(Vec<ActorStats>, TrainerStats)> {
    let start = Instant::now();
    std::thread::scope(|s| {
        let actors: Vec<_> =
            (0..c.actors as u64).map(|id| s.spawn(move || actor_loop(table, id, c.seed, deadline))).collect();
        let trainer = trainer_loop(table, c.batch, c.window, deadline, &mut |_| {
            let _ = progress_line(progress, table, start);
        });
        // Wake actors blocked on the rate limiter once the trainer stops.
        table.close();
        let mut stats = Vec::new();
        for a in actors {
            let mut st = a.join().map_err(|_| Error::Config("an actor thread panicked".into()))??;
            st.pid = 0;
            stats.push(st);
        }
        let mut trainer = trainer?;
        trainer.pid = 0;
        Ok((stats, trainer))
    })
}

fn run_processes(
    c: &DemoConfig,
    name: &str,
    table: &ReplayTable,
    progress: &mut Progress,
) -> Result<(Vec<ActorStats>, TrainerStats)> {
    let start = Instant::now();
    let secs = c.duration.as_secs_f64().to_string();
    let mut actors = Vec::new();
    for id in 0..c.actors {
        let args =
            ["demo-actor", "--table", name, "--id", &id.to_string(), "--seconds", &secs, "--seed", &c.seed.to_string()];
        actors.push(spawn("actor", &args.map(String::from))?);
    }
    let args = [
        "demo-trainer",
        "--table",
        name,
        "--seconds",
        &secs,
        "--batch",
        &c.batch.to_string(),
        "--window",
        &c.window.to_string(),
    ];
    let trainer: GearChild = spawn("trainer", &args.map(String::from))?;
    let mut last_line = Instant::now();
    while start.elapsed() < c.duration && !crate::signals::stop_requested() {
        std::thread::sleep(Duration::from_millis(100).min(c.duration.saturating_sub(start.elapsed())));
        if last_line.elapsed() >= Duration::from_secs(1) {
            last_line = Instant::now();
            progress_line(progress, table, start)?;
        }
    }
    // Give children a moment to end on their own, then wake any still
    // blocked on the rate limiter (at once when a signal stopped the run:
    // the children ignore Ctrl-C and stop when the table closes).
    if !crate::signals::stop_requested() {
        std::thread::sleep(Duration::from_millis(200));
    }
    table.close();
    let trainer: TrainerStats = trainer.finish()?;
    let actors = actors.into_iter().map(GearChild::finish).collect::<Result<Vec<ActorStats>>>()?;
    Ok((actors, trainer))
}

/// `gear demo-actor`: one actor process attached to the demo's table.
pub fn actor_process(table: &str, id: u64, seconds: f64, seed: u64) -> Result<()> {
    let t = ReplayTable::attach(table, AttachOptions::default())?;
    let stats = actor_loop(&t, id, seed, Instant::now() + run_time(seconds)?)?;
    print_stats(&stats);
    Ok(())
}

/// `gear demo-trainer`: the trainer process attached to the demo's table.
pub fn trainer_process(table: &str, seconds: f64, batch: usize, window: u64) -> Result<()> {
    let t = ReplayTable::attach(table, AttachOptions::default())?;
    let stats = trainer_loop(&t, batch, window, Instant::now() + run_time(seconds)?, &mut |_| {})?;
    print_stats(&stats);
    Ok(())
}

/// Checks that each row's steps are consecutive steps of one episode (the
/// actions count up, the first frame byte carries the step) and that the
/// padding is zero. Returns the rows checked.
fn check_rows(batch: &gear_api::SampledBatch, window: u64) -> Result<u64> {
    let actions: &[i32] = batch.column("action")?.as_slice()?;
    let obs = batch.column("obs")?.bytes;
    let w = window as usize;
    for (r, &len) in batch.lengths().iter().enumerate() {
        let pad = w - len as usize;
        let row = &actions[r * w..(r + 1) * w];
        let first = row[pad.min(w - 1)];
        for (j, &a) in row.iter().enumerate() {
            let want = if j < pad { 0 } else { first + (j - pad) as i32 };
            let frame0 = obs[(r * w + j) * FRAME as usize];
            let want0 = if j < pad { 0 } else { want as u8 };
            if a != want || frame0 != want0 {
                return Err(Error::Integrity(format!(
                    "row {r} step {j} has action {a} frame byte {frame0}, expected {want} and {want0}"
                )));
            }
        }
    }
    Ok(batch.rows() as u64)
}

/// A run time in seconds as a `Duration`, refusing NaN, negative and
/// overflowing values.
fn run_time(seconds: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| Error::Config(format!("run time of {seconds} seconds: expected a finite number >= 0")))
}
