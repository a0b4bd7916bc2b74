//! `run_bench`: collection throughput of this backend, for
//! `gear bench --backend cuda`.
//!
//! The table lives where production puts it: a file in `/dev/shm` mapped
//! shared and registered for the device (read-only), so the gather reads it
//! zero-copy over the bus (pinned memory from `cuMemHostAlloc` when
//! `/dev/shm` cannot be used; the report says which). One run measures, for
//! batches of the same size (rows drawn at random, a fresh set every
//! launch, so no launch re-reads the last one's rows from a cache):
//!
//! * `pinned_h2d_copy`: `cuMemcpyHtoDAsync` of the batch's bytes from pinned
//!   memory, the link's limit for host-to-device traffic;
//! * `zero_copy`: the gather kernel reading the registered table;
//! * `device_cache`: the gather with every row of every set in a
//!   [`DeviceCache`], reading device memory;
//! * `device_copy`: `cuMemcpyDtoDAsync` of the batch's bytes, from a source
//!   that rotates through at least 512 MiB so that it is read from HBM, not
//!   L2, as the gathers' rows are.
//!
//! Device-side figures (the cache gather and the copy) are also given as
//! memory traffic, read plus write (2 x bytes / time), which is how HBM
//! bandwidth is quoted. Each is timed with CUDA events around `iters`
//! launches after `warmup` launches, so device work is inside the timed
//! region. The zero-copy and cached batches of the last set are compared
//! byte for byte.

use crate::device::CudaDevice;
use crate::error::{Error, Result};
use crate::memory::PinnedMemory;
use crate::{CudaBatch, CudaCollector, DeviceCache};
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
    /// Where the table lived (`/dev/shm` registered, or pinned).
    pub table_memory: String,
    /// `cuMemcpyHtoDAsync` of `batch_bytes` from pinned memory.
    pub pinned_copy: Throughput,
    /// Gather from the table in host memory over the bus.
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
            "batch: {} rows x {} steps of {:?} bytes (T {}), {} bytes ({} iters, fresh random rows each); table: {}",
            self.params.batch,
            self.params.window,
            self.params.step_bytes,
            self.params.max_len,
            self.batch_bytes,
            self.params.iters,
            self.table_memory
        )?;
        for (name, t) in [
            ("cuda_pinned_h2d_copy", &self.pinned_copy),
            ("cuda_zero_copy", &self.zero_copy),
            ("cuda_device_cache", &self.device_cache),
            ("cuda_d2d_copy", &self.device_copy),
        ] {
            write!(f, "{name:<22} {:>9.3} ms/batch {:>8.2} GB/s", t.ms_per_iter, t.gb_per_s)?;
            if std::ptr::eq(t, &self.device_cache) || std::ptr::eq(t, &self.device_copy) {
                write!(f, " ({:.2} GB/s read+write)", 2.0 * t.gb_per_s)?;
            }
            writeln!(f)?;
        }
        writeln!(
            f,
            "zero-copy / pinned copy: {:.2}; device-cache gather / device copy: {:.2}",
            self.zero_copy.gb_per_s / self.pinned_copy.gb_per_s,
            self.device_cache.gb_per_s / self.device_copy.gb_per_s
        )?;
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

/// A file in `/dev/shm`, mapped shared, unlinked at once (the mapping keeps
/// it): what a table shared between actor processes is.
struct ShmFile {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by this value until drop; users synchronise
// access (the MemoryRegion contract).
unsafe impl Send for ShmFile {}
// SAFETY: as above.
unsafe impl Sync for ShmFile {}

impl ShmFile {
    fn create(len: u64) -> std::result::Result<Self, String> {
        let len = usize::try_from(len).map_err(|_| "too large".to_owned())?;
        let path = format!("/dev/shm/gear-cuda-bench-{}", std::process::id());
        let c = std::ffi::CString::new(path.clone()).map_err(|e| e.to_string())?;
        // SAFETY: a valid C string; the result is checked.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600) };
        if fd < 0 {
            return Err(format!("{path}: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` is the file just opened; the path is unlinked once.
        let mapped = unsafe {
            libc::unlink(c.as_ptr());
            let r = libc::posix_fallocate(fd, 0, len as libc::off_t);
            let p = if r == 0 {
                libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
            } else {
                libc::MAP_FAILED
            };
            libc::close(fd);
            if r != 0 {
                Err(format!("{path}: posix_fallocate of {len} bytes failed ({r})"))
            } else if p == libc::MAP_FAILED {
                Err(format!("{path}: mmap: {}", std::io::Error::last_os_error()))
            } else {
                Ok(p)
            }
        }?;
        Ok(ShmFile { ptr: std::ptr::NonNull::new(mapped.cast()).expect("mmap succeeded"), len })
    }
}

impl Drop for ShmFile {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `create`, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

// SAFETY: `ptr` points to `len` readable, writable, page-aligned bytes until
// drop.
unsafe impl gear_core::MemoryRegion for ShmFile {
    fn kind(&self) -> gear_core::MemoryKind {
        gear_core::MemoryKind::Shared
    }
    fn len(&self) -> u64 {
        self.len as u64
    }
    fn alignment(&self) -> u64 {
        4096
    }
    fn host_ptr(&self) -> Option<std::ptr::NonNull<u8>> {
        Some(self.ptr)
    }
    fn name(&self) -> Option<&str> {
        Some("gear-cuda-bench")
    }
}

/// The bench table: a registered `/dev/shm` mapping, else pinned memory.
enum BenchTable {
    Shm(Arc<TableRegion<crate::RegisteredRegion<ShmFile>>>),
    Pinned(Arc<TableRegion<PinnedMemory>>),
}

/// Least size of the rotating source of the device-to-device reference
/// copy: far larger than any GPU's L2 (50 MB on an H100).
const D2D_SOURCE_BYTES: u64 = 512 << 20;

/// Runs the measurements. Needs a CUDA device; returns
/// [`Error::BackendUnavailable`] without one.
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
    let (table, table_memory) = match ShmFile::create(region_bytes).map_err(Error::InvalidArgument).and_then(|f| {
        let reg = device.register(f)?;
        let ro = if reg.is_read_only() { "read-only" } else { "read-write" };
        Ok((TableRegion::create(reg, &spec)?, ro))
    }) {
        Ok((t, ro)) => (BenchTable::Shm(Arc::new(t)), format!("/dev/shm mapping, registered {ro}")),
        Err(e) => {
            let pinned: PinnedMemory = device.alloc_pinned(region_bytes)?;
            (BenchTable::Pinned(Arc::new(TableRegion::create(pinned, &spec)?)), format!("pinned ({e})"))
        }
    };
    match &table {
        BenchTable::Shm(t) => measure(params, &device, t, table_memory),
        BenchTable::Pinned(t) => measure(params, &device, t, table_memory),
    }
}

fn measure<R: gear_core::MemoryRegion + 'static>(
    params: &CudaBenchParams,
    device: &CudaDevice,
    table: &Arc<TableRegion<R>>,
    table_memory: String,
) -> Result<CudaBenchReport> {
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

    // A fresh set of random rows for every launch.
    let mut rng = Xoshiro256::seed_from_u64(params.seed);
    let sets: Vec<Vec<GatherRow>> = (0..params.warmup + params.iters)
        .map(|_| {
            (0..params.batch).map(|_| GatherRow::whole(rng.below(params.capacity) as u32, params.max_len)).collect()
        })
        .collect();
    let col_idx: Vec<usize> = (0..params.step_bytes.len()).collect();
    let layout = BatchLayout::new(table.layout(), &col_idx, params.batch, WindowSpec::last(params.window))?;
    let batch_bytes = layout.total_bytes();

    // Zero-copy.
    let zc = CudaCollector::new(device);
    let stream = zc.stream().clone();
    let view = table.view();
    let mut zc_batch = zc.alloc(&layout)?;
    let mut next = 0;
    let zc_ms = time(device, &stream, params.warmup, params.iters, || {
        next += 1;
        zc.gather_into(&view, &sets[(next - 1) % sets.len()], &mut zc_batch)
    })?;

    // Device cache holding every distinct row of every set.
    let mut distinct: Vec<u32> = sets.iter().flatten().map(|r| r.slot).collect();
    distinct.sort_unstable();
    distinct.dedup();
    let cache = Arc::new(DeviceCache::new(device, table.clone(), distinct.len())?);
    for &slot in &distinct {
        cache.insert(table.slot(slot)?.key_state(slot).0)?;
    }
    let dc = CudaCollector::new(device).with_cache(cache.clone())?;
    let mut dc_batch = dc.alloc(&layout)?;
    let mut next = 0;
    let dc_ms = time(device, &stream, params.warmup, params.iters, || {
        next += 1;
        dc.gather_into(&view, &sets[(next - 1) % sets.len()], &mut dc_batch)
    })?;
    if dc_batch.cached_rows() != params.batch {
        return Err(Error::InvalidArgument(format!(
            "device cache served {} of {} rows",
            dc_batch.cached_rows(),
            params.batch
        )));
    }

    // Device-to-device and pinned host-to-device copies of as many bytes.
    // The copy reads fresh source bytes every launch, as the gathers read
    // fresh rows: its source rotates through a buffer of at least
    // `D2D_SOURCE_BYTES` (several times any GPU's L2), so a small batch is
    // not copied out of L2 while the gathers read HBM (on an H100, a 17 MB
    // copy of one fixed source ran at 1.9 TB/s, above what HBM3 delivers).
    let src_bytes = batch_bytes.max(D2D_SOURCE_BYTES);
    let src = device.alloc(src_bytes)?;
    src.fill_async(1, &stream)?;
    let dst = device.alloc(batch_bytes)?;
    let sources = (src_bytes / batch_bytes).max(1);
    let mut launch = 0u64;
    let d2d_ms = time(device, &stream, params.warmup, params.iters, || {
        let offset = (launch % sources) * batch_bytes;
        launch += 1;
        dst.copy_from_async(0, &src, offset, batch_bytes, &stream)
    })?;
    let pinned = device.alloc_pinned(batch_bytes)?;
    let h2d_ms = time(device, &stream, params.warmup, params.iters, || {
        // SAFETY: `pinned` is never written and outlives the copies: the
        // stream is synchronised below, before it is dropped.
        unsafe { dst.copy_from_pinned_async(0, &pinned, &stream) }
    });
    stream.synchronize()?;
    let h2d_ms = h2d_ms?;

    let outputs_match = batches_equal(&zc_batch, &dc_batch)?;
    let (major, minor) = device.compute_capability();
    Ok(CudaBenchReport {
        device: format!("{} (sm_{major}{minor})", device.name()),
        batch_bytes,
        params: params.clone(),
        table_memory,
        pinned_copy: throughput(h2d_ms, params.iters, batch_bytes),
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
