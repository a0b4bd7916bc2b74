//! The device path of the public API: a [`DeviceSampler`] draws rows by
//! the table's strategy and gathers their windows on a device, straight
//! from the table's host memory, into device buffers. Written once over
//! gear-core's [`DeviceApi`]: CUDA (`gear_cuda::CudaApi`, feature `cuda`,
//! [`CudaSampler`](crate::CudaSampler)) and gear-device's CPU device
//! (`gear_device::CpuDeviceApi`, which CI runs it on) are two instances.
//! Nothing is staged: the table's region is mapped for the device in place
//! (`cuMemHostRegister` on CUDA), and the gather kernel reads it over the
//! bus.
//!
//! Selection runs on the device when the strategy names a
//! [`gear_core::SelectionRule`] (uniform, prioritized, max-heap, gear-device's
//! device strategies): the sampler keeps the table's slots (key, length,
//! priority) in device memory, brought in step before every draw with the
//! slots the table's change log touched since the last one (so updates from
//! any process count), and the drawn slots go from the draw kernel into the
//! gather's row tables on the device; the rows' keys, probabilities and
//! weights (those of the host strategy) come back with the batch. Otherwise
//! (FIFO, LIFO, min-heap, user strategies, `max_times_sampled`, sampling
//! while writing, a device cache, or [`DeviceSamplerOptions::host_selection`])
//! the host selects as the CPU [`Sampler`](crate::Sampler) does. See
//! `select`.
//!
//! One [`DeviceSampler::sample`]: admit the batch under the table's
//! protocol (rate limiter), draw it (on the device or the host), queue the
//! gather on the sampler's stream and, right behind it on the same stream,
//! a host function that checks every row's slot generation (gear-core's
//! seqlock) the moment the copy completes. Rows whose slot was reused
//! while the device read them, and rows the device could not draw, are
//! drawn again on the host and only those rows gathered again; rows evicted
//! after a clean copy keep their bytes and their draw. With a ring of
//! batches (the default, two) the next batch is drawn and gathered before
//! `sample()` returns and finished at the next call, so it overlaps the
//! trainer's step; its redraws then get the next call's timeout, not the
//! zero wait it was admitted with. See [`DeviceSamplerOptions`].
//!
//! Hot trajectories can be kept in device memory
//! ([`DeviceSamplerOptions::cache`]): admitted once sampled a given number
//! of times, filled by a thread of their own, gathered from device memory
//! in the same launch as the zero-copy rows.
//!
//! Registration: CUDA refuses to register a range twice (and the CPU device
//! does alike), so every device sampler of one table in one process shares
//! one registration (and one device handle); the last one dropped
//! unregisters the memory. A process maps a table for one device.

mod batch;
mod cache;
mod mapping;
mod options;
mod select;

use crate::error::{Error, Result};
use crate::sampler::{Draws, Gather, SampleConfig};
use crate::table::ReplayTable;
use gear_core::{BatchLayout, Device, DeviceApi, SlotKey, TableView};
use gear_device::{DeviceCollector, DrawnKeys};
use select::DeviceSelection;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

pub use batch::{DeviceColumn, DeviceSampledBatch};
use cache::CacheFill;
use mapping::MappingShare;
pub use options::DeviceSamplerOptions;

fn device_error<E: std::error::Error + Send + Sync + 'static>(e: E) -> Error {
    Error::from_collector(e)
}

/// Where the keys of a batch's rows come from for the check made when its
/// copy completes.
enum CheckKeys<A: DeviceApi> {
    /// Drawn on the host: known when the gather is queued.
    Host(Vec<SlotKey>),
    /// Drawn on the device: read from the batch's rows on the stream.
    Device(DrawnKeys<A>),
}

/// The result of the check queued behind a batch's gather, and the event
/// recorded after it.
struct CopyCheck<A: DeviceApi> {
    valid: Arc<Mutex<Option<Vec<bool>>>>,
    done: A::Event,
}

/// Draws batches from one table and gathers them on a device, reading the
/// table's host memory zero-copy. Get one with
/// [`ReplayTable::device_sampler`] (or [`ReplayTable::cuda_sampler`]).
///
/// Batches live in a ring ([`DeviceSamplerOptions::ring`], two by default):
/// [`DeviceSampler::sample`] hands out the batch gathered since the
/// previous call and starts the next one, so a returned batch stays intact
/// until the call after next. See [`DeviceSamplerOptions::stream`] for how
/// device reads of a batch are ordered before its buffer is reused.
pub struct DeviceSampler<A: DeviceApi> {
    table: ReplayTable,
    device: A::Device,
    collector: DeviceCollector<A>,
    /// The batches; `ring[current]` is the one last returned.
    ring: Vec<DeviceSampledBatch<A>>,
    /// Per batch of the ring: the check queued behind its last gather.
    checks: Vec<Option<CopyCheck<A>>>,
    current: usize,
    /// Whether `ring[(current + 1) % len]` holds a started batch that
    /// `finish` has not seen yet, or the error its start hit.
    pending: Option<Result<()>>,
    /// The trainer's stream, when it is not the collector's.
    trainer: Option<A::Stream>,
    /// Recorded on the trainer's stream before each gather, which waits
    /// for it (the buffer's last reader).
    released: A::Event,
    prefetch: bool,
    draws: Draws,
    /// The device cache and its fill thread, joined before the batches and
    /// the registration go.
    fill: Option<CacheFill<A>>,
    /// Selection on the device, when the table's strategy has a kernel
    /// (see `select`); dropped after the ring, whose drop waits for the
    /// gathers that read its buffers.
    selection: Option<DeviceSelection<A>>,
    /// Declared last: the registration outlives the batches, whose drop
    /// waits for any gather still reading the table.
    mapping: MappingShare<A>,
}

impl<A: DeviceApi> std::fmt::Debug for DeviceSampler<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSampler")
            .field("device", &A::NAME)
            .field("table", &self.table)
            .field("layout", &self.draws.layout)
            .field("ring", &self.ring.len())
            .field("prefetch", &self.prefetch)
            .finish()
    }
}

impl ReplayTable {
    /// A sampler that gathers batches on `device`, reading this table's
    /// memory zero-copy. The first one per table and process maps the
    /// table's region for the device.
    pub fn device_sampler<A: DeviceApi>(
        &self,
        device: &A::Device,
        config: SampleConfig,
        options: DeviceSamplerOptions<A>,
    ) -> Result<DeviceSampler<A>> {
        DeviceSampler::new(self.clone(), device, config, options)
    }
}

impl<A: DeviceApi> DeviceSampler<A> {
    fn new(
        table: ReplayTable,
        device: &A::Device,
        config: SampleConfig,
        options: DeviceSamplerOptions<A>,
    ) -> Result<Self> {
        // Check the request before touching the device.
        if options.ring == 0 {
            return Err(Error::Config("a device sampler needs a ring of at least one batch".into()));
        }
        let (draws, meta) = Draws::new(&table, &config)?;
        // Kernels are loaded once per device; a missing or unusable kernel
        // image is reported here, at sampler creation, not by the first
        // sample().
        device.module().map_err(device_error)?;
        let mapping = MappingShare::<A>::for_table(&table, device)?;
        let device = mapping.get().device.clone();
        let mut collector = DeviceCollector::<A>::new(&device);
        let mut trainer = None;
        match (options.stream, options.ring) {
            (Some(s), 1) => collector = collector.on_stream(s).map_err(device_error)?,
            (Some(s), _) => {
                if !device.owns_stream(&s) {
                    return Err(Error::Config("the trainer's stream belongs to another device".into()));
                }
                collector = collector.on_stream(device.new_stream().map_err(device_error)?).map_err(device_error)?;
                trainer = Some(s);
            }
            (None, 1) => {}
            (None, _) => {
                collector = collector.on_stream(device.new_stream().map_err(device_error)?).map_err(device_error)?
            }
        }
        let fill = match options.cache_entries {
            0 => None,
            n => {
                let f = CacheFill::<A>::new(&device, &table, n, options.cache_admit_after)?;
                collector = collector.with_cache(f.cache.clone()).map_err(device_error)?;
                Some(f)
            }
        };
        let ring = (0..options.ring)
            .map(|_| {
                let device = collector.alloc(&draws.layout).map_err(device_error)?;
                Ok(DeviceSampledBatch { device, meta: meta.clone() })
            })
            .collect::<Result<Vec<_>>>()?;
        let prefetch = options.ring > 1 && table.max_times_sampled().is_none();
        let on_device = !options.host_selection && fill.is_none() && table.device_rule().is_some();
        let selection = if on_device {
            let rows = draws.layout.rows();
            Some(DeviceSelection::new(
                &device,
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
        let released = device.new_event().map_err(device_error)?;
        Ok(DeviceSampler {
            table,
            device,
            collector,
            current: ring.len() - 1,
            checks: (0..ring.len()).map(|_| None).collect(),
            ring,
            pending: None,
            trainer,
            released,
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
    /// table is empty or the rate limiter holds samplers back; the timeout
    /// also bounds the redraws of the batch returned.
    pub fn sample(&mut self) -> Result<&DeviceSampledBatch<A>> {
        let n = self.ring.len();
        let slot = (self.current + 1) % n;
        let deadline = match self.pending.take() {
            Some(Ok(())) => {
                // Started with no time to wait: its redraws get this call's.
                self.draws.rearm_deadline();
                self.draws.timeout.map(|t| Instant::now() + t)
            }
            Some(Err(e)) => return Err(e),
            None => {
                let timeout = self.draws.timeout;
                let deadline = timeout.map(|t| Instant::now() + t);
                self.start(slot, timeout)?;
                deadline
            }
        };
        self.finish(slot, deadline)?;
        self.current = slot;
        if let Some(fill) = &mut self.fill {
            fill.admit(&self.table, &self.ring[slot].meta.keys);
        }
        if let Some(trainer) = &self.trainer {
            // The trainer's later kernels read the batch after its gather,
            // with no host wait.
            self.ring[slot].device.wait_on(trainer).map_err(device_error)?;
        }
        if self.prefetch {
            match self.start((slot + 1) % n, Some(Duration::ZERO)) {
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
    /// reader), then the check of its rows when the copy completes.
    fn start(&mut self, i: usize, timeout: Option<Duration>) -> Result<()> {
        if let Some(trainer) = &self.trainer {
            self.device.record(&self.released, trainer).map_err(device_error)?;
            self.device.wait(self.collector.stream(), &self.released).map_err(device_error)?;
        }
        self.checks[i] = None;
        let view = self.mapping.view();
        let capacity = self.table.spec().capacity();
        if let Some(sel) = &mut self.selection {
            let deadline = timeout.map(|t| Instant::now() + t);
            if sel.start(&self.table, &self.collector, &view, i, &mut self.ring[i].device, deadline)? {
                let keys = CheckKeys::Device(sel.keys_handle(i, capacity));
                return self.queue_check(i, keys);
            }
        }
        let mut copy = Gather { collector: &self.collector, view, batch: &mut self.ring[i].device };
        self.draws.start(&self.table, &mut copy, timeout)?;
        let keys = CheckKeys::Host(self.draws.keys());
        self.queue_check(i, keys)
    }

    /// Queues, behind `ring[i]`'s gather on the collector's stream, the
    /// check of every row's slot generation, which runs as soon as the copy
    /// completes. If it cannot be queued, the rows are checked when the
    /// batch is finished instead.
    fn queue_check(&mut self, i: usize, keys: CheckKeys<A>) -> Result<()> {
        let valid = Arc::new(Mutex::new(None));
        let (table, out) = (self.table.clone(), valid.clone());
        let check = Box::new(move || {
            let keys: Vec<Option<SlotKey>> = match keys {
                CheckKeys::Host(keys) => keys.into_iter().map(Some).collect(),
                // SAFETY: this function runs on the stream behind the gather
                // that wrote the rows (queued right after it).
                CheckKeys::Device(handle) => match unsafe { handle.keys() } {
                    Ok(k) => k,
                    Err(_) => return,
                },
            };
            let slots = table.shared.region.slots();
            let v: Vec<bool> = keys
                .iter()
                .map(|k| k.is_some_and(|k| slots.get(k.slot as usize).is_some_and(|rec| rec.read_validate(k))))
                .collect();
            *out.lock().unwrap_or_else(PoisonError::into_inner) = Some(v);
        });
        let stream = self.collector.stream();
        let done = self.device.new_event().map_err(device_error)?;
        if self.device.host_fn(stream, check).is_ok() && self.device.record(&done, stream).is_ok() {
            self.checks[i] = Some(CopyCheck { valid, done });
        }
        Ok(())
    }

    /// Settles, validates and describes `ring[i]`; redraws share
    /// `deadline`.
    fn finish(&mut self, i: usize, deadline: Option<Instant>) -> Result<()> {
        let checked = match self.checks[i].take() {
            Some(c) => {
                self.device.event_synchronize(&c.done).map_err(device_error)?;
                c.valid.lock().unwrap_or_else(PoisonError::into_inner).take()
            }
            None => None,
        };
        let view = self.mapping.view();
        let b = &mut self.ring[i];
        match self.selection.as_mut().filter(|s| s.is_in_flight(i)) {
            Some(sel) => sel.adopt(&self.table, i, &mut b.device, &mut self.draws, deadline, checked)?,
            None => {
                if let Some(c) = checked {
                    self.draws.checked_at_copy(c);
                }
            }
        }
        let mut copy = Gather { collector: &self.collector, view, batch: &mut b.device };
        self.draws.finish(&self.table, &mut copy, &mut b.meta)
    }

    /// The layout of every batch this sampler draws (columns, rows,
    /// window, bytes).
    pub fn layout(&self) -> &BatchLayout {
        &self.draws.layout
    }

    /// Whether the batch being prefetched has been copied and its rows
    /// checked (for tests and diagnostics; `false` when none is).
    pub fn prefetch_checked(&self) -> bool {
        if !matches!(self.pending, Some(Ok(()))) {
            return false;
        }
        let next = (self.current + 1) % self.ring.len();
        self.checks[next].as_ref().is_some_and(|c| c.valid.lock().unwrap_or_else(PoisonError::into_inner).is_some())
    }

    /// Whether this sampler selects on the device: the table's strategy
    /// names a [`gear_core::SelectionRule`] (uniform, prioritized,
    /// max-heap, or gear-device's device strategies), the table has no
    /// `max_times_sampled` and does not sample trajectories being written,
    /// the sampler has no device cache and
    /// [`DeviceSamplerOptions::host_selection`] is off.
    pub fn selects_on_device(&self) -> bool {
        self.selection.is_some()
    }

    /// Batches drawn on the device so far (each returned batch was drawn
    /// either there or, when the device path declined it, on the host).
    pub fn device_batches(&self) -> u64 {
        self.selection.as_ref().map_or(0, DeviceSelection::batches)
    }

    /// Rows drawn again so far because their copy was torn, their key had
    /// gone stale or nothing drew them.
    pub fn redrawn_rows(&self) -> u64 {
        self.draws.redrawn
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

    /// The last batch [`DeviceSampler::sample`] returned.
    pub fn batch(&self) -> &DeviceSampledBatch<A> {
        &self.ring[self.current]
    }

    /// The table this sampler draws from.
    pub fn table(&self) -> &ReplayTable {
        &self.table
    }

    /// The device gathers run on.
    pub fn device(&self) -> &A::Device {
        &self.device
    }

    /// The stream gathers are queued on.
    pub fn stream(&self) -> &A::Stream {
        self.collector.stream()
    }
}

impl<A: DeviceApi> Drop for DeviceSampler<A> {
    fn drop(&mut self) {
        // The checks queued behind the gathers hold a table handle and run
        // on the stream: let them finish before the batches and the
        // registration go.
        let _ = self.device.stream_synchronize(self.collector.stream());
    }
}
