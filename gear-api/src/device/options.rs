//! [`DeviceSamplerOptions`]: the stream, the ring of batches, host
//! selection and the device cache a sampler is built with.

use gear_core::DeviceApi;

/// Which stream the trainer reads batches on, how many batches a
/// [`DeviceSampler`](super::DeviceSampler) keeps, and its device cache.
#[derive(Clone)]
pub struct DeviceSamplerOptions<A: DeviceApi> {
    /// The device ordinal
    /// [`ReplayTable::cuda_sampler`](crate::table::ReplayTable::cuda_sampler)
    /// opens (default 0);
    /// [`ReplayTable::device_sampler`](crate::table::ReplayTable::device_sampler)
    /// is given its device and ignores it.
    pub ordinal: usize,
    /// The trainer's stream, which must belong to the sampler's device.
    /// With a ring of two or more batches, gathers run on a stream of their
    /// own; each returned batch makes this stream wait (on the device) for
    /// its gather, and a batch buffer is overwritten only after this stream
    /// has passed the work queued on it before the sampler was called
    /// again. With a ring of one, gathers are queued on this stream itself.
    /// `None`: the device handle's stream, and the trainer must finish
    /// reading a batch before sampling again.
    pub stream: Option<A::Stream>,
    /// Batches kept (default 2): with two or more, `sample()` returns the
    /// batch gathered in the background since the previous call and starts
    /// gathering the next one before returning, so the gather overlaps the
    /// training step. 1: no prefetch, each call gathers its own batch.
    /// Tables with `max_times_sampled` (queues, stacks) never prefetch: a
    /// prefetched batch would take rows out that no trainer may receive.
    pub ring: usize,
    /// Trajectories to keep in device memory (0, the default: none). See
    /// [`DeviceSamplerOptions::cache`].
    pub cache_entries: usize,
    /// Admission rule of the device cache: a trajectory is copied to
    /// device memory once its slot has been sampled this many times
    /// (counted in the shared slot record, by every sampler of every
    /// process; default 2).
    pub cache_admit_after: u64,
    /// Select on the host even when the table's strategy has a device
    /// kernel (default `false`: such tables select on the device; see
    /// [`DeviceSampler::selects_on_device`](super::DeviceSampler::selects_on_device)).
    pub host_selection: bool,
}

impl<A: DeviceApi> std::fmt::Debug for DeviceSamplerOptions<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSamplerOptions")
            .field("ordinal", &self.ordinal)
            .field("trainer_stream", &self.stream.is_some())
            .field("ring", &self.ring)
            .field("cache_entries", &self.cache_entries)
            .field("cache_admit_after", &self.cache_admit_after)
            .field("host_selection", &self.host_selection)
            .finish()
    }
}

impl<A: DeviceApi> Default for DeviceSamplerOptions<A> {
    fn default() -> Self {
        DeviceSamplerOptions {
            ordinal: 0,
            stream: None,
            ring: 2,
            cache_entries: 0,
            cache_admit_after: 2,
            host_selection: false,
        }
    }
}

impl<A: DeviceApi> DeviceSamplerOptions<A> {
    /// Device `ordinal`, its default stream, a ring of two batches.
    pub fn new(ordinal: usize) -> Self {
        DeviceSamplerOptions { ordinal, ..Default::default() }
    }

    /// The trainer's stream (see [`DeviceSamplerOptions::stream`]).
    pub fn stream(mut self, stream: A::Stream) -> Self {
        self.stream = Some(stream);
        self
    }

    /// Keep `n` batches (at least 1; see [`DeviceSamplerOptions::ring`]).
    pub fn ring(mut self, n: usize) -> Self {
        self.ring = n;
        self
    }

    /// Select on the host (`true`) even when the table's strategy has a
    /// device kernel (see [`DeviceSamplerOptions::host_selection`]).
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
    /// is looked up per drawn slot there).
    pub fn cache(mut self, entries: usize, admit_after: u64) -> Self {
        self.cache_entries = entries;
        self.cache_admit_after = admit_after.max(1);
        self
    }
}
