//! The CUDA path of the public API (Cargo feature `cuda`): a
//! [`CudaSampler`] draws rows exactly as the CPU [`Sampler`](crate::Sampler)
//! does and gathers their windows on a GPU, straight from the table's host
//! memory, into device buffers. Nothing is staged: the table's region is
//! page-locked and mapped for the device in place (`cuMemHostRegister`
//! through [`CudaDevice::register`]), and gear-cuda's gather kernel reads it
//! over the bus.
//!
//! One [`CudaSampler::sample`]: select under the table's protocol (rate
//! limiter, `max_times_sampled`), queue the gather on the sampler's stream,
//! wait for the batch's event, then validate every row's slot generation
//! (gear-core's seqlock): rows whose slot was reused while the device read
//! them are redrawn and the batch is gathered again. Validation has to wait
//! for the event because only then has the device finished reading; the
//! returned batch is therefore complete on the device.
//!
//! Registration: the driver refuses to register a range twice, so every
//! `CudaSampler` of one table in one process shares one registration (and
//! one [`CudaDevice`] handle, with its compiled kernels); the last one
//! dropped unregisters the memory. A process maps a table for one device.
//!
//! Without a CUDA driver or device, [`ReplayTable::cuda_sampler`] returns
//! [`Error::Backend`] holding gear-cuda's `BackendUnavailable` (message
//! `backend: cuda backend unavailable: ...`); nothing panics.
//!
//! Not yet run on a GPU: this module was only built and tested on machines
//! without one. The device tests in `gear-api/tests/cuda.rs` (every batch
//! byte-for-byte against the CPU collector and the CPU sampler) are packed
//! by `cargo xtask gpu-test` for a GPU machine.

use crate::error::{Error, Result};
use crate::sampler::{BatchMeta, Draws, RowGather, SampleConfig};
use crate::table::ReplayTable;
use gear_core::{BatchLayout, DType, GatherRow, MemoryKind, MemoryRegion, SlotKey, TableView};
use gear_cuda::cudarc::driver::{CudaEvent, CudaStream};
use gear_cuda::{CudaBatch, CudaCollector, CudaDevice, DeviceMemory, RegisteredRegion};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

/// The CUDA collector as a [`RowGather`]: each copy is queued on the
/// sampler's stream and waited for, since the rows can only be validated
/// once the device has finished reading them. gear-cuda gathers whole
/// batches, so redrawn rows are copied with the rest again.
struct DeviceRows<'a> {
    collector: &'a CudaCollector,
    view: TableView<'a>,
    batch: &'a mut CudaBatch,
}

impl RowGather for DeviceRows<'_> {
    fn gather(&mut self, _: &BatchLayout, rows: &[GatherRow]) -> Result<()> {
        self.collector.gather_into(&self.view, rows, self.batch)?;
        Ok(self.batch.synchronize()?)
    }

    fn regather(&mut self, layout: &BatchLayout, rows: &[GatherRow], _: &[usize]) -> Result<()> {
        self.gather(layout, rows)
    }

    fn settle(&mut self) -> Result<()> {
        Ok(self.batch.synchronize()?)
    }

    fn valid_steps(&self) -> u64 {
        self.batch.lengths().iter().sum()
    }
}

#[cfg(feature = "cuda")]
impl From<gear_cuda::Error> for Error {
    /// gear-core refusals keep their own variant; everything else is boxed
    /// as [`Error::Backend`] and can be downcast to [`gear_cuda::Error`].
    fn from(e: gear_cuda::Error) -> Self {
        match e {
            gear_cuda::Error::Core(c) => Error::Core(c),
            other => Error::Backend(Box::new(other)),
        }
    }
}

/// Which GPU a [`CudaSampler`] gathers on, and on which stream.
#[derive(Clone, Debug, Default)]
pub struct CudaSamplerOptions {
    /// CUDA device ordinal (default 0).
    pub ordinal: usize,
    /// The stream to queue gathers on, normally the trainer's own, so the
    /// next gather is ordered after the kernels that read the last batch.
    /// It must belong to device `ordinal`'s primary context. `None`: the
    /// device handle's stream; the trainer then waits on the batch's event
    /// ([`CudaSampledBatch::wait_on`]) and must finish reading a batch
    /// before sampling again.
    pub stream: Option<Arc<CudaStream>>,
}

impl CudaSamplerOptions {
    /// Device `ordinal`, its default stream.
    pub fn new(ordinal: usize) -> Self {
        CudaSamplerOptions { ordinal, stream: None }
    }

    /// Queue gathers on `stream`.
    pub fn stream(mut self, stream: Arc<CudaStream>) -> Self {
        self.stream = Some(stream);
        self
    }
}

/// The table's own memory region, seen as a region of its own so it can be
/// handed to [`CudaDevice::register`] (which takes ownership of what it
/// registers) while the table keeps owning the bytes.
struct TableMemory {
    /// Keeps the table, and so its region, alive.
    table: ReplayTable,
}

impl TableMemory {
    fn region(&self) -> &dyn MemoryRegion {
        &**self.table.shared.region.region()
    }
}

// SAFETY: every method forwards to the table's region, the
// `Box<dyn MemoryRegion>` its `TableRegion` owns, which keeps the
// MemoryRegion promises for as long as it lives. That region is dropped
// only with the table's `Shared`, i.e. after the last `ReplayTable` clone;
// `self.table` is one, so the heap pool is not freed nor the shared mapping
// unmapped while this value lives. The host pointer therefore stays valid
// for `len()` bytes as long as this value (and the registration that owns
// it) lives.
unsafe impl MemoryRegion for TableMemory {
    fn kind(&self) -> MemoryKind {
        self.region().kind()
    }
    fn len(&self) -> u64 {
        self.region().len()
    }
    fn alignment(&self) -> u64 {
        self.region().alignment()
    }
    fn host_ptr(&self) -> Option<NonNull<u8>> {
        self.region().host_ptr()
    }
    fn device_ptr(&self) -> Option<u64> {
        self.region().device_ptr()
    }
    fn name(&self) -> Option<&str> {
        self.region().name()
    }
}

/// A table's memory registered with one device, shared by the table's
/// samplers in this process.
struct Mapping {
    /// Unregistered when the last [`MappingShare`] goes.
    region: RegisteredRegion<TableMemory>,
    device: CudaDevice,
}

impl Mapping {
    /// The table whose memory is registered.
    fn table(&self) -> &ReplayTable {
        &self.region.inner().table
    }
}

/// Live registrations of this process, by host address of the table region.
static MAPPINGS: Mutex<Vec<(usize, Weak<Mapping>)>> = Mutex::new(Vec::new());

fn mappings() -> MutexGuard<'static, Vec<(usize, Weak<Mapping>)>> {
    // The list stays consistent whatever panicked while holding it.
    MAPPINGS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One sampler's share of a [`Mapping`]. Dropped with the registry locked,
/// so a sampler being created meanwhile either finds the registration alive
/// or registers after it was undone (registering a range twice fails).
struct MappingShare(Option<Arc<Mapping>>);

impl MappingShare {
    /// Shares `table`'s registration with device `ordinal`, registering the
    /// table's memory first when no sampler of this process has.
    fn for_table(table: &ReplayTable, ordinal: usize) -> Result<Self> {
        let base = table.shared.region.region().host_ptr().map_or(0, |p| p.as_ptr() as usize);
        let mut map = mappings();
        map.retain(|(_, m)| m.strong_count() > 0);
        let same_table = |m: &Arc<Mapping>| Arc::ptr_eq(&m.table().shared, &table.shared);
        if let Some(m) = map.iter().filter(|(b, _)| *b == base).find_map(|(_, m)| m.upgrade().filter(same_table)) {
            if m.device.ordinal() != ordinal {
                return Err(Error::Config(format!(
                    "cuda device {ordinal} requested, but this process already mapped the table for device {}; \
                     a process maps a table for one device",
                    m.device.ordinal()
                )));
            }
            return Ok(MappingShare(Some(m)));
        }
        let device = CudaDevice::new(ordinal)?;
        // Kernels are loaded once per process and device; a missing or
        // unusable kernel image (or NVRTC, when needed) is reported here,
        // at sampler creation, not by the first sample().
        device.warm_up()?;
        let region = device.register(TableMemory { table: table.clone() })?;
        let m = Arc::new(Mapping { region, device });
        map.push((base, Arc::downgrade(&m)));
        Ok(MappingShare(Some(m)))
    }

    fn get(&self) -> &Mapping {
        self.0.as_ref().expect("a mapping share holds its mapping until dropped")
    }

    /// The table's data area with its host and its device address.
    fn view(&self) -> TableView<'_> {
        let m = self.get();
        let region = &m.table().shared.region;
        let device = m.region.device_addr() + region.region_layout().data_offset;
        // SAFETY: `data_ptr()` is the table's data area, `layout.total_bytes()`
        // readable bytes inside the region (TableRegion checked the sizes at
        // create/open), alive as long as the table `m.region` holds. `device`
        // is the device address of the same first byte: `m.region` registered that
        // very region (all of it), so it maps as many bytes, and stays
        // registered while `m` lives. The view borrows `self`, which holds
        // `m`, so it outlives neither.
        unsafe { TableView::new(Some(region.data_ptr()), Some(device), region.layout()) }
    }
}

impl Drop for MappingShare {
    fn drop(&mut self) {
        let mut map = mappings();
        drop(self.0.take());
        map.retain(|(_, m)| m.strong_count() > 0);
    }
}

/// One column of a [`CudaSampledBatch`]: a device buffer laid out
/// `[rows, window, *shape]`.
#[derive(Clone, Copy, Debug)]
pub struct CudaColumn<'a> {
    /// Column name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Per-step shape.
    pub step_shape: &'a [u64],
    /// The device buffer.
    pub memory: &'a DeviceMemory,
}

impl CudaColumn<'_> {
    /// Device address of the first byte.
    pub fn device_addr(&self) -> u64 {
        self.memory.device_addr()
    }

    /// Size of the buffer in bytes.
    pub fn bytes(&self) -> u64 {
        self.memory.len()
    }
}

/// One batch gathered on the GPU: per column a device buffer, the valid
/// length of each row (host and device copies), per row the key,
/// probability and importance weight, and the event recorded after the
/// gather.
#[derive(Debug)]
pub struct CudaSampledBatch {
    device: CudaBatch,
    meta: BatchMeta,
}

impl CudaSampledBatch {
    /// Rows in the batch (0 before the first sample).
    pub fn rows(&self) -> usize {
        self.meta.keys.len()
    }

    /// Number of requested columns.
    pub fn columns(&self) -> usize {
        self.meta.names.len()
    }

    /// The column named `name`.
    pub fn column(&self, name: &str) -> Result<CudaColumn<'_>> {
        Ok(self.column_at(self.meta.index(name)?))
    }

    /// The `i`-th requested column; panics when `i >= self.columns()`.
    pub fn column_at(&self, i: usize) -> CudaColumn<'_> {
        CudaColumn {
            name: &self.meta.names[i],
            dtype: self.meta.dtypes[i],
            step_shape: &self.meta.shapes[i],
            memory: self.device.column(i).expect("one device buffer per requested column"),
        }
    }

    /// Waits for the batch and copies the `i`-th requested column to the
    /// host (for tests and debugging; trainers read the device buffers).
    pub fn column_to_host(&self, i: usize) -> Result<Vec<u8>> {
        Ok(self.device.column_to_host(i)?)
    }

    /// Valid steps of each row (host copy).
    pub fn lengths(&self) -> &[u64] {
        self.device.lengths()
    }

    /// Valid steps of each row as `u64` in device memory.
    pub fn lengths_device(&self) -> &DeviceMemory {
        self.device.lengths_device()
    }

    /// The key of each row (for priority updates).
    pub fn keys(&self) -> &[SlotKey] {
        &self.meta.keys
    }

    /// The probability each row was drawn with.
    pub fn probabilities(&self) -> &[f64] {
        &self.meta.probabilities
    }

    /// The importance-sampling weight of each row.
    pub fn weights(&self) -> &[f64] {
        &self.meta.weights
    }

    /// For each row, the stored step its first copied step came from.
    pub fn starts(&self) -> &[u64] {
        &self.meta.starts
    }

    /// The batch layout (columns, rows, window).
    pub fn layout(&self) -> &BatchLayout {
        self.device.layout()
    }

    /// The event recorded after the last gather into this batch.
    pub fn event(&self) -> &CudaEvent {
        self.device.event()
    }

    /// Makes `stream` wait, on the device, until the batch is complete.
    pub fn wait_on(&self, stream: &CudaStream) -> Result<()> {
        Ok(self.device.wait_on(stream)?)
    }

    /// Blocks the host until the batch is complete.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.device.synchronize()?)
    }

    /// gear-cuda's batch underneath.
    pub fn cuda_batch(&self) -> &CudaBatch {
        &self.device
    }
}

/// Draws batches from one table and gathers them on a GPU, reading the
/// table's host memory zero-copy. Get one with [`ReplayTable::cuda_sampler`].
///
/// The batch buffers are reused: the next [`CudaSampler::sample`] overwrites
/// them. With the trainer's stream in [`CudaSamplerOptions::stream`] that
/// overwrite is ordered after the trainer's kernels; otherwise finish
/// reading a batch before sampling again.
pub struct CudaSampler {
    table: ReplayTable,
    collector: CudaCollector,
    batch: CudaSampledBatch,
    draws: Draws,
    /// Declared last: the registration outlives the batch, whose drop
    /// waits for any gather still reading the table.
    mapping: MappingShare,
}

impl std::fmt::Debug for CudaSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaSampler")
            .field("table", &self.table)
            .field("device", &self.mapping.get().device)
            .field("layout", &self.draws.layout)
            .finish()
    }
}

#[cfg(feature = "cuda")]
impl ReplayTable {
    /// A sampler that gathers batches on a GPU (device and stream from
    /// `device`), reading this table's memory zero-copy. The first one per
    /// table and process page-locks and maps the table's region for the
    /// device. Fails with [`Error::Backend`] (gear-cuda's
    /// `BackendUnavailable`) when there is no usable CUDA driver or device.
    pub fn cuda_sampler(&self, config: SampleConfig, device: CudaSamplerOptions) -> Result<CudaSampler> {
        CudaSampler::new(self.clone(), config, device)
    }
}

impl CudaSampler {
    fn new(table: ReplayTable, config: SampleConfig, options: CudaSamplerOptions) -> Result<Self> {
        // Check the request before touching the device.
        let (draws, meta) = Draws::new(&table, &config)?;
        let mapping = MappingShare::for_table(&table, options.ordinal)?;
        let m = mapping.get();
        let mut collector = CudaCollector::new(&m.device);
        if let Some(stream) = options.stream {
            collector = collector.on_stream(stream)?;
        }
        let device = collector.alloc(&draws.layout)?;
        Ok(CudaSampler { table, collector, batch: CudaSampledBatch { device, meta }, draws, mapping })
    }

    /// The table's data area as gathers see it: its host address and its
    /// device address. A CPU collector reading the same rows through it
    /// gives the reference a device batch must equal.
    pub fn table_view(&self) -> TableView<'_> {
        self.mapping.view()
    }

    /// Draws and gathers one batch on the device. Waits (up to the
    /// timeout) while the table is empty or the rate limiter holds samplers
    /// back. Returns once the gather has completed and every row was
    /// validated: rows whose trajectory was evicted and overwritten while
    /// the device read it are redrawn, so a batch never mixes two
    /// trajectories in a row.
    pub fn sample(&mut self) -> Result<&CudaSampledBatch> {
        let view = self.mapping.view();
        let mut copy = DeviceRows { collector: &self.collector, view, batch: &mut self.batch.device };
        self.draws.sample(&self.table, &mut copy, &mut self.batch.meta)?;
        Ok(&self.batch)
    }

    /// The last batch [`CudaSampler::sample`] returned.
    pub fn batch(&self) -> &CudaSampledBatch {
        &self.batch
    }

    /// The table this sampler draws from.
    pub fn table(&self) -> &ReplayTable {
        &self.table
    }

    /// The device gathers run on.
    pub fn device(&self) -> &CudaDevice {
        &self.mapping.get().device
    }

    /// The stream gathers are queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.collector.stream()
    }
}
