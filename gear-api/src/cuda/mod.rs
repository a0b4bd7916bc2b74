//! The CUDA path of the public API (Cargo feature `cuda`): a
//! [`CudaSampler`] draws rows by the table's strategy and gathers their
//! windows on a GPU, straight from the table's host memory, into device
//! buffers. Nothing is staged: the table's region is page-locked and mapped
//! for the device in place (`cuMemHostRegister` through
//! [`CudaDevice::register`]), and gear-cuda's gather kernel reads it over
//! the bus.
//!
//! Selection runs on the GPU when the strategy names a
//! [`gear_core::SelectionRule`] (uniform, prioritized, max-heap, gear-cuda's
//! GPU strategies): the sampler keeps the table's slots (key, length,
//! priority) in device memory, brought in step before every draw with the
//! slots the table's change log touched since the last one (so updates from
//! any process count), and the drawn slots go from the draw kernel into the
//! gather's row tables on the device; the rows' keys, probabilities and
//! weights (those of the host strategy) come back with the batch. Otherwise
//! (FIFO, LIFO, min-heap, user strategies, `max_times_sampled`, sampling
//! while writing, a device cache, or [`CudaSamplerOptions::host_selection`])
//! the host selects as the CPU [`Sampler`](crate::Sampler) does. See
//! `device_select`.
//!
//! One [`CudaSampler::sample`]: admit the batch under the table's protocol
//! (rate limiter), draw it (on the device or the host), queue the gather on
//! the sampler's stream, and, once the device has finished reading,
//! validate every row's slot generation (gear-core's seqlock): rows whose
//! slot was reused while the device read them, and rows the device could
//! not draw, are drawn again on the host and only those rows gathered
//! again. With a ring of batches (the default, two) the next batch is drawn
//! and gathered before `sample()` returns and validated at the next call,
//! so it overlaps the trainer's step; see [`CudaSamplerOptions`].
//!
//! Hot trajectories can be kept in device memory
//! ([`CudaSamplerOptions::cache`]): admitted once sampled a given number of
//! times, filled by a thread of their own, gathered from HBM in the same
//! launch as the zero-copy rows.
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
//! The device tests in `gear-api/tests/cuda.rs` (every batch byte for byte
//! against the CPU collector and the CPU sampler) are packed by
//! `cargo xtask gpu-test`; those written before GPU selection passed on an
//! H100 on 2026-11-22. GPU selection and its two device tests have not run
//! on a GPU yet (its protocol is tested on the host: `table::device`,
//! `device_select`, and gear-cuda's CPU shim).

mod device_select;

use crate::error::{Error, Result};
use crate::sampler::{BatchMeta, Draws, Gather, SampleConfig};
use crate::table::ranges::TableMemory;
use crate::table::ReplayTable;
use device_select::DeviceSelection;
use gear_core::TableRegion;
use gear_core::{BatchLayout, DType, MemoryRegion, SlotKey, TableView};
use gear_cuda::cudarc::driver::{CudaEvent, CudaStream};
use gear_cuda::{CudaBatch, CudaCollector, CudaDevice, DeviceCache, DeviceMemory, RegisteredRegion};
use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

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

/// Which GPU a [`CudaSampler`] gathers on, the trainer's stream, and how
/// many batches it keeps.
#[derive(Clone, Debug)]
pub struct CudaSamplerOptions {
    /// CUDA device ordinal (default 0).
    pub ordinal: usize,
    /// The trainer's stream, which must belong to device `ordinal`'s
    /// primary context. With a ring of two or more batches, gathers run on
    /// a stream of their own; each returned batch makes this stream wait
    /// (on the device) for its gather, and a batch buffer is overwritten
    /// only after this stream has passed the work queued on it before the
    /// sampler was called again. With a ring of one, gathers are queued on
    /// this stream itself. `None`: the device handle's stream, and the
    /// trainer must finish reading a batch before sampling again.
    pub stream: Option<Arc<CudaStream>>,
    /// Batches kept (default 2): with two or more, `sample()` returns the
    /// batch gathered in the background since the previous call and starts
    /// gathering the next one before returning, so the gather overlaps the
    /// training step. 1: no prefetch, each call gathers its own batch.
    /// Tables with `max_times_sampled` (queues, stacks) never prefetch: a
    /// prefetched batch would take rows out that no trainer may receive.
    pub ring: usize,
    /// Trajectories to keep in device memory (0, the default: none). See
    /// [`CudaSamplerOptions::cache`].
    pub cache_entries: usize,
    /// Admission rule of the device cache: a trajectory is copied to
    /// device memory once its slot has been sampled this many times
    /// (counted in the shared slot record, by every sampler of every
    /// process; default 2).
    pub cache_admit_after: u64,
    /// Select on the host even when the table's strategy has a GPU kernel
    /// (default `false`: such tables select on the GPU; see
    /// [`CudaSampler::selects_on_device`]).
    pub host_selection: bool,
}

impl Default for CudaSamplerOptions {
    fn default() -> Self {
        CudaSamplerOptions {
            ordinal: 0,
            stream: None,
            ring: 2,
            cache_entries: 0,
            cache_admit_after: 2,
            host_selection: false,
        }
    }
}

impl CudaSamplerOptions {
    /// Device `ordinal`, its default stream, a ring of two batches.
    pub fn new(ordinal: usize) -> Self {
        CudaSamplerOptions { ordinal, ..Default::default() }
    }

    /// The trainer's stream (see [`CudaSamplerOptions::stream`]).
    pub fn stream(mut self, stream: Arc<CudaStream>) -> Self {
        self.stream = Some(stream);
        self
    }

    /// Keep `n` batches (at least 1; see [`CudaSamplerOptions::ring`]).
    pub fn ring(mut self, n: usize) -> Self {
        self.ring = n;
        self
    }

    /// Select on the host (`true`) even when the table's strategy has a GPU
    /// kernel (see [`CudaSamplerOptions::host_selection`]).
    pub fn host_selection(mut self, yes: bool) -> Self {
        self.host_selection = yes;
        self
    }

    /// Keep up to `entries` hot trajectories in device memory
    /// (`entries * slot stride` bytes) and gather them from there; the
    /// rest is read zero-copy from the table. A trajectory is admitted once
    /// its slot has been sampled `admit_after` times (any sampler, any
    /// process); when the cache is full the oldest admission is replaced.
    /// Fills run on a thread of their own and never block `sample()`: until
    /// a copy is complete the row is read zero-copy. Cached rows are checked
    /// against the slot's current key when a gather is planned and validated
    /// after it like every other row, so a reused slot is never served from
    /// a stale copy. A sampler with a cache selects on the host (the cache
    /// is looked up per drawn slot there); GPU-drawn rows are read
    /// zero-copy.
    pub fn cache(mut self, entries: usize, admit_after: u64) -> Self {
        self.cache_entries = entries;
        self.cache_admit_after = admit_after.max(1);
        self
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
        self.region.inner().table()
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
        let region = device.register(TableMemory::new(table.clone()))?;
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
    // Rows (0 before the first sample), keys, probabilities, weights and
    // starts, as every batch type has them.
    crate::sampler::row_metadata!();

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

/// A sampler's device cache, the thread that fills it, and the admission
/// bookkeeping.
struct CacheFill {
    cache: Arc<DeviceCache<TableMemory>>,
    /// Bounded: a full queue drops the request rather than block sampling.
    tx: Option<std::sync::mpsc::SyncSender<SlotKey>>,
    thread: Option<std::thread::JoinHandle<()>>,
    admit_after: u64,
    /// Keys already sent (cleared when it grows past a few cache sizes).
    requested: HashSet<SlotKey>,
}

impl CacheFill {
    fn new(device: &CudaDevice, table: &ReplayTable, entries: usize, admit_after: u64) -> Result<Self> {
        let region = TableRegion::open(TableMemory::new(table.clone()), Some(table.spec()))?;
        let cache = Arc::new(DeviceCache::new(device, Arc::new(region), entries)?);
        let (tx, rx) = std::sync::mpsc::sync_channel::<SlotKey>(entries.clamp(16, 4096));
        let filler = cache.clone();
        let thread = std::thread::Builder::new()
            .name("gear-cuda-cache-fill".into())
            .spawn(move || {
                for key in rx {
                    // A key gone stale before or during its copy is simply
                    // not cached.
                    let _ = filler.insert(key);
                }
            })
            .map_err(|e| Error::Config(format!("cannot start the cache fill thread: {e}")))?;
        Ok(CacheFill { cache, tx: Some(tx), thread: Some(thread), admit_after, requested: HashSet::new() })
    }

    /// Applies the admission rule to the rows of a finished batch.
    fn admit(&mut self, table: &ReplayTable, keys: &[SlotKey]) {
        let Some(tx) = &self.tx else { return };
        if self.requested.len() > 4 * self.cache.capacity() {
            self.requested.clear();
        }
        for &key in keys {
            // The cache holds trajectories: an item's is cached for it.
            let Some((trajectory, times)) = table.trajectory_sampled(key) else { continue };
            if self.requested.contains(&trajectory) || self.cache.contains(trajectory) {
                continue;
            }
            if times >= self.admit_after && tx.try_send(trajectory).is_ok() {
                self.requested.insert(trajectory);
            }
        }
    }
}

impl Drop for CacheFill {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Draws batches from one table and gathers them on a GPU, reading the
/// table's host memory zero-copy. Get one with [`ReplayTable::cuda_sampler`].
///
/// Batches live in a ring ([`CudaSamplerOptions::ring`], two by default):
/// [`CudaSampler::sample`] hands out the batch gathered since the previous
/// call and starts the next one, so a returned batch stays intact until
/// the call after next. See [`CudaSamplerOptions::stream`] for how device
/// reads of a batch are ordered before its buffer is reused.
pub struct CudaSampler {
    table: ReplayTable,
    collector: CudaCollector,
    /// The batches; `ring[current]` is the one last returned.
    ring: Vec<CudaSampledBatch>,
    current: usize,
    /// Whether `ring[(current + 1) % len]` holds a started batch that
    /// `finish` has not seen yet, or the error its start hit.
    pending: Option<Result<()>>,
    /// The trainer's stream, when it is not the collector's.
    trainer: Option<Arc<CudaStream>>,
    prefetch: bool,
    draws: Draws,
    /// The device cache and its fill thread, joined before the batches and
    /// the registration go.
    fill: Option<CacheFill>,
    /// GPU selection, when the table's strategy has a kernel (see
    /// `device_select`); dropped after the ring, whose drop waits for the
    /// gathers that read its buffers.
    selection: Option<DeviceSelection>,
    /// Declared last: the registration outlives the batches, whose drop
    /// waits for any gather still reading the table.
    mapping: MappingShare,
}

impl std::fmt::Debug for CudaSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaSampler")
            .field("table", &self.table)
            .field("device", &self.mapping.get().device)
            .field("layout", &self.draws.layout)
            .field("ring", &self.ring.len())
            .field("prefetch", &self.prefetch)
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
        if options.ring == 0 {
            return Err(Error::Config("a cuda sampler needs a ring of at least one batch".into()));
        }
        let (draws, meta) = Draws::new(&table, &config)?;
        let mapping = MappingShare::for_table(&table, options.ordinal)?;
        let m = mapping.get();
        let mut collector = CudaCollector::new(&m.device);
        let mut trainer = None;
        match (options.stream, options.ring) {
            (Some(s), 1) => collector = collector.on_stream(s)?,
            (Some(s), _) => {
                collector = collector.on_stream(m.device.new_stream()?)?;
                if **s.context() != **m.device.context() {
                    return Err(Error::Config("the trainer's stream belongs to another device context".into()));
                }
                trainer = Some(s);
            }
            (None, 1) => {}
            (None, _) => collector = collector.on_stream(m.device.new_stream()?)?,
        }
        let fill = match options.cache_entries {
            0 => None,
            n => {
                let f = CacheFill::new(&m.device, &table, n, options.cache_admit_after)?;
                collector = collector.with_cache(f.cache.clone())?;
                Some(f)
            }
        };
        let ring = (0..options.ring)
            .map(|_| Ok(CudaSampledBatch { device: collector.alloc(&draws.layout)?, meta: meta.clone() }))
            .collect::<Result<Vec<_>>>()?;
        let prefetch = options.ring > 1 && table.max_times_sampled().is_none();
        let on_device = !options.host_selection && fill.is_none() && table.device_rule().is_some();
        let selection = if on_device {
            let rows = draws.layout.rows();
            Some(DeviceSelection::new(
                &m.device,
                &collector,
                &table,
                ring.len(),
                rows,
                draws.seed(),
                config.random_start,
            )?)
        } else {
            None
        };
        Ok(CudaSampler {
            table,
            collector,
            current: ring.len() - 1,
            ring,
            pending: None,
            trainer,
            prefetch,
            draws,
            fill,
            selection,
            mapping,
        })
    }

    /// The table's data area as gathers see it: its host address and its
    /// device address. A CPU collector reading the same rows through it
    /// gives the reference a device batch must equal.
    pub fn table_view(&self) -> TableView<'_> {
        self.mapping.view()
    }

    /// Returns the next batch, complete on the device and validated: rows
    /// whose trajectory was evicted and overwritten while the device read
    /// them were redrawn and only those rows gathered again, so a batch
    /// never mixes two trajectories in a row. With prefetch (a ring of two
    /// or more, the default) the batch was gathered in the background since
    /// the previous call, which then only waits if that gather is still
    /// running, and the next batch is started before returning (without
    /// waiting for the rate limiter: if it holds samplers back, the next
    /// call draws and waits instead). Waits (up to the timeout) while the
    /// table is empty or the rate limiter holds samplers back.
    pub fn sample(&mut self) -> Result<&CudaSampledBatch> {
        let n = self.ring.len();
        let slot = (self.current + 1) % n;
        match self.pending.take() {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(e),
            None => {
                let timeout = self.draws.timeout;
                self.start(slot, timeout)?;
            }
        }
        self.finish(slot)?;
        self.current = slot;
        if let Some(fill) = &mut self.fill {
            fill.admit(&self.table, &self.ring[slot].meta.keys);
        }
        if let Some(trainer) = &self.trainer {
            // The trainer's later kernels read the batch after its gather,
            // with no host wait.
            self.ring[slot].device.wait_on(trainer)?;
        }
        if self.prefetch {
            match self.start((slot + 1) % n, Some(std::time::Duration::ZERO)) {
                Ok(()) => self.pending = Some(Ok(())),
                // Not admitted right now: the next call draws, and waits.
                Err(Error::Timeout { .. }) | Err(Error::Core(gear_core::Error::Empty(_))) => {}
                Err(e) => self.pending = Some(Err(e)),
            }
        }
        Ok(&self.ring[slot])
    }

    /// Draws into `ring[i]` and queues its gather, after the trainer has
    /// passed the work it queued before this call (the buffer's last
    /// reader).
    fn start(&mut self, i: usize, timeout: Option<std::time::Duration>) -> Result<()> {
        if let Some(trainer) = &self.trainer {
            let cuda = |e| Error::from(gear_cuda::Error::from(e));
            let released = trainer.record_event(None).map_err(cuda)?;
            self.collector.stream().wait(&released).map_err(cuda)?;
        }
        let view = self.mapping.view();
        if let Some(sel) = &mut self.selection {
            let deadline = timeout.map(|t| std::time::Instant::now() + t);
            if sel.start(&self.table, &self.collector, &view, i, &mut self.ring[i].device, deadline)? {
                return Ok(());
            }
        }
        let mut copy = Gather { collector: &self.collector, view, batch: &mut self.ring[i].device };
        self.draws.start(&self.table, &mut copy, timeout)
    }

    /// Settles, validates and describes `ring[i]`.
    fn finish(&mut self, i: usize) -> Result<()> {
        let view = self.mapping.view();
        let b = &mut self.ring[i];
        if let Some(sel) = self.selection.as_mut().filter(|s| s.is_in_flight(i)) {
            sel.adopt(&self.table, i, &mut b.device, &mut self.draws)?;
        }
        let mut copy = Gather { collector: &self.collector, view, batch: &mut b.device };
        self.draws.finish(&self.table, &mut copy, &mut b.meta)
    }

    /// Whether this sampler selects on the GPU: the table's strategy names
    /// a [`gear_core::SelectionRule`] (uniform, prioritized, max-heap, or
    /// gear-cuda's GPU strategies), the table has no `max_times_sampled`
    /// and does not sample trajectories being written, the sampler has no
    /// device cache and [`CudaSamplerOptions::host_selection`] is off.
    pub fn selects_on_device(&self) -> bool {
        self.selection.is_some()
    }

    /// Batches drawn on the GPU so far (each returned batch was drawn
    /// either there or, when the device path declined it, on the host).
    pub fn device_batches(&self) -> u64 {
        self.selection.as_ref().map_or(0, DeviceSelection::batches)
    }

    /// Whether the next batch is already being gathered.
    pub fn is_prefetching(&self) -> bool {
        matches!(self.pending, Some(Ok(())))
    }

    /// Batches in the ring.
    pub fn ring_len(&self) -> usize {
        self.ring.len()
    }

    /// Trajectories now held in the device cache (0 without one).
    pub fn cached_trajectories(&self) -> usize {
        self.fill.as_ref().map_or(0, |f| f.cache.len())
    }

    /// The last batch [`CudaSampler::sample`] returned.
    pub fn batch(&self) -> &CudaSampledBatch {
        &self.ring[self.current]
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
