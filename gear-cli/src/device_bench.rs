//! Runs of gear-api's device sampler that the GPU package makes
//! (`./run.sh soak`, `./run.sh train`), written over gear-core's device
//! trait so that CI runs them on gear-device's CPU device (whose figures
//! are not GPU figures: its kernels are C++ loops on worker threads).
//!
//! * `gear device-soak`: writer processes evict fast (every slot reused
//!   many times a second) while a prefetching device sampler (ring 2, then
//!   ring 3; selection on the device) draws batches; every row of every
//!   batch is checked to be consecutive steps of one trajectory with zero
//!   padding, and redrawn rows, timeouts and torn batches are counted.
//! * `gear train-bench`: the GPU trainer stand-in of issue 29. A kernel on
//!   the trainer's stream reads each batch and takes a set time (the
//!   model's step) while the device sampler prefetches the next batch,
//!   against the way Reverb- and TorchRL-fed trainers get data: gather on
//!   the host into pinned memory, copy it to the device, then step (double
//!   buffered, so the next host gather overlaps the device's copy and
//!   step). Reports steps/s and the share of the time the trainer waited
//!   for data, per batch size and window length.

use crate::children::{print_stats, spawn, GearChild};
use gear_api::gear_sampler::{StrategyKind, StrategyParams};
use gear_api::{AttachOptions, DeviceSamplerOptions, Error, ReplayTable, Result, SampleConfig, StepValue};
use gear_core::{ColumnSpec, DType, Device, DeviceApi, Pad, TableSpec, WindowSpec};
use gear_device::TrainStep;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

fn device_error<E: std::error::Error + Send + Sync + 'static>(e: E) -> Error {
    Error::Backend(Box::new(e))
}

// ------------------------------------------------------------------ soak

/// What `gear device-soak` runs.
#[derive(Clone, Debug, clap::Args)]
pub struct SoakConfig {
    /// Seconds to run (split between ring 2 and ring 3).
    #[arg(long, default_value_t = 120.0, value_parser = crate::seconds_arg)]
    pub seconds: f64,
    /// Writer processes.
    #[arg(long, default_value_t = 3)]
    pub writers: usize,
    /// Table capacity in trajectories (small: slots are reused fast; with
    /// 64, three writers rewrote each slot every 0.2 ms on an H200, faster
    /// than a batch's rows could be drawn, copied and checked, and no batch
    /// came through).
    #[arg(long, default_value_t = 1024)]
    pub capacity: u64,
    /// Maximum trajectory length T.
    #[arg(long, default_value_t = 32)]
    pub max_len: u64,
    /// Bytes of observation per step (besides the 32-byte step tag).
    #[arg(long, default_value_t = 1024)]
    pub obs_bytes: u64,
    /// Rows per batch.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Steps per window.
    #[arg(long, default_value_t = 16)]
    pub window: u64,
    /// Sampling strategy (uniform or prioritized: both select on the device).
    #[arg(long, default_value = "prioritized")]
    pub strategy: String,
}

/// One writer's counts.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SoakWriterStats {
    /// Trajectories committed.
    pub trajectories: u64,
    /// Steps appended.
    pub steps: u64,
}

/// What `gear device-soak` found, per ring size and in total.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SoakReport {
    /// The device's name.
    pub device: String,
    /// Seconds run.
    pub seconds: f64,
    /// Per ring size: (ring, batches, rows checked, rows redrawn, timeouts, torn batches).
    pub rings: Vec<SoakRing>,
    /// Trajectories the writers committed.
    pub trajectories_written: u64,
    /// Slots reused (evictions) while sampling.
    pub evictions: u64,
    /// Rows whose bytes were not consecutive steps of one trajectory
    /// (must be 0).
    pub bad_rows: u64,
}

impl SoakReport {
    /// Whether the soak passed: no bad row, no timeout, and every ring
    /// checked rows (a ring that delivered nothing checked nothing, and
    /// proves nothing about it).
    pub fn verdict(&self) -> Result<()> {
        let timeouts: u64 = self.rings.iter().map(|g| g.timeouts).sum();
        if self.bad_rows > 0 || timeouts > 0 {
            return Err(Error::Integrity(format!("device soak: {} bad rows, {timeouts} timeouts", self.bad_rows)));
        }
        if let Some(g) = self.rings.iter().find(|g| g.rows_checked == 0) {
            return Err(Error::Integrity(format!(
                "device soak: ring {} delivered no batch ({} gave up with every row torn under {} evictions \
                 in {:.1} s): slots were rewritten faster than a batch's rows could be drawn, copied and \
                 checked; give the table more slots (--capacity) or fewer writers",
                g.ring, g.torn, self.evictions, self.seconds
            )));
        }
        Ok(())
    }
}

/// One ring size's counts.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SoakRing {
    /// Batches in the ring.
    pub ring: usize,
    /// Batches returned.
    pub batches: u64,
    /// Rows checked.
    pub rows_checked: u64,
    /// Rows drawn again (torn, stale or undrawn).
    pub rows_redrawn: u64,
    /// `sample()` calls that timed out.
    pub timeouts: u64,
    /// `sample()` calls that gave up on rows torn under every attempt.
    pub torn: u64,
    /// Batches drawn on the device.
    pub device_batches: u64,
}

/// Bytes of the step tag: every step of the soak's trajectories carries
/// (writer, trajectory, step, check word) as four 64-bit words (stored as
/// `i64`, compared as bits).
const TAG: u64 = 32;

fn tag(writer: u64, traj: u64, step: u64) -> [u64; 4] {
    [writer, traj, step, (writer.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ traj.rotate_left(17) ^ step).wrapping_add(1)]
}

fn soak_spec(c: &SoakConfig) -> Result<TableSpec> {
    Ok(TableSpec::new(
        vec![ColumnSpec::new("tag", DType::I64, [TAG / 8]), ColumnSpec::new("obs", DType::U8, [c.obs_bytes])],
        c.max_len,
        c.capacity,
    )?)
}

/// `gear device-soak-writer`: writes trajectories of 1 to T steps as fast
/// as it can into the soak's shared table until the time is up.
pub fn soak_writer(table: &str, id: u64, seconds: f64) -> Result<()> {
    let t = ReplayTable::attach(table, AttachOptions::default())?;
    let max_len = t.spec().max_len();
    let obs_bytes = t.spec().columns()[1].step_bytes()?;
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut stats = SoakWriterStats::default();
    let mut rng = gear_core::Xoshiro256::seed_from_u64(id);
    let writer = t.writer().with_timeout(Duration::from_secs(10));
    while Instant::now() < end {
        let len = 1 + gear_core::RandomSource::below(&mut rng, max_len);
        let mut traj = writer.begin(Some(1.0 + (stats.trajectories % 7) as f64))?;
        for s in 0..len {
            let words = tag(id, stats.trajectories, s).map(|w| w as i64);
            let obs = vec![(id as u8) ^ (s as u8); obs_bytes as usize];
            traj.append_step(&[StepValue::typed(&words), StepValue::typed(&obs)])?;
        }
        traj.end()?;
        stats.trajectories += 1;
        stats.steps += len;
    }
    print_stats(&stats);
    Ok(())
}

/// Checks that each row of the tag column is consecutive steps of one
/// trajectory (tags intact), padded with zeros after `len` steps (tail
/// padding). Returns the bad rows.
fn bad_rows(tags: &[u8], lengths: &[u64], window: u64) -> u64 {
    let words: Vec<u64> = tags.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
    let per_row = (window * TAG / 8) as usize;
    let mut bad = 0;
    for (r, &len) in lengths.iter().enumerate() {
        let row = &words[r * per_row..(r + 1) * per_row];
        let first = &row[..4];
        let ok = (0..window as usize).all(|j| {
            let w = &row[4 * j..4 * j + 4];
            if (j as u64) < len {
                w == tag(first[0], first[1], first[2] + j as u64)
            } else {
                w.iter().all(|&x| x == 0)
            }
        });
        bad += u64::from(!ok || len == 0);
    }
    bad
}

/// Runs the soak on `device` (see the module doc).
pub fn run_soak<A: DeviceApi>(device: &A::Device, c: &SoakConfig) -> Result<SoakReport> {
    let kind = match c.strategy.as_str() {
        "uniform" => StrategyKind::Uniform,
        "prioritized" => StrategyKind::Prioritized,
        other => return Err(Error::Config(format!("soak strategy `{other}`: expected uniform or prioritized"))),
    };
    if c.window == 0 || c.window > c.max_len {
        return Err(Error::Config(format!("soak window {} must be in 1..={}", c.window, c.max_len)));
    }
    let name = format!("gear-device-soak-{}", std::process::id());
    // Ctrl-C or SIGTERM ends the soak at once: its writers are killed and
    // its table file removed (crate::signals).
    let _remove_file = crate::signals::remove_on_exit(format!("/dev/shm/{name}").into());
    let table = ReplayTable::builder(soak_spec(c)?)
        .sampler_kind(kind, StrategyParams { alpha: 0.6, beta: 0.4, stratified: false })
        .shared_memory(&name)
        .build()?;
    // Fill once so sampling starts at once, then the writers churn.
    for i in 0..c.capacity {
        let mut traj = table.writer().begin(Some(1.0))?;
        for s in 0..c.max_len {
            let obs = vec![0u8; c.obs_bytes as usize];
            let words = tag(u64::MAX, i, s).map(|w| w as i64);
            traj.append_step(&[StepValue::typed(&words), StepValue::typed(&obs)])?;
        }
        traj.end()?;
    }
    let seconds = c.seconds;
    let writers: Vec<GearChild> = (0..c.writers)
        .map(|i| {
            spawn(
                "soak writer",
                &[
                    "device-soak-writer".into(),
                    "--table".into(),
                    name.clone(),
                    "--id".into(),
                    i.to_string(),
                    "--seconds".into(),
                    format!("{seconds}"),
                ],
            )
        })
        .collect::<Result<_>>()?;
    let evictions_before = table.info()?.evictions;
    let start = Instant::now();
    let mut report = SoakReport { device: device.name(), ..Default::default() };
    let rings = [2usize, 3];
    for (i, &ring) in rings.iter().enumerate() {
        let until = start + Duration::from_secs_f64(seconds * (i + 1) as f64 / rings.len() as f64);
        let config = SampleConfig::new(c.batch, WindowSpec { offset: 0, len: c.window, pad: Pad::Tail })
            .columns(["tag"])
            .random_start()
            .timeout(Some(Duration::from_secs(5)));
        let mut sampler = table.device_sampler(device, config, DeviceSamplerOptions::<A>::default().ring(ring))?;
        let mut r = SoakRing { ring, ..Default::default() };
        while Instant::now() < until {
            match sampler.sample() {
                Ok(b) => {
                    let tags = b.column_to_host(0)?;
                    report.bad_rows += bad_rows(&tags, b.lengths(), c.window);
                    r.batches += 1;
                    r.rows_checked += b.rows() as u64;
                }
                Err(Error::Timeout { .. }) => r.timeouts += 1,
                Err(Error::Torn { .. }) => r.torn += 1,
                Err(e) => return Err(e),
            }
        }
        r.rows_redrawn = sampler.redrawn_rows();
        r.device_batches = sampler.device_batches();
        report.rings.push(r);
    }
    report.seconds = start.elapsed().as_secs_f64();
    report.evictions = table.info()?.evictions - evictions_before;
    for w in writers {
        let s: SoakWriterStats = w.finish()?;
        report.trajectories_written += s.trajectories;
    }
    Ok(report)
}

// ----------------------------------------------------------------- train

/// What `gear train-bench` measures.
#[derive(Clone, Debug, clap::Args)]
pub struct TrainConfig {
    /// Batch sizes (rows).
    #[arg(long, value_delimiter = ',', default_value = "32,64,128,256,512,1024")]
    pub batches: Vec<usize>,
    /// Window lengths (steps).
    #[arg(long, value_delimiter = ',', default_value = "32,128,512")]
    pub windows: Vec<u64>,
    /// Bytes of observation per step (an 84x84 frame is 7056; default 4 KiB).
    #[arg(long, default_value_t = 4096)]
    pub obs_bytes: u64,
    /// The model's step on the device, in milliseconds.
    #[arg(long, default_value_t = 20.0)]
    pub step_ms: f64,
    /// Timed steps per configuration (after two untimed ones).
    #[arg(long, default_value_t = 20)]
    pub steps: u64,
    /// Trajectories in the table.
    #[arg(long, default_value_t = 2048)]
    pub capacity: u64,
    /// Skip configurations whose batch is larger than this many MiB.
    #[arg(long, default_value_t = 1024)]
    pub max_batch_mib: u64,
}

/// One configuration's result for one way of feeding the trainer.
#[derive(Debug, Serialize, Deserialize, Clone)]
pub struct TrainResult {
    /// `gear-device-sampler` or `host-gather-pinned-copy`.
    pub feed: String,
    /// Rows per batch.
    pub batch: usize,
    /// Steps per window.
    pub window: u64,
    /// Bytes per batch.
    pub batch_bytes: u64,
    /// Trainer steps per second.
    pub steps_per_s: f64,
    /// Share of the wall time the trainer's stream was not computing
    /// (waiting for data): 1 - steps x step time / wall time.
    pub data_wait_share: f64,
    /// Batch bytes delivered per second, in units of 10^9.
    pub gb_per_s: f64,
}

/// The whole run.
#[derive(Debug, Serialize, Deserialize, Default)]
pub struct TrainReport {
    /// The device's name (the CPU device's figures are not GPU figures).
    pub device: String,
    /// The model step time used, in milliseconds.
    pub step_ms: f64,
    /// Every configuration measured.
    pub results: Vec<TrainResult>,
    /// Configurations skipped (batch too large), as (batch, window).
    pub skipped: Vec<(usize, u64)>,
}

fn train_spec(c: &TrainConfig, max_len: u64) -> Result<TableSpec> {
    Ok(TableSpec::new(
        vec![
            ColumnSpec::new("obs", DType::U8, [c.obs_bytes]),
            ColumnSpec::new("action", DType::I32, []),
            ColumnSpec::new("reward", DType::F32, []),
        ],
        max_len,
        c.capacity,
    )?)
}

/// Steps/s and data-wait share of `steps` steps that took `wall`.
fn result(
    feed: &str,
    batch: usize,
    window: u64,
    batch_bytes: u64,
    steps: u64,
    wall: Duration,
    step: Duration,
) -> TrainResult {
    let wall_s = wall.as_secs_f64().max(f64::MIN_POSITIVE);
    TrainResult {
        feed: feed.to_owned(),
        batch,
        window,
        batch_bytes,
        steps_per_s: steps as f64 / wall_s,
        data_wait_share: (1.0 - steps as f64 * step.as_secs_f64() / wall_s).clamp(0.0, 1.0),
        gb_per_s: steps as f64 * batch_bytes as f64 / wall_s / 1e9,
    }
}

/// The device sampler feeding the trainer: prefetch (ring 2) into device
/// memory, the trainer's stream ordered after each gather on the device.
fn feed_device<A: DeviceApi>(
    device: &A::Device,
    table: &ReplayTable,
    config: SampleConfig,
    c: &TrainConfig,
    step: Duration,
) -> Result<(Duration, u64)> {
    let trainer = device.new_stream().map_err(device_error)?;
    let options = DeviceSamplerOptions::<A>::default().ring(2).stream(trainer.clone());
    let mut sampler = table.device_sampler(device, config, options)?;
    let kernel = TrainStep::<A>::new(device).map_err(device_error)?;
    let bytes = sampler.layout().total_bytes();
    let mut run = |n: u64| -> Result<()> {
        for _ in 0..n {
            let b = sampler.sample()?;
            let inputs: Vec<&A::Buffer> = (0..b.columns()).map(|i| b.column_at(i).memory).collect();
            kernel.queue(&trainer, &inputs, step).map_err(device_error)?;
        }
        device.stream_synchronize(&trainer).map_err(device_error)
    };
    run(2)?;
    let start = Instant::now();
    run(c.steps)?;
    Ok((start.elapsed(), bytes))
}

/// The host-fed trainer: gather on the host into pinned memory, copy it to
/// device memory on the trainer's stream, step; two buffers of each, so the
/// next gather runs while the device copies and steps.
fn feed_host<A: DeviceApi>(
    device: &A::Device,
    table: &ReplayTable,
    config: SampleConfig,
    c: &TrainConfig,
    step: Duration,
) -> Result<Duration> {
    let trainer = device.new_stream().map_err(device_error)?;
    let mut sampler = table.sampler(config)?;
    let layout = sampler.layout().clone();
    let ncols = layout.columns().len();
    let bytes: Vec<u64> = (0..ncols).map(|i| layout.column_bytes(i)).collect();
    let total: u64 = bytes.iter().sum();
    let pinned = [device.alloc_pinned(total).map_err(device_error)?, device.alloc_pinned(total).map_err(device_error)?];
    let dev_bufs: Vec<Vec<A::Buffer>> = (0..2)
        .map(|_| bytes.iter().map(|&n| device.alloc(n)).collect::<std::result::Result<Vec<_>, _>>())
        .collect::<std::result::Result<_, _>>()
        .map_err(device_error)?;
    let copied = [device.new_event().map_err(device_error)?, device.new_event().map_err(device_error)?];
    let kernel = TrainStep::<A>::new(device).map_err(device_error)?;
    let mut i = 0usize;
    let mut run = |n: u64| -> Result<()> {
        for _ in 0..n {
            let k = i % 2;
            i += 1;
            // The copy out of this pinned buffer two steps ago must be done.
            device.event_synchronize(&copied[k]).map_err(device_error)?;
            let host = gear_core::MemoryRegion::host_ptr(&pinned[k]).expect("pinned memory has a host address");
            let mut offset = 0usize;
            let mut columns: Vec<&mut [u8]> = Vec::with_capacity(ncols);
            // SAFETY: the pinned buffer holds `total` bytes, split into
            // disjoint column slices; no device work reads it (its last copy
            // was waited for just above) until the copies queued below.
            let base = unsafe { std::slice::from_raw_parts_mut(host.as_ptr(), total as usize) };
            let mut rest = &mut base[..];
            for &n in &bytes {
                let (col, tail) = rest.split_at_mut(n as usize);
                columns.push(col);
                rest = tail;
            }
            sampler.sample_into(&mut columns)?;
            for (c, buf) in dev_bufs[k].iter().enumerate() {
                device.copy_from_pinned(&trainer, buf, 0, &pinned[k], offset as u64, bytes[c]).map_err(device_error)?;
                offset += bytes[c] as usize;
            }
            device.record(&copied[k], &trainer).map_err(device_error)?;
            let inputs: Vec<&A::Buffer> = dev_bufs[k].iter().collect();
            kernel.queue(&trainer, &inputs, step).map_err(device_error)?;
        }
        device.stream_synchronize(&trainer).map_err(device_error)
    };
    run(2)?;
    let start = Instant::now();
    run(c.steps)?;
    Ok(start.elapsed())
}

/// Runs the stand-in for every (batch, window) on `device`, both feeds.
pub fn run_train<A: DeviceApi>(device: &A::Device, c: &TrainConfig, progress: bool) -> Result<TrainReport> {
    if c.batches.is_empty() || c.windows.is_empty() || c.steps == 0 {
        return Err(Error::Config("train-bench needs batch sizes, window lengths and at least one step".into()));
    }
    if !(c.step_ms.is_finite() && c.step_ms >= 0.0) {
        return Err(Error::Config(format!("--step-ms {}: expected a finite number >= 0", c.step_ms)));
    }
    let step = Duration::from_secs_f64(c.step_ms / 1e3);
    let max_len = *c.windows.iter().max().expect("not empty");
    let table = ReplayTable::builder(train_spec(c, max_len)?).seed(29).build()?;
    let obs = vec![7u8; c.obs_bytes as usize];
    for i in 0..c.capacity {
        let mut traj = table.writer().begin(None)?;
        for s in 0..max_len {
            traj.append_step(&[
                StepValue::typed(&obs),
                StepValue::typed(&[(i * 1000 + s) as i32]),
                StepValue::typed(&[s as f32]),
            ])?;
        }
        traj.end()?;
    }
    let step_bytes = c.obs_bytes + 8;
    let mut report = TrainReport { device: device.name(), step_ms: c.step_ms, ..Default::default() };
    for &window in &c.windows {
        for &batch in &c.batches {
            let batch_bytes = batch as u64 * window * step_bytes;
            if batch_bytes > c.max_batch_mib << 20 {
                report.skipped.push((batch, window));
                continue;
            }
            let config = SampleConfig::new(batch, WindowSpec::last(window)).random_start();
            let (wall, bytes) = feed_device::<A>(device, &table, config.clone(), c, step)?;
            let gear = result("gear-device-sampler", batch, window, bytes, c.steps, wall, step);
            let wall = feed_host::<A>(device, &table, config, c, step)?;
            let host = result("host-gather-pinned-copy", batch, window, batch_bytes, c.steps, wall, step);
            if progress {
                eprintln!(
                    "train-bench: batch {batch:>5} window {window:>4}: gear {:8.1} steps/s (wait {:5.1}%)   host+copy {:8.1} steps/s (wait {:5.1}%)",
                    gear.steps_per_s,
                    100.0 * gear.data_wait_share,
                    host.steps_per_s,
                    100.0 * host.data_wait_share
                );
            }
            report.results.push(gear);
            report.results.push(host);
        }
    }
    Ok(report)
}

/// The CPU device with default options, as the benches' `cpu-device`
/// backend.
pub fn cpu_device() -> Result<gear_device::CpuDevice> {
    gear_device::CpuDevice::new().map_err(|e| Error::Backend(Box::new(e)))
}

#[cfg(test)]
mod tests {
    /// The verdict fails on bad rows, timeouts, and a ring that checked no
    /// row (the H200 run of the old default, 64 slots, delivered 0 batches
    /// in 20 s and passed); it passes otherwise.
    #[test]
    fn a_soak_fails_on_bad_rows_timeouts_or_a_ring_that_delivered_nothing() {
        let ring =
            |ring, rows_checked, timeouts, torn| SoakRing { ring, rows_checked, timeouts, torn, ..Default::default() };
        let report = |rings, bad_rows| SoakReport { rings, bad_rows, evictions: 5, seconds: 2.0, ..Default::default() };
        assert!(report(vec![ring(2, 64, 0, 3), ring(3, 128, 0, 0)], 0).verdict().is_ok());
        let e = report(vec![ring(2, 64, 0, 0), ring(3, 0, 0, 7)], 0).verdict().unwrap_err().to_string();
        assert!(e.contains("ring 3 delivered no batch (7 gave up") && e.contains("--capacity"), "{e}");
        let e = report(vec![ring(2, 64, 1, 0), ring(3, 64, 0, 0)], 0).verdict().unwrap_err().to_string();
        assert!(e.contains("1 timeouts"), "{e}");
        let e = report(vec![ring(2, 64, 0, 0), ring(3, 64, 0, 0)], 2).verdict().unwrap_err().to_string();
        assert!(e.contains("2 bad rows"), "{e}");
    }

    use super::*;

    #[test]
    fn row_checks_find_mixed_trajectories_and_dirty_padding() {
        let window = 4;
        let mut row: Vec<u64> = (0..3).flat_map(|s| tag(1, 9, 5 + s)).collect();
        row.extend([0; 4]);
        let bytes: Vec<u8> = row.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(bad_rows(&bytes, &[3], window), 0);
        let mut torn = row.clone();
        torn[4..8].copy_from_slice(&tag(2, 9, 6));
        let bytes: Vec<u8> = torn.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(bad_rows(&bytes, &[3], window), 1, "a step of another trajectory");
        let mut dirty = row.clone();
        dirty[13] = 1;
        let bytes: Vec<u8> = dirty.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(bad_rows(&bytes, &[3], window), 1, "padding not zero");
    }

    #[test]
    fn results_give_steps_and_the_wait_share() {
        let r = result("x", 32, 8, 1000, 10, Duration::from_millis(400), Duration::from_millis(30));
        assert!((r.steps_per_s - 25.0).abs() < 1e-9);
        assert!((r.data_wait_share - 0.25).abs() < 1e-9);
        let r = result("x", 32, 8, 1000, 10, Duration::from_millis(100), Duration::from_millis(30));
        assert_eq!(r.data_wait_share, 0.0, "clamped");
    }
}
