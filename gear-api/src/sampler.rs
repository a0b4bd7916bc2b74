//! Trainers sample batches of windows. A [`Sampler`] owns its batch buffers
//! and reuses them, so steady-state sampling allocates nothing.

use crate::error::{Error, Result};
use crate::table::{Drawn, ReplayTable, Selection};
use gear_core::{
    BatchLayout, Collector, DType, Element, GatherRow, RandomSource, SlotKey, TableSpec, TableView, WindowSpec,
    Xoshiro256,
};
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Most rows one batch may have (2^24): more is a mistake, and the batch's
/// per-row metadata alone would take gigabytes.
pub const MAX_BATCH_ROWS: usize = 1 << 24;

/// Attempts at copying a batch before giving up with [`Error::Torn`].
pub(crate) const MAX_COPY_ATTEMPTS: u32 = 16;

/// What a sampler draws.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleConfig {
    /// Columns to gather, by name; empty means every column.
    pub columns: Vec<String>,
    /// Rows per batch.
    pub batch_size: usize,
    /// Which steps of each trajectory fill a row.
    pub window: WindowSpec,
    /// How long a sample may wait for data or the rate limiter (`None`:
    /// forever).
    pub timeout: Option<Duration>,
    /// Start each row's window at a random step (see
    /// [`SampleConfig::random_start`]).
    pub random_start: bool,
}

impl SampleConfig {
    /// All columns, `batch_size` rows of `window`, waiting at most 10 s.
    pub fn new(batch_size: usize, window: WindowSpec) -> Self {
        SampleConfig {
            columns: Vec::new(),
            batch_size,
            window,
            timeout: Some(Duration::from_secs(10)),
            random_start: false,
        }
    }

    /// Start each row's window at a uniformly random step of its trajectory
    /// (R2D2-style sequence sampling) instead of at `window.offset`: a
    /// trajectory of `k >= window.len` published steps gives one of its
    /// `k - window.len + 1` full windows, each equally likely; a shorter one
    /// gives all its steps, padded as `window.pad` says. `window.offset` is
    /// not used. [`SampledBatch::starts`] tells where each row begins.
    pub fn random_start(mut self) -> Self {
        self.random_start = true;
        self
    }

    /// Only these columns.
    pub fn columns<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.columns = names.into_iter().map(Into::into).collect();
        self
    }

    /// Wait at most this long (`None`: forever).
    pub fn timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }
}

/// What every batch carries whatever the backend: the requested columns
/// (names, dtypes, shapes), and per row the key, probability and weight.
#[derive(Clone, Debug)]
pub(crate) struct BatchMeta {
    pub(crate) names: Vec<String>,
    pub(crate) dtypes: Vec<DType>,
    pub(crate) shapes: Vec<Vec<u64>>,
    pub(crate) keys: Vec<SlotKey>,
    pub(crate) probabilities: Vec<f64>,
    pub(crate) weights: Vec<f64>,
    /// The stored step each row's first copied step came from.
    pub(crate) starts: Vec<u64>,
}

impl BatchMeta {
    fn new(spec: &TableSpec, columns: &[usize], rows: usize) -> Self {
        let cols = columns.iter().map(|&c| &spec.columns()[c]);
        BatchMeta {
            names: cols.clone().map(|c| c.name().to_owned()).collect(),
            dtypes: cols.clone().map(|c| c.dtype()).collect(),
            shapes: cols.map(|c| c.shape().to_vec()).collect(),
            keys: Vec::with_capacity(rows),
            probabilities: Vec::with_capacity(rows),
            weights: Vec::with_capacity(rows),
            starts: Vec::with_capacity(rows),
        }
    }

    /// The index of a requested column.
    pub(crate) fn index(&self, name: &str) -> Result<usize> {
        self.names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| Error::Config(format!("column `{name}` was not requested by this sampler")))
    }
}

/// Where one batch is gathered: a backend's [`Collector`], the view of the
/// table it reads (host-addressable, or mapped for a device), and the batch
/// buffers it fills.
pub(crate) struct Gather<'a, C: Collector> {
    pub(crate) collector: &'a C,
    pub(crate) view: TableView<'a>,
    pub(crate) batch: &'a mut C::Batch,
}

impl<C: Collector> Gather<'_, C> {
    fn all(&mut self, layout: &BatchLayout, rows: &[GatherRow]) -> Result<()> {
        self.collector.gather(&self.view, rows, layout, self.batch).map_err(Error::from_collector)
    }

    fn again(&mut self, layout: &BatchLayout, rows: &[GatherRow], which: &[usize]) -> Result<()> {
        self.collector.regather(&self.view, rows, layout, which, self.batch).map_err(Error::from_collector)
    }

    fn settle(&mut self) -> Result<()> {
        self.collector.settle(self.batch).map_err(Error::from_collector)
    }

    fn valid_steps(&self) -> u64 {
        self.collector.lengths(self.batch).iter().sum()
    }
}

/// The draw -> copy -> validate -> redraw protocol every sampler follows,
/// whatever backend copies the bytes, and its reusable buffers.
#[derive(Debug)]
pub(crate) struct Draws {
    pub(crate) layout: BatchLayout,
    pub(crate) timeout: Option<Duration>,
    /// When the batch being drawn must be ready (from the timeout of the
    /// call that started it); redraws of torn rows share it.
    deadline: Option<Instant>,
    draws: Vec<Drawn>,
    redraws: Vec<Drawn>,
    rows: Vec<GatherRow>,
    torn: Vec<usize>,
    /// Rows of an adopted batch ([`Draws::adopt`]) drawn by nothing: torn
    /// from the start, ascending.
    missing: Vec<usize>,
    /// Per row, whether its slot still held the drawn key when the copy
    /// completed ([`Draws::checked_at_copy`]): the first validation uses
    /// this instead of checking again, so a row evicted after a clean copy
    /// is not counted torn.
    checked: Option<Vec<bool>>,
    /// Rows drawn again because their copy was torn, their key stale or
    /// nothing drew them, over the sampler's life.
    pub(crate) redrawn: u64,
    /// This sampler's random stream and selection buffers.
    selection: Selection,
    /// Bytes of every column of one step, summed over requested columns.
    step_bytes: u64,
    /// Where random window starts come from, when rows start at random.
    random_starts: Option<RandomStarts>,
    /// The table's items per trajectory (0: rows are trajectories).
    items_per_slot: u32,
}

/// R2D2-style random window starts ([`SampleConfig::random_start`]), for
/// the sampler and for draws that return byte ranges: a random start is
/// "the last `len` steps of the trajectory cut short at a random point",
/// so the window rule needs no per-row offset.
#[derive(Debug)]
pub(crate) struct RandomStarts(Xoshiro256);

impl RandomStarts {
    /// A stream derived from a selection's seed (the table's seed and the
    /// sampler, never the process id), so that a seeded table cuts the same
    /// windows run after run.
    pub(crate) fn new(selection_seed: u64) -> Self {
        RandomStarts(Xoshiro256::seed_from_u64(selection_seed ^ 0x5eed_5747_a475_0001))
    }

    /// The window rule rows cut by [`RandomStarts::cut`] are read with: the
    /// last `window.len` steps (`window.offset` is not used).
    pub(crate) fn window(window: WindowSpec) -> WindowSpec {
        WindowSpec { offset: -(window.len.min(i64::MAX as u64) as i64), ..window }
    }

    /// Where to cut a row of `len` published steps (a trajectory, or an
    /// item's window) so that its last `window_len` steps start uniformly
    /// at random inside it; a row no longer than the window is not cut.
    pub(crate) fn cut(&mut self, len: u64, window_len: u64) -> u64 {
        if len > window_len {
            window_len + self.0.below(len - window_len + 1)
        } else {
            len
        }
    }
}

impl Draws {
    /// Checks `config` against the table and sizes the buffers.
    pub(crate) fn new(table: &ReplayTable, config: &SampleConfig) -> Result<(Self, BatchMeta)> {
        if config.batch_size == 0 {
            return Err(Error::Config("batch size must be at least 1".into()));
        }
        if config.batch_size > MAX_BATCH_ROWS {
            return Err(Error::Config(format!(
                "batch size {} is above the limit of {MAX_BATCH_ROWS} rows a batch",
                config.batch_size
            )));
        }
        let spec = table.spec();
        let columns: Vec<usize> = if config.columns.is_empty() {
            (0..spec.columns().len()).collect()
        } else {
            config.columns.iter().map(|n| spec.column_index(n)).collect::<gear_core::Result<_>>()?
        };
        let window = if config.random_start { RandomStarts::window(config.window) } else { config.window };
        let layout = BatchLayout::new(table.shared.region.layout(), &columns, config.batch_size, window)?;
        let meta = BatchMeta::new(spec, &columns, config.batch_size);
        let selection = table.selection();
        let random_starts = config.random_start.then(|| RandomStarts::new(selection.seed));
        let n = config.batch_size;
        let draws = Draws {
            step_bytes: layout.step_bytes().iter().sum(),
            layout,
            timeout: config.timeout,
            deadline: None,
            draws: Vec::with_capacity(n),
            redraws: Vec::new(),
            rows: Vec::with_capacity(n),
            torn: Vec::new(),
            missing: Vec::new(),
            checked: None,
            redrawn: 0,
            selection,
            random_starts,
            items_per_slot: table.shared.items_per_slot,
        };
        Ok((draws, meta))
    }

    /// Draws one batch and has `copy` fill it. Waits (up to the timeout)
    /// while the table is empty or the rate limiter holds samplers back.
    /// Rows whose trajectory was evicted and overwritten during the copy are
    /// redrawn, so a returned batch never mixes two trajectories in a row.
    pub(crate) fn sample<C: Collector>(
        &mut self,
        table: &ReplayTable,
        copy: &mut Gather<'_, C>,
        meta: &mut BatchMeta,
    ) -> Result<()> {
        let timeout = self.timeout;
        self.start(table, copy, timeout)?;
        self.finish(table, copy, meta)
    }

    /// The first half of [`Draws::sample`], for samplers that pipeline:
    /// draws a batch (waiting up to `timeout` for the rate limiter) and has
    /// `copy` start gathering it; [`Draws::finish`] must follow, with the
    /// same `copy`, before the next `start`. On an error nothing is left
    /// pending.
    pub(crate) fn start<C: Collector>(
        &mut self,
        table: &ReplayTable,
        copy: &mut Gather<'_, C>,
        timeout: Option<Duration>,
    ) -> Result<()> {
        self.draws.clear();
        self.missing.clear();
        self.checked = None;
        self.selection.retiring.clear();
        let result = self.draw_and_start(table, copy, timeout);
        if result.is_err() {
            self.settle_and_retire(table, copy);
        }
        result
    }

    /// The second half: validates the rows once `copy` has finished reading
    /// them (after [`Collector::settle`]), redraws and regathers
    /// torn rows, frees retiring rows and fills `meta`.
    pub(crate) fn finish<C: Collector>(
        &mut self,
        table: &ReplayTable,
        copy: &mut Gather<'_, C>,
        meta: &mut BatchMeta,
    ) -> Result<()> {
        let result = copy.settle().and_then(|()| self.validate(table, copy));
        if result.is_err() {
            self.settle_and_retire(table, copy);
            return result;
        }
        // Rows retired by max_times_sampled are freed only after the copy.
        table.retire(&self.selection.retiring);
        self.selection.retiring.clear();
        meta.keys.clear();
        meta.probabilities.clear();
        meta.weights.clear();
        meta.starts.clear();
        let window = self.layout.window();
        for (d, row) in self.draws.iter().zip(&self.rows) {
            meta.keys.push(d.sampled.key);
            meta.probabilities.push(d.sampled.probability);
            meta.weights.push(d.sampled.weight);
            meta.starts.push(row.resolve(&window).src_step);
        }
        let bytes = copy.valid_steps() * self.step_bytes;
        table.shared.region.control().bytes_gathered.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// After an error: a copy may still be reading rows about to be freed.
    fn settle_and_retire<C: Collector>(&mut self, table: &ReplayTable, copy: &mut Gather<'_, C>) {
        if !self.selection.retiring.is_empty() {
            let _ = copy.settle();
        }
        table.retire(&self.selection.retiring);
        self.selection.retiring.clear();
    }

    fn draw_and_start<C: Collector>(
        &mut self,
        table: &ReplayTable,
        copy: &mut Gather<'_, C>,
        timeout: Option<Duration>,
    ) -> Result<()> {
        let n = self.layout.rows();
        // One deadline for the whole call: the first draw, and redraws of
        // rows overwritten during the copy (in `validate`).
        self.deadline = timeout.map(|t| Instant::now() + t);
        table.select(n, self.deadline, true, &mut self.selection, &mut self.draws)?;
        self.rows.clear();
        for r in 0..n {
            let d = self.draws[r];
            let row = self.row(&d);
            self.rows.push(row);
        }
        copy.all(&self.layout, &self.rows)
    }

    fn validate<C: Collector>(&mut self, table: &ReplayTable, copy: &mut Gather<'_, C>) -> Result<()> {
        let n = self.layout.rows();
        let slots = table.shared.region.slots();
        let items = table.shared.region.items();
        let missing = std::mem::take(&mut self.missing);
        let checked = self.checked.take().filter(|c| c.len() == n);
        for attempt in 1..=MAX_COPY_ATTEMPTS {
            self.torn.clear();
            let draws = &self.draws;
            let per_slot = table.shared.items_per_slot;
            // The trajectory's generation, then (in a table with items) the
            // item's: a row is kept only if both are still the ones it was
            // drawn with.
            let valid = |r: usize| {
                let (d, key) = (&draws[r], draws[r].sampled.key);
                let trajectory = d.trajectory(per_slot);
                slots.get(trajectory.slot as usize).is_some_and(|rec| rec.read_validate(trajectory))
                    && (items.is_empty()
                        || !key.is_item()
                        || items.get(key.slot as usize).is_some_and(|rec| rec.read_validate(key)))
            };
            let missed = |r: usize| missing.binary_search(&r).is_ok();
            self.torn.extend((0..n).filter(|&r| match (attempt, &checked) {
                (1, Some(c)) => !c[r] || missed(r),
                (1, None) => missed(r) || !valid(r),
                _ => !valid(r),
            }));
            if self.torn.is_empty() {
                return Ok(());
            }
            self.redrawn += self.torn.len() as u64;
            if attempt == MAX_COPY_ATTEMPTS {
                break;
            }
            self.redraws.clear();
            table.select(self.torn.len(), self.deadline, false, &mut self.selection, &mut self.redraws)?;
            for i in 0..self.torn.len().min(self.redraws.len()) {
                let (r, d) = (self.torn[i], self.redraws[i]);
                self.draws[r] = d;
                self.rows[r] = self.row(&d);
            }
            copy.again(&self.layout, &self.rows, &self.torn)?;
        }
        Err(Error::Torn { attempts: MAX_COPY_ATTEMPTS })
    }

    /// This sampler's seed (other streams of the sampler derive from it).
    pub(crate) fn seed(&self) -> u64 {
        self.selection.seed
    }

    /// Takes over a batch drawn, admitted and being gathered elsewhere (on
    /// a device) in place of [`Draws::start`]: row `r` is `drawn[r]`, its
    /// draw and the stored length its gather used, or `None` when nothing
    /// was drawn for it. [`Draws::finish`] then validates it as a host
    /// draw, redrawing here (and regathering) torn rows, rows drawn by
    /// nothing and rows whose key was no longer readable when adopted;
    /// redraws share `deadline`. Counts one sample of each readable row.
    pub(crate) fn adopt(
        &mut self,
        table: &ReplayTable,
        deadline: Option<Instant>,
        drawn: impl ExactSizeIterator<Item = Option<(gear_core::Sampled, u64)>>,
        checked: Option<Vec<bool>>,
    ) -> Result<()> {
        let n = self.layout.rows();
        if drawn.len() != n {
            return Err(Error::Config(format!("{} rows adopted for a batch of {n}", drawn.len())));
        }
        self.deadline = deadline;
        self.draws.clear();
        self.rows.clear();
        self.missing.clear();
        self.selection.retiring.clear();
        let checked = checked.filter(|c| c.len() == n);
        let slots = table.shared.region.slots();
        for (r, d) in drawn.enumerate() {
            // A row the copy-time check passed keeps its draw even if its
            // slot was reused since: its bytes were read before.
            let readable = d.filter(|(s, _)| {
                let rec = slots.get(s.key.slot as usize);
                match &checked {
                    Some(c) => c[r] && rec.is_some(),
                    None => rec.is_some_and(|rec| rec.read_begin(s.key).is_some()),
                }
            });
            if let Some((s, _)) = readable {
                let rec = &slots[s.key.slot as usize];
                if rec.read_begin(s.key).is_some() {
                    rec.add_sampled();
                }
            }
            let (s, len) = readable.unwrap_or_else(|| {
                self.missing.push(r);
                (gear_core::Sampled { key: SlotKey { slot: 0, generation: 0 }, probability: 0.0, weight: 0.0 }, 0)
            });
            self.draws.push(Drawn::whole(s, len));
            self.rows.push(GatherRow::whole(s.key.slot, len));
        }
        // The copy-time check is spent: missing rows are redrawn, the
        // others passed it.
        self.checked = checked.map(|_| vec![true; n]);
        Ok(())
    }

    /// The trajectory each row of the batch being drawn reads, in row
    /// order (for a check of their slots when the copy completes; in a
    /// table with items, an item's trajectory).
    pub(crate) fn keys(&self) -> Vec<SlotKey> {
        self.draws.iter().map(|d| d.trajectory(self.items_per_slot)).collect()
    }

    /// Per row, whether its slot held the drawn key when the copy
    /// completed (checked on the device's stream right after the gather):
    /// [`Draws::finish`]'s first validation uses it.
    pub(crate) fn checked_at_copy(&mut self, valid: Vec<bool>) {
        self.checked = Some(valid);
    }

    /// Restarts the deadline that redraws of the batch in flight share
    /// from now (a prefetched batch was started with no time to wait; the
    /// call that finishes it brings its own).
    pub(crate) fn rearm_deadline(&mut self) {
        self.deadline = self.timeout.map(|t| Instant::now() + t);
    }

    /// The gather row of a drawn row (a trajectory of `len` published
    /// steps, or an item's window): with random starts, cut at a random
    /// point so that the window (its last `window.len` steps) starts
    /// uniformly at random inside it.
    fn row(&mut self, d: &Drawn) -> GatherRow {
        let l = self.layout.window().len;
        let len = match &mut self.random_starts {
            Some(starts) => starts.cut(d.len, l),
            None => d.len,
        };
        let slot = if self.items_per_slot == 0 { d.sampled.key.slot } else { d.trajectory(self.items_per_slot).slot };
        GatherRow { slot, start: d.start, len }
    }
}

/// The per-row metadata every batch type carries in a `meta: BatchMeta`
/// field (or a reference to one): rows, keys, probabilities, weights and
/// window starts, written once for [`SampledBatch`], [`SampledRows`] and the
/// CUDA sampler's batch.
macro_rules! row_metadata {
    () => {
        /// Rows in the batch.
        pub fn rows(&self) -> usize {
            self.meta.keys.len()
        }

        /// The key of each row (for priority updates).
        pub fn keys(&self) -> &[gear_core::SlotKey] {
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

        /// For each row, the stored step its first copied step came from
        /// (the window's start; 0 for a row with no steps).
        pub fn starts(&self) -> &[u64] {
            &self.meta.starts
        }
    };
}
// The device sampler uses it from another module.
pub(crate) use row_metadata;

/// One sampled batch: per column a `[rows, window, *shape]` buffer, the
/// valid length of each row, and per row the key, probability and
/// importance weight.
#[derive(Debug)]
pub struct SampledBatch {
    host: gear_cpu::HostBatch,
    meta: BatchMeta,
}

/// One column of a batch.
#[derive(Clone, Copy, Debug)]
pub struct ColumnBatch<'a> {
    /// Column name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Per-step shape (the buffer is `[rows, window, *shape]`).
    pub step_shape: &'a [u64],
    /// The bytes.
    pub bytes: &'a [u8],
}

impl<'a> ColumnBatch<'a> {
    /// The buffer as typed elements; the type must match the dtype.
    pub fn as_slice<T: Element>(&self) -> Result<&'a [T]> {
        if T::DTYPE != self.dtype {
            return Err(Error::Config(format!("column `{}` holds {}, not {}", self.name, self.dtype, T::DTYPE)));
        }
        // A `bool` may only hold 0 or 1; the bytes may come from another
        // process, so check them rather than trust them.
        if T::DTYPE == DType::Bool {
            if let Some(i) = self.bytes.iter().position(|&b| b > 1) {
                return Err(Error::Integrity(format!(
                    "column `{}` byte {i} is {}, not a bool (0 or 1)",
                    self.name, self.bytes[i]
                )));
            }
        }
        gear_core::from_bytes(self.bytes)
            .ok_or_else(|| Error::Config(format!("column `{}` buffer is not aligned for {}", self.name, T::DTYPE)))
    }
}

impl SampledBatch {
    row_metadata!();

    /// The column named `name`.
    pub fn column(&self, name: &str) -> Result<ColumnBatch<'_>> {
        Ok(self.column_at(self.meta.index(name)?))
    }

    /// The `i`-th requested column.
    pub fn column_at(&self, i: usize) -> ColumnBatch<'_> {
        let m = &self.meta;
        ColumnBatch { name: &m.names[i], dtype: m.dtypes[i], step_shape: &m.shapes[i], bytes: self.host.column(i) }
    }

    /// Valid steps of each row.
    pub fn lengths(&self) -> &[u64] {
        self.host.lengths()
    }

    /// The batch layout (columns, rows, window).
    pub fn layout(&self) -> &BatchLayout {
        self.host.layout()
    }
}

/// What [`Sampler::sample_into`] tells about the rows it wrote: per row the
/// valid length, key, probability, weight and start.
#[derive(Clone, Copy, Debug)]
pub struct SampledRows<'a> {
    meta: &'a BatchMeta,
    lengths: &'a [u64],
}

impl<'a> SampledRows<'a> {
    row_metadata!();

    /// Valid steps of each row.
    pub fn lengths(&self) -> &'a [u64] {
        self.lengths
    }
}

/// Draws batches from one table into host memory.
#[derive(Debug)]
pub struct Sampler {
    table: ReplayTable,
    batch: SampledBatch,
    draws: Draws,
    /// Row lengths of the last [`Sampler::sample_into`].
    into_lengths: Vec<u64>,
}

impl Sampler {
    pub(crate) fn new(table: ReplayTable, config: SampleConfig) -> Result<Self> {
        let (draws, meta) = Draws::new(&table, &config)?;
        // Allocated by the first `sample`: a sampler used only through
        // `sample_into` (the shard server's) never maps a batch of its own.
        let host = gear_cpu::HostBatch::deferred(&draws.layout);
        let into_lengths = vec![0; draws.layout.rows()];
        Ok(Sampler { table, batch: SampledBatch { host, meta }, draws, into_lengths })
    }

    /// The layout of every batch this sampler draws: requested columns,
    /// rows, window, and the bytes of each column
    /// ([`BatchLayout::column_bytes`]), which size the buffers
    /// [`Sampler::sample_into`] takes.
    pub fn layout(&self) -> &BatchLayout {
        &self.draws.layout
    }

    /// [`Sampler::sample`] straight into caller-owned buffers (a pinned
    /// staging area, a tensor's storage), saving the copy out of the
    /// sampler's own batch. `columns[i]` receives requested column `i` as
    /// `[rows, window.len, *shape]` in its first
    /// `layout().column_bytes(i)` bytes (any bytes past them are left
    /// alone); padding is zeroed as in a [`SampledBatch`]. Buffers of the
    /// wrong count or too small are refused before anything is drawn.
    pub fn sample_into(&mut self, columns: &mut [&mut [u8]]) -> Result<SampledRows<'_>> {
        let mut views: Vec<&mut [MaybeUninit<u8>]> = columns
            .iter_mut()
            .map(|c| {
                // SAFETY: `MaybeUninit<u8>` has `u8`'s size and alignment,
                // the borrow carries over, and the collector writes only
                // initialised bytes (`CallerBatch`'s contract), so the
                // caller's buffers stay initialised.
                unsafe { std::slice::from_raw_parts_mut(c.as_mut_ptr().cast::<MaybeUninit<u8>>(), c.len()) }
            })
            .collect();
        self.sample_into_uninit(&mut views)
    }

    /// [`Sampler::sample_into`] into buffers that may be uninitialised (a
    /// network encode buffer's spare capacity, say): when it returns `Ok`,
    /// every byte of each column's first `layout().column_bytes(i)` has
    /// been written, padding included; on an error, any of them may not
    /// have been.
    pub fn sample_into_uninit(&mut self, columns: &mut [&mut [MaybeUninit<u8>]]) -> Result<SampledRows<'_>> {
        // Before drawing: a refused call must not count samples or retire
        // rows.
        gear_cpu::check_column_buffers(&self.draws.layout, columns)?;
        let sh = &*self.table.shared;
        let collector = sh.collector.into_caller_buffers();
        let mut batch = gear_cpu::CallerBatch { columns, lengths: &mut self.into_lengths };
        let mut copy = Gather { collector: &collector, view: sh.region.view(), batch: &mut batch };
        self.draws.sample(&self.table, &mut copy, &mut self.batch.meta)?;
        Ok(SampledRows { meta: &self.batch.meta, lengths: &self.into_lengths })
    }

    /// Draws and gathers one batch. Waits (up to the timeout) while the
    /// table is empty or the rate limiter holds samplers back. Rows whose
    /// trajectory was evicted and overwritten during the copy are redrawn,
    /// so a returned batch never mixes two trajectories in a row.
    pub fn sample(&mut self) -> Result<&SampledBatch> {
        // Before drawing: a batch that cannot be allocated must not count
        // samples or retire rows.
        self.batch.host.allocate().map_err(Error::from_collector)?;
        let sh = &*self.table.shared;
        let mut copy = Gather { collector: &sh.collector, view: sh.region.view(), batch: &mut self.batch.host };
        self.draws.sample(&self.table, &mut copy, &mut self.batch.meta)?;
        Ok(&self.batch)
    }

    /// The table this sampler draws from.
    pub fn table(&self) -> &ReplayTable {
        &self.table
    }
}
