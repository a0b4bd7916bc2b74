//! `gear bench`: whole-process throughput of inserting trajectories and of
//! sampling and gathering batches, beside a plain `memcpy` of the same bytes
//! measured in the same run (this machine is shared and noisy, so ratios
//! are what to compare).

use crate::children::{print_stats, spawn, GearChild};
use crate::progress::Progress;
use gear_api::{AttachOptions, ReplayTable, SampleConfig, StepValue};
use gear_api::{Error, Result};
use gear_core::{ColumnSpec, DType, Pad, TableSpec, WindowSpec};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The bench workload. The table has three columns: `obs` u8
/// `[step_bytes]`, `action` i32 `[]`, `reward` f32 `[]`. Also the flags of
/// `gear bench`.
#[derive(Clone, Debug, PartialEq, clap::Args)]
pub struct BenchConfig {
    /// Steps per trajectory (T).
    #[arg(long, default_value_t = 128)]
    pub steps: u64,
    /// Bytes of the `obs` column per step.
    #[arg(long, default_value_t = 4096)]
    pub step_bytes: u64,
    /// Table capacity in trajectories.
    #[arg(long, default_value_t = 2048)]
    pub capacity: u64,
    /// Trajectories to insert.
    #[arg(long, default_value_t = 4096)]
    pub inserts: u64,
    /// Rows per batch.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Batches to sample.
    #[arg(long, default_value_t = 400)]
    pub batches: u64,
    /// Sampling strategy: uniform, prioritized, fifo, lifo, max-heap, min-heap.
    #[arg(long, default_value = "uniform")]
    pub sampler: String,
    /// Window start (negative: from the end).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub window_offset: i64,
    /// Window length; 0 means whole trajectories.
    #[arg(long, default_value_t = 0)]
    pub window_len: u64,
    /// Start each row's window at a random step of its trajectory (R2D2
    /// sequence sampling) instead of at --window-offset.
    #[arg(long)]
    pub random_offsets: bool,
    /// Seed of the table's random stream.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Trajectories per insert call: 1 inserts each with begin / append /
    /// end; more use `Writer::insert_batch` (small items).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub insert_batch: u64,
    /// Threads of the bench process sampling at once, each with its own
    /// `Sampler` (a trainer's data-loader threads); the batches are split
    /// between them. With --shards: batches in flight at once, each drawn
    /// by its own thread through the one cluster client.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub sampler_threads: u64,
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
            random_offsets: false,
            seed: 1,
            insert_batch: 1,
            sampler_threads: 1,
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
    /// Plain single-threaded `memcpy` of the bytes sampling copies: batch
    /// after batch, `batch` random trajectory-sized chunks of a buffer the
    /// size of the table's data into a batch-sized buffer. Without writer
    /// processes it is timed in rounds interleaved with the sampling rounds,
    /// so both see the same machine.
    pub sample_memcpy_gb_per_s: f64,
    /// `sample_gb_per_s / sample_memcpy_gb_per_s`.
    pub sample_vs_memcpy: f64,
    /// Trajectories evicted during the insert phase.
    pub evictions: u64,
    /// Writer processes (0: one process did everything, in turn).
    pub writers: usize,
    /// Threads that sampled at once.
    pub sampler_threads: u64,
    /// Two threads each copying half of the bytes (the reference for
    /// several writer processes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memcpy_2t_gb_per_s: Option<f64>,
    /// `insert_gb_per_s / memcpy_2t_gb_per_s`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insert_vs_memcpy_2t: Option<f64>,
    /// Independent reads of random 64-byte lines per second over a buffer
    /// the size of the table (at most 256 MiB), on as many threads as
    /// sampled (`sampler_threads`; one with writer processes): the most
    /// cache misses those cores overlap, which bounds any sampling that
    /// touches a few random lines per row (small items).
    pub random_line_reads_per_s: f64,
}

fn sample_config(c: &BenchConfig) -> Result<SampleConfig> {
    let config = SampleConfig::new(c.batch, window_for(c)?);
    Ok(if c.random_offsets { config.random_start() } else { config })
}

pub(crate) fn window_for(c: &BenchConfig) -> Result<WindowSpec> {
    let window = if c.window_len == 0 {
        WindowSpec::whole(c.steps)
    } else {
        WindowSpec { offset: c.window_offset, len: c.window_len, pad: Pad::Tail }
    };
    window.validate(c.steps)?;
    Ok(window)
}

/// The columns of `batch` trajectories, one after the other, as the bench
/// writes them.
struct Trajectories {
    steps: u64,
    batch: u64,
    obs: Vec<u8>,
    actions: Vec<i32>,
    rewards: Vec<f32>,
    priorities: Vec<f64>,
}

/// Most bytes the bench stages for one insert call: an absurd
/// `--insert-batch` is refused with an error, not an allocation abort.
const MAX_STAGED_BYTES: u64 = 1 << 30;

impl Trajectories {
    /// The data for calls of `batch` trajectories (at most `count`, the
    /// trajectories that will be inserted).
    fn new(steps: u64, step_bytes: u64, batch: u64, count: u64) -> Result<Self> {
        let batch = batch.min(count).max(1);
        let staged = steps.checked_mul(batch).and_then(|n| n.checked_mul(step_bytes.saturating_add(8)));
        if staged.is_none_or(|b| b > MAX_STAGED_BYTES) {
            return Err(Error::Config(format!(
                "--insert-batch {batch} of {steps}-step trajectories of {step_bytes}-byte steps would stage more than \
                 {MAX_STAGED_BYTES} bytes per call; use a smaller --insert-batch"
            )));
        }
        let n = (steps * batch) as usize;
        Ok(Trajectories {
            steps,
            batch,
            obs: (0..n * step_bytes as usize).map(|i| (i * 31) as u8).collect(),
            actions: (0..n as i32).collect(),
            rewards: (0..n).map(|i| i as f32 * 0.5).collect(),
            priorities: (0..batch).map(|i| 1.0 + (i % 7) as f64).collect(),
        })
    }

    /// Inserts `count` trajectories (priorities cycling through 1..=7);
    /// `tick` hears how many are in after each call.
    fn insert(&self, writer: &gear_api::Writer, count: u64, mut tick: impl FnMut(u64)) -> Result<()> {
        let mut done = 0;
        while done < count {
            if self.batch == 1 {
                let mut traj = writer.begin(Some(1.0 + (done % 7) as f64))?;
                // Columns by index (obs, action, reward), as a hot loop would.
                traj.append_column(0, self.steps, StepValue::typed(&self.obs))?;
                traj.append_column(1, self.steps, StepValue::typed(&self.actions))?;
                traj.append_column(2, self.steps, StepValue::typed(&self.rewards))?;
                traj.end()?;
                done += 1;
            } else {
                let n = self.batch.min(count - done);
                let steps = (n * self.steps) as usize;
                let obs_bytes = self.obs.len() / (self.batch * self.steps) as usize * steps;
                writer.insert_batch(
                    n as usize,
                    self.steps,
                    &[
                        StepValue::typed(&self.obs[..obs_bytes]),
                        StepValue::typed(&self.actions[..steps]),
                        StepValue::typed(&self.rewards[..steps]),
                    ],
                    Some(&self.priorities[..n as usize]),
                )?;
                done += n;
            }
            tick(done);
        }
        Ok(())
    }
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
/// cycling through it like the table's slots, split over `threads` threads
/// that each own a part of the buffer; returns GB/s over the wall time.
fn memcpy_reference(chunk: usize, dst_len: usize, total: u64, threads: usize) -> f64 {
    let src: Vec<u8> = (0..chunk).map(|i| i as u8).collect();
    let mut dst = vec![0u8; dst_len];
    // Fault the destination in first, as the table's pool already is.
    dst.iter_mut().step_by(4096).for_each(|b| *b = 1);
    let part = (dst_len / threads).max(chunk);
    let copies = (total / chunk as u64 / threads as u64).max(1);
    let t = Instant::now();
    std::thread::scope(|s| {
        for part in dst.chunks_mut(part).take(threads) {
            let src = &src;
            s.spawn(move || {
                let slots = (part.len() / chunk).max(1);
                for i in 0..copies {
                    let off = (i as usize % slots) * chunk;
                    part[off..off + chunk].copy_from_slice(src);
                }
            });
        }
    });
    let secs = t.elapsed().as_secs_f64();
    std::hint::black_box(&dst);
    (copies * threads as u64 * chunk as u64) as f64 / secs / 1e9
}

/// Reads `reads` random 64-byte lines of a `bytes`-sized buffer (at most
/// [`RANDOM_REFERENCE_MAX_BYTES`]) on each of `threads` threads, in batches
/// of 256 prefetched first as the sampler does; returns reads per second,
/// over all threads.
fn random_line_reference(bytes: u64, reads: u64, threads: usize) -> f64 {
    let threads = threads.max(1);
    let lines = (bytes.min(RANDOM_REFERENCE_MAX_BYTES) / 64).max(1);
    // Backed by huge pages where the table's pool is, and filled, so every
    // page is faulted in, as the pool's are.
    let mut buf: Vec<u8> = Vec::with_capacity((lines * 64) as usize);
    gear_core::hint::advise_huge_pages(buf.as_ptr(), buf.capacity());
    buf.resize((lines * 64) as usize, 1);
    let buf = &buf;
    let addresses = |seed: u64| -> Vec<usize> {
        let mut rng = gear_core::Xoshiro256::seed_from_u64(seed);
        (0..reads).map(|_| (gear_core::RandomSource::below(&mut rng, lines) * 64) as usize).collect()
    };
    let read = |at: Vec<usize>| {
        let mut sum = 0u64;
        for batch in at.chunks(256) {
            for &i in batch {
                gear_core::hint::prefetch(&buf[i]);
            }
            for &i in batch {
                sum = sum.wrapping_add(u64::from(buf[i]));
            }
        }
        std::hint::black_box(sum);
    };
    let work: Vec<Vec<usize>> = (0..threads as u64).map(|i| addresses(7 + i)).collect();
    let t = Instant::now();
    std::thread::scope(|scope| {
        for at in work {
            scope.spawn(move || read(at));
        }
    });
    (reads * threads as u64) as f64 / t.elapsed().as_secs_f64()
}

/// Largest buffer [`random_line_reference`] reads: far past every cache.
const RANDOM_REFERENCE_MAX_BYTES: u64 = 256 << 20;

/// Random line reads the reference times.
const RANDOM_REFERENCE_READS: u64 = 4_000_000;

/// Runs the bench; `progress` shows what runs while it runs.
pub fn run_bench(c: &BenchConfig, progress: &mut Progress) -> Result<BenchReport> {
    let spec = spec_for(c)?;
    sample_config(c)?;
    let strategy: gear_sampler::StrategyKind = c.sampler.parse()?;
    let table = ReplayTable::builder(spec.clone()).sampler_kind(strategy, Default::default()).seed(c.seed).build()?;
    let data = Trajectories::new(c.steps, c.step_bytes, c.insert_batch, c.inserts)?;
    let traj_bytes = spec.step_bytes() * c.steps;

    let writer = table.writer();
    progress.phase("insert", c.inserts);
    let t = Instant::now();
    data.insert(&writer, c.inserts, |n| progress.tick(n))?;
    let insert_s = t.elapsed().as_secs_f64();
    progress.done();

    let before = table.info()?.bytes_gathered;
    let data_bytes = table.spec().data_bytes() as usize;
    // Samplers first: they refuse a batch size that cannot work.
    let mut samplers = make_samplers(&table, c)?;
    let layout = samplers[0].layout();
    let mut reference = GatherReference::new(data_bytes, row_bytes(layout), layout.rows());
    progress.phase("sample (rounds interleaved with a memcpy of the same bytes)", c.batches);
    let (mut sample_s, mut done) = (0.0, 0);
    for round in 0..SAMPLE_ROUNDS {
        let batches = c.batches / SAMPLE_ROUNDS + u64::from(round < c.batches % SAMPLE_ROUNDS);
        let t = Instant::now();
        sample_on_threads(&mut samplers, batches, &mut |n| progress.tick(done + n))?;
        sample_s += t.elapsed().as_secs_f64();
        done += batches;
        reference.copy_batches(batches);
    }
    progress.done();
    drop(samplers);
    let info = table.info()?;
    let gathered = info.bytes_gathered - before;

    progress.phase("memcpy and random-read references", 2);
    let memcpy = memcpy_reference(traj_bytes as usize, data_bytes, c.inserts * traj_bytes, 1);
    progress.tick(1);
    let random_lines = random_line_reference(table.region_bytes(), RANDOM_REFERENCE_READS, c.sampler_threads as usize);
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
        sample_memcpy_gb_per_s: reference.gb_per_s(),
        sample_vs_memcpy: ratio(sample_gb, reference.gb_per_s()),
        evictions: info.evictions,
        writers: 0,
        sampler_threads: c.sampler_threads,
        memcpy_2t_gb_per_s: None,
        insert_vs_memcpy_2t: None,
        random_line_reads_per_s: random_lines,
    })
}

/// Samples `c.batches` batches on `c.sampler_threads` threads, each with
/// its own sampler; this thread samples a share too and shows progress.
/// `a / b`, or 0 when nothing was measured (`b` is 0).
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// Rounds the sampling phase is split into, each followed by the same
/// number of batches of [`GatherReference`].
const SAMPLE_ROUNDS: u64 = 5;

/// One sampler per sampling thread, all made before any samples, so a bad
/// config fails here.
fn make_samplers(table: &ReplayTable, c: &BenchConfig) -> Result<Vec<gear_api::Sampler>> {
    (0..c.sampler_threads.max(1)).map(|_| table.sampler(sample_config(c)?)).collect()
}

/// Samples `batches` batches, shared out over `samplers`, one thread each;
/// calls `tick` with the count done by all.
fn sample_on_threads(samplers: &mut [gear_api::Sampler], batches: u64, tick: &mut dyn FnMut(u64)) -> Result<()> {
    let threads = samplers.len() as u64;
    let done = AtomicU64::new(0);
    let share = |i: u64| batches / threads + u64::from(i < batches % threads);
    let run = |sampler: &mut gear_api::Sampler, batches: u64, tick: &mut dyn FnMut(u64)| -> Result<()> {
        for _ in 0..batches {
            std::hint::black_box(sampler.sample()?);
            tick(done.fetch_add(1, Ordering::Relaxed) + 1);
        }
        Ok(())
    };
    let (mine, others) = samplers.split_first_mut().expect("at least one sampler thread");
    std::thread::scope(|scope| {
        let handles: Vec<_> = others
            .iter_mut()
            .enumerate()
            .map(|(i, sampler)| {
                let batches = share(i as u64 + 1);
                scope.spawn(move || run(sampler, batches, &mut |_| {}))
            })
            .collect();
        let result = run(mine, share(0), tick);
        for h in handles {
            h.join().map_err(|_| Error::Config("a bench sampler thread panicked".into()))??;
        }
        tick(done.load(Ordering::Relaxed));
        result
    })
}

/// Bytes of one batch row, every requested column together.
fn row_bytes(layout: &gear_core::BatchLayout) -> usize {
    (0..layout.columns().len()).map(|i| layout.row_bytes(i) as usize).sum()
}

/// The plain-`memcpy` reference for sampling: the bytes a batch copies
/// (`rows` random row-sized chunks, a whole trajectory or a window, of a
/// buffer the size of the table's data, into one batch-sized buffer reused
/// batch after batch), with `copy_from_slice` on one thread.
struct GatherReference {
    source: Vec<u8>,
    batch: Vec<u8>,
    chunk: usize,
    rows: usize,
    rng: gear_core::Xoshiro256,
    bytes: u64,
    seconds: f64,
}

impl GatherReference {
    fn new(source_bytes: usize, chunk: usize, rows: usize) -> Self {
        let chunk = chunk.max(1);
        // Filled, so every page is faulted in as the table's are.
        let source = vec![1u8; source_bytes.max(chunk)];
        let batch = vec![0u8; chunk * rows.max(1)];
        GatherReference {
            source,
            batch,
            chunk,
            rows: rows.max(1),
            rng: gear_core::Xoshiro256::seed_from_u64(7),
            bytes: 0,
            seconds: 0.0,
        }
    }

    /// Copies `batches` batches, adding to the bytes and time measured.
    fn copy_batches(&mut self, batches: u64) {
        let chunks = (self.source.len() / self.chunk) as u64;
        let starts: Vec<usize> = (0..batches as usize * self.rows)
            .map(|_| gear_core::RandomSource::below(&mut self.rng, chunks) as usize * self.chunk)
            .collect();
        let t = Instant::now();
        for batch in starts.chunks(self.rows) {
            for (row, &start) in batch.iter().enumerate() {
                self.batch[row * self.chunk..(row + 1) * self.chunk]
                    .copy_from_slice(&self.source[start..start + self.chunk]);
            }
            std::hint::black_box(&self.batch);
        }
        self.seconds += t.elapsed().as_secs_f64();
        self.bytes += starts.len() as u64 * self.chunk as u64;
    }

    fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(f64::MIN_POSITIVE) / 1e9
    }
}

/// What a bench writer process reports.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WriterStats {
    /// Trajectories inserted.
    pub trajectories: u64,
    /// Bytes inserted.
    pub bytes: u64,
    /// Seconds spent.
    pub seconds: f64,
    /// When the first insert began ([`monotonic_ns`]).
    pub start_ns: u64,
    /// When the last insert ended ([`monotonic_ns`]).
    pub end_ns: u64,
}

/// What the bench sampler process reports.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SamplerStats {
    /// Rows sampled.
    pub rows: u64,
    /// Valid bytes gathered.
    pub bytes: u64,
    /// Seconds spent.
    pub seconds: f64,
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process on the
/// machine, so the parent can line up what its children measured.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists on
    // every Linux, and on failure `ts` stays zero (no undefined state).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// Sleeps until [`monotonic_ns`] reaches `at` (at once if it has), so that
/// child processes started one after another begin their timed work
/// together.
fn wait_for_start(at: u64) {
    let now = monotonic_ns();
    if at > now {
        std::thread::sleep(std::time::Duration::from_nanos(at - now));
    }
}

/// How long after spawning the children the timed work begins: enough for
/// each to start, attach and prepare its data.
const START_DELAY_NS: u64 = 500_000_000;

/// `gear bench --writers N`: N writer processes insert concurrently while
/// one sampler process samples (at least `batches` batches, and for as
/// long as the writers run), all on one shared-memory table.
pub fn run_bench_processes(c: &BenchConfig, writers: usize, progress: &mut Progress) -> Result<BenchReport> {
    if writers == 0 {
        return Err(Error::Config("--writers must be at least 1".into()));
    }
    if c.sampler_threads != 1 {
        return Err(Error::Config("--sampler-threads is for the one-process bench; --writers runs one sampler".into()));
    }
    let spec = spec_for(c)?;
    sample_config(c)?;
    let strategy: gear_sampler::StrategyKind = c.sampler.parse()?;
    let name = format!("gear-bench-{}", std::process::id());
    let table = ReplayTable::builder(spec.clone())
        .sampler_kind(strategy, Default::default())
        .seed(c.seed)
        .shared_memory(&name)
        .build()?;
    // Ctrl-C ends the bench at once (signals.rs): the file goes with it.
    let _remove_file = crate::signals::remove_on_exit(format!("/dev/shm/{name}").into());
    let traj_bytes = spec.step_bytes() * c.steps;
    let per_writer = c.inserts.div_ceil(writers as u64);
    progress.line(&format!("gear bench: {writers} writer processes and 1 sampler process on `{name}`"));
    let start_at = (monotonic_ns() + START_DELAY_NS).to_string();
    let mut kids: Vec<GearChild> = Vec::new();
    for _ in 0..writers {
        let args = ["bench-writer", "--table", &name, "--steps", &c.steps.to_string()]
            .into_iter()
            .map(String::from)
            .chain(["--step-bytes".into(), c.step_bytes.to_string(), "--count".into(), per_writer.to_string()])
            .chain(["--start-at-ns".into(), start_at.clone(), "--insert-batch".into(), c.insert_batch.to_string()])
            .collect::<Vec<String>>();
        kids.push(spawn("bench writer", &args)?);
    }
    let mut args: Vec<String> = vec!["bench-sampler".into(), "--table".into(), name.clone()];
    args.extend([
        "--start-at-ns".into(),
        start_at,
        "--until-inserts".into(),
        (per_writer * writers as u64).to_string(),
    ]);
    args.extend([
        "--batches".into(),
        c.batches.to_string(),
        "--batch".into(),
        c.batch.to_string(),
        format!("--window-offset={}", c.window_offset),
        "--window-len".into(),
        c.window_len.to_string(),
    ]);
    if c.random_offsets {
        args.push("--random-offsets".into());
    }
    let sampler = spawn("bench sampler", &args)?;
    let writer_stats = kids.into_iter().map(GearChild::finish).collect::<Result<Vec<WriterStats>>>()?;
    let sampler_stats: SamplerStats = sampler.finish()?;
    let info = table.info()?;

    progress.phase("memcpy and random-read references", 3);
    let data_bytes = table.spec().data_bytes() as usize;
    let total = writer_stats.iter().map(|w| w.bytes).sum::<u64>();
    let memcpy = memcpy_reference(traj_bytes as usize, data_bytes, total, 1);
    progress.tick(1);
    let memcpy_2t = memcpy_reference(traj_bytes as usize, data_bytes, total, 2);
    progress.tick(2);
    let random_lines = random_line_reference(table.region_bytes(), RANDOM_REFERENCE_READS, 1);
    let layout = table.sampler(sample_config(c)?)?.layout().clone();
    let mut reference = GatherReference::new(table.spec().data_bytes() as usize, row_bytes(&layout), layout.rows());
    reference.copy_batches(c.batches.min(400));
    let sample_memcpy = reference.gb_per_s();
    progress.done();

    // Aggregate over the span from the first writer's start to the last
    // writer's end, on the clock they share.
    let first = writer_stats.iter().map(|w| w.start_ns).min().unwrap_or(0);
    let last = writer_stats.iter().map(|w| w.end_ns).max().unwrap_or(0);
    let wall = (last.saturating_sub(first) as f64 / 1e9).max(f64::MIN_POSITIVE);
    let insert_gb = total as f64 / wall / 1e9;
    let sample_gb = sampler_stats.bytes as f64 / sampler_stats.seconds / 1e9;
    Ok(BenchReport {
        backend: "cpu",
        sampler: strategy.name().to_owned(),
        trajectory_bytes: traj_bytes,
        insert_traj_per_s: writer_stats.iter().map(|w| w.trajectories).sum::<u64>() as f64 / wall,
        insert_gb_per_s: insert_gb,
        sample_traj_per_s: sampler_stats.rows as f64 / sampler_stats.seconds,
        sample_gb_per_s: sample_gb,
        memcpy_gb_per_s: memcpy,
        insert_vs_memcpy: insert_gb / memcpy,
        sample_memcpy_gb_per_s: sample_memcpy,
        sample_vs_memcpy: ratio(sample_gb, sample_memcpy),
        evictions: info.evictions,
        writers,
        sampler_threads: 1,
        memcpy_2t_gb_per_s: Some(memcpy_2t),
        insert_vs_memcpy_2t: Some(insert_gb / memcpy_2t),
        random_line_reads_per_s: random_lines,
    })
}

/// `gear bench-writer`: inserts `count` trajectories into a shared table.
/// Starts inserting when [`monotonic_ns`] reaches `start_at_ns`.
/// `insert_batch` trajectories go in per call.
pub fn writer_process(
    table: &str,
    count: u64,
    steps: u64,
    step_bytes: u64,
    insert_batch: u64,
    start_at_ns: u64,
) -> Result<()> {
    let t = ReplayTable::attach(table, AttachOptions::default())?;
    if t.spec().max_len() != steps || t.spec().columns()[0].shape() != [step_bytes] {
        return Err(Error::Config("bench writer: --steps/--step-bytes disagree with the table".into()));
    }
    let data = Trajectories::new(steps, step_bytes, insert_batch, count)?;
    let writer = t.writer();
    wait_for_start(start_at_ns);
    let start_ns = monotonic_ns();
    data.insert(&writer, count, |_| {})?;
    let end_ns = monotonic_ns();
    print_stats(&WriterStats {
        trajectories: count,
        bytes: count * steps * t.spec().step_bytes(),
        seconds: end_ns.saturating_sub(start_ns) as f64 / 1e9,
        start_ns,
        end_ns,
    });
    Ok(())
}

/// `gear bench-sampler`: samples `batches` batches from a shared table.
/// Starts sampling when [`monotonic_ns`] reaches `start_at_ns`.
/// Samples at least `batches` batches, and goes on until the table has
/// seen `until_inserts` inserts, so it competes with the writers for their
/// whole run.
pub fn sampler_process(
    table: &str,
    batches: u64,
    config: &BenchConfig,
    until_inserts: u64,
    start_at_ns: u64,
) -> Result<()> {
    let t = ReplayTable::attach(table, AttachOptions::default())?;
    let c = BenchConfig { steps: t.spec().max_len(), ..config.clone() };
    let mut sampler = t.sampler(sample_config(&c)?)?;
    let step_bytes = t.spec().step_bytes();

    wait_for_start(start_at_ns);
    let (mut rows, mut bytes) = (0u64, 0u64);
    let start = Instant::now();
    let mut done = 0;
    while done < batches || t.inserts() < until_inserts {
        done += 1;
        let b = sampler.sample()?;
        rows += b.rows() as u64;
        bytes += b.lengths().iter().sum::<u64>() * step_bytes;
    }
    print_stats(&SamplerStats { rows, bytes, seconds: start.elapsed().as_secs_f64() });
    Ok(())
}

/// End-to-end figures of [`gear_api::CudaSampler::sample`]: selection, the
/// gather from the table in `/dev/shm` (registered for the device) and
/// validation, for `gear bench --backend cuda`.
#[cfg(feature = "cuda")]
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CudaSampleReport {
    /// Rows per batch.
    pub batch: usize,
    /// Batches in the sampler's ring (1: no prefetch).
    pub ring: usize,
    /// Device-cache entries (0: every row zero-copy).
    pub cache_entries: usize,
    /// Share of the timed rows gathered from the device cache.
    pub cached_share: f64,
    /// Batches timed.
    pub batches: u64,
    /// Mean wall-clock milliseconds per `sample()` (the batch complete on
    /// the device when it returns).
    pub ms_per_batch: f64,
    /// Batches per second.
    pub batches_per_s: f64,
    /// Valid bytes gathered per second, in units of 10^9.
    pub gb_per_s: f64,
}

/// Fills a `/dev/shm` table with `min(capacity, inserts)` trajectories and
/// times `c.batches` calls of [`gear_api::CudaSampler::sample`] after a few
/// untimed ones, for each `(ring, cache entries)` in `variants` (ring 1:
/// each call gathers its own batch; 2: the next batch is gathered in the
/// background; cache entries: trajectories admitted to device memory after
/// one draw, warmed up by the untimed batches).
#[cfg(feature = "cuda")]
pub fn run_cuda_sample_bench(c: &BenchConfig, variants: &[(usize, usize)]) -> Result<Vec<CudaSampleReport>> {
    let spec = spec_for(c)?;
    let config = sample_config(c)?;
    let strategy: gear_sampler::StrategyKind = c.sampler.parse()?;
    let name = format!("gear-bench-cuda-{}", std::process::id());
    let table = ReplayTable::builder(spec.clone())
        .shared_memory(name)
        .sampler_kind(strategy, Default::default())
        .seed(c.seed)
        .build()?;
    let count = c.capacity.min(c.inserts).max(1);
    let data = Trajectories::new(c.steps, c.step_bytes, c.insert_batch, count)?;
    data.insert(&table.writer(), count, |_| {})?;
    let mut reports = Vec::new();
    for &(ring, cache_entries) in variants {
        let mut options = gear_api::CudaSamplerOptions::default().ring(ring);
        if cache_entries > 0 {
            options = options.cache(cache_entries, 1);
        }
        let mut sampler = table.cuda_sampler(config.clone(), options)?;
        let warm = if cache_entries > 0 { 3 + 4 * c.capacity.div_ceil(c.batch as u64) } else { 3 };
        for _ in 0..warm {
            sampler.sample()?;
        }
        if cache_entries > 0 {
            // Let the fill thread catch up before timing (until the cache
            // stops growing).
            let t = Instant::now();
            loop {
                let held = sampler.cached_trajectories();
                std::thread::sleep(std::time::Duration::from_millis(50));
                if sampler.cached_trajectories() == held || t.elapsed().as_secs_f64() > 20.0 {
                    break;
                }
            }
        }
        let (mut bytes, mut cached) = (0u64, 0usize);
        let step_bytes: u64 = sampler.batch().layout().step_bytes().iter().sum();
        let batches = c.batches.max(1);
        let t = Instant::now();
        for _ in 0..batches {
            let b = sampler.sample()?;
            bytes += b.lengths().iter().sum::<u64>() * step_bytes;
            cached += b.device_batch().cached_rows();
        }
        sampler.batch().synchronize()?;
        let s = t.elapsed().as_secs_f64();
        reports.push(CudaSampleReport {
            batch: c.batch,
            ring,
            cache_entries,
            cached_share: cached as f64 / (batches as f64 * c.batch as f64),
            batches,
            ms_per_batch: s * 1e3 / batches as f64,
            batches_per_s: batches as f64 / s,
            gb_per_s: bytes as f64 / s / 1e9,
        });
    }
    table.close();
    Ok(reports)
}
