//! `run_bench`: collection throughput of this backend, for
//! `gear bench --backend cuda`.
//!
//! One run measures, on the same batch (same rows, same window, same
//! bytes): the zero-copy gather from pinned host memory, the gather from a
//! [`DeviceCache`] holding every row, and a plain device-to-device copy of
//! as many bytes (the bandwidth ceiling the device-cache gather approaches).
//! Each is timed with CUDA events around `iters` launches after `warmup`
//! launches, so device work is inside the timed region. The zero-copy and
//! cached batches are also compared byte for byte.

use crate::cache::DeviceCache;
use crate::device::CudaDevice;
use crate::error::{Error, Result};
use crate::gather::{CudaBatch, CudaCollector};
use crate::memory::PinnedMemory;
use cudarc::driver::sys::CUevent_flags;
use gear_core::{
    BatchLayout, ColumnSpec, DType, GatherRow, RandomSource, TableRegion, TableSpec, WindowSpec, Xoshiro256,
};
use std::sync::Arc;

/// What to measure.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaBenchParams {
    /// Device ordinal.
    pub ordinal: usize,
    /// Bytes per step of each column (u8 columns of that many elements).
    pub step_bytes: Vec<u64>,
    /// Maximum trajectory length T.
    pub max_len: u64,
    /// Trajectories in the table.
    pub capacity: u64,
    /// Rows per batch.
    pub batch: usize,
    /// Window length (the last `window` steps of full trajectories).
    pub window: u64,
    /// Timed launches per measurement.
    pub iters: u32,
    /// Untimed launches before each measurement.
    pub warmup: u32,
    /// Seed of the row choice.
    pub seed: u64,
}

impl Default for CudaBenchParams {
    /// A 512 MiB table (1024 trajectories x 128 steps x 4 KiB), batches of
    /// 256 windows of 64 steps (64 MiB).
    fn default() -> Self {
        CudaBenchParams {
            ordinal: 0,
            step_bytes: vec![4096],
            max_len: 128,
            capacity: 1024,
            batch: 256,
            window: 64,
            iters: 20,
            warmup: 3,
            seed: 1,
        }
    }
}

/// One measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct Throughput {
    /// Mean milliseconds per launch.
    pub ms_per_iter: f64,
    /// Bytes moved per second, in units of 10^9.
    pub gb_per_s: f64,
}

/// Results of [`run_bench`].
#[derive(Clone, Debug, PartialEq)]
pub struct CudaBenchReport {
    /// Device name and compute capability.
    pub device: String,
    /// Bytes in one batch (all columns).
    pub batch_bytes: u64,
    /// Parameters used.
    pub params: CudaBenchParams,
    /// Gather from pinned host memory over the bus.
    pub zero_copy: Throughput,
    /// Gather with every row in the device cache.
    pub device_cache: Throughput,
    /// `cuMemcpyDtoDAsync` of `batch_bytes`.
    pub device_copy: Throughput,
    /// Whether the zero-copy and cached batches were identical.
    pub outputs_match: bool,
}

impl std::fmt::Display for CudaBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "device: {}", self.device)?;
        writeln!(
            f,
            "batch: {} rows x {} steps, {} bytes ({} iters)",
            self.params.batch, self.params.window, self.batch_bytes, self.params.iters
        )?;
        for (name, t) in [
            ("cuda_zero_copy", &self.zero_copy),
            ("cuda_device_cache", &self.device_cache),
            ("cuda_d2d_copy", &self.device_copy),
        ] {
            writeln!(f, "{name:<20} {:>9.3} ms/batch {:>8.2} GB/s", t.ms_per_iter, t.gb_per_s)?;
        }
        write!(f, "outputs match: {}", self.outputs_match)
    }
}

fn throughput(ms_total: f32, iters: u32, bytes: u64) -> Throughput {
    let ms = f64::from(ms_total) / f64::from(iters);
    let gb_per_s = if ms > 0.0 { bytes as f64 / (ms / 1e3) / 1e9 } else { f64::INFINITY };
    Throughput { ms_per_iter: ms, gb_per_s }
}

/// Times `iters` calls of `launch` on the collector's stream with events.
fn time(
    device: &CudaDevice,
    stream: &cudarc::driver::CudaStream,
    warmup: u32,
    iters: u32,
    mut launch: impl FnMut() -> Result<()>,
) -> Result<f32> {
    for _ in 0..warmup {
        launch()?;
    }
    let start = device.context().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let end = device.context().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    start.record(stream)?;
    for _ in 0..iters {
        launch()?;
    }
    end.record(stream)?;
    Ok(start.elapsed_ms(&end)?)
}

/// Runs the three measurements. Needs a CUDA device and NVRTC; returns
/// [`Error::BackendUnavailable`] without them.
pub fn run_bench(params: &CudaBenchParams) -> Result<CudaBenchReport> {
    if params.iters == 0 || params.batch == 0 || params.step_bytes.is_empty() {
        return Err(Error::InvalidArgument("bench needs iters, batch and at least one column".into()));
    }
    let device = CudaDevice::new(params.ordinal)?;
    device.warm_up()?;
    let columns =
        params.step_bytes.iter().enumerate().map(|(i, &s)| ColumnSpec::new(format!("c{i}"), DType::U8, [s])).collect();
    let spec = TableSpec::new(columns, params.max_len, params.capacity)?;
    let region_bytes = gear_core::RegionLayout::for_spec(&spec)?.total_bytes;
    let pinned: PinnedMemory = device.alloc_pinned(region_bytes)?;
    let table = Arc::new(TableRegion::create(pinned, &spec)?);

    // Fill: committed, full-length trajectories with a byte pattern.
    let data = table.data_ptr().as_ptr();
    let total = table.layout().total_bytes() as usize;
    for i in 0..total {
        // SAFETY: `i < total`, the size of the data area, which this
        // process created and nobody else writes.
        unsafe { *data.add(i) = (i.wrapping_mul(31) >> 3) as u8 };
    }
    for slot in 0..params.capacity as u32 {
        let rec = table.slot(slot)?;
        let key = rec.begin_write(slot, 1, u64::from(slot), 1.0)?;
        rec.publish_len(key, params.max_len)?;
        rec.commit(key)?;
    }

    let mut rng = Xoshiro256::seed_from_u64(params.seed);
    let rows: Vec<GatherRow> =
        (0..params.batch).map(|_| GatherRow { slot: rng.below(params.capacity) as u32, len: params.max_len }).collect();
    let col_idx: Vec<usize> = (0..params.step_bytes.len()).collect();
    let layout = BatchLayout::new(table.layout(), &col_idx, params.batch, WindowSpec::last(params.window))?;
    let batch_bytes = layout.total_bytes();

    // Zero-copy.
    let zc = CudaCollector::new(&device);
    let stream = zc.stream().clone();
    let view = table.view();
    let mut zc_batch = zc.alloc(&layout)?;
    let zc_ms = time(&device, &stream, params.warmup, params.iters, || zc.gather_into(&view, &rows, &mut zc_batch))?;

    // Device cache holding every distinct row.
    let mut distinct: Vec<u32> = rows.iter().map(|r| r.slot).collect();
    distinct.sort_unstable();
    distinct.dedup();
    let cache = Arc::new(DeviceCache::new(&device, table.clone(), distinct.len())?);
    for &slot in &distinct {
        cache.insert(table.slot(slot)?.key_state(slot).0)?;
    }
    let dc = CudaCollector::new(&device).with_cache(cache.clone())?;
    let mut dc_batch = dc.alloc(&layout)?;
    let dc_ms = time(&device, &stream, params.warmup, params.iters, || dc.gather_into(&view, &rows, &mut dc_batch))?;
    if dc_batch.cached_rows() != rows.len() {
        return Err(Error::InvalidArgument(format!(
            "device cache served {} of {} rows",
            dc_batch.cached_rows(),
            rows.len()
        )));
    }

    // Device-to-device copy of the same number of bytes.
    let src = device.alloc(batch_bytes)?;
    src.fill_async(1, &stream)?;
    let dst = device.alloc(batch_bytes)?;
    let d2d_ms =
        time(&device, &stream, params.warmup, params.iters, || dst.copy_from_async(0, &src, 0, batch_bytes, &stream))?;

    let outputs_match = batches_equal(&zc_batch, &dc_batch)?;
    let (major, minor) = device.compute_capability();
    Ok(CudaBenchReport {
        device: format!("{} (sm_{major}{minor})", device.name()),
        batch_bytes,
        params: params.clone(),
        zero_copy: throughput(zc_ms, params.iters, batch_bytes),
        device_cache: throughput(dc_ms, params.iters, batch_bytes),
        device_copy: throughput(d2d_ms, params.iters, batch_bytes),
        outputs_match,
    })
}

fn batches_equal(a: &CudaBatch, b: &CudaBatch) -> Result<bool> {
    if a.lengths() != b.lengths() {
        return Ok(false);
    }
    for i in 0..a.layout().columns().len() {
        if a.column_to_host(i)? != b.column_to_host(i)? {
            return Ok(false);
        }
    }
    Ok(true)
}
