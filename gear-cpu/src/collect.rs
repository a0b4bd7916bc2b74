//! The CPU collector: one `memcpy` per (row, column) window from a table's
//! host-addressable data area into host batch buffers, rows split across
//! threads for large batches.
//!
//! Output contract (gear-core `collect` module): for each requested column
//! one contiguous buffer `[rows, window.len, *shape]`; the copied steps of
//! row `r` sit where [`WindowSpec::resolve`](gear_core::WindowSpec::resolve)
//! says, every other byte is zero, and `lengths[r]` is the number of copied
//! steps. Only the padding around each window is zeroed, so a reused buffer
//! is written exactly once per byte.
//!
//! The collector does not check slot generations: the table layer validates
//! the copies with its seqlock after `gather` returns.

use crate::raw::{as_uninit, AlignedBytes, SharedBytes};
use gear_core::{BatchLayout, Collector, Error, GatherRow, Layout, Result, TableView};
use std::mem::MaybeUninit;

/// Alignment of every [`HostBatch`] column buffer (a cache line, and enough
/// for any dtype and for SIMD loads).
pub const BATCH_ALIGN: usize = 64;
/// Default least number of batch bytes one thread copies: a batch of `B`
/// bytes uses `min(threads, rows, B / this)` threads, so batches under
/// 2 MiB stay on the calling thread. On a 2-core EPYC VM, with source rows
/// not in cache, two threads beat one from about 2 MiB on; below that the
/// cost of spawning (tens of microseconds) outweighs the copy it shares.
pub const DEFAULT_BYTES_PER_THREAD: u64 = 1 << 20;

/// Shares of a batch's rows per gathering thread (when there are rows
/// enough), so that threads balance their work while copying.
const SHARES_PER_THREAD: usize = 4;

/// A collector that copies with the CPU. Cheap to clone; holds no threads
/// (scoped threads are spawned per large gather).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuCollector {
    /// Most threads per gather, at least 1.
    threads: usize,
    /// Least batch bytes per thread; 0 means split whenever possible.
    bytes_per_thread: u64,
}

impl Default for CpuCollector {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuCollector {
    /// A collector using up to every core `available_parallelism` reports,
    /// at least [`DEFAULT_BYTES_PER_THREAD`] bytes per thread.
    pub fn new() -> Self {
        Self::with_threads(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// A collector using at most `threads` threads per gather (0 counts
    /// as 1; 1 never spawns).
    pub fn with_threads(threads: usize) -> Self {
        CpuCollector { threads: threads.max(1), bytes_per_thread: DEFAULT_BYTES_PER_THREAD }
    }

    /// Gives each thread at least `bytes` of the batch (rows are not split,
    /// so a thread gets whole rows). 0 splits every batch of several rows
    /// across all threads.
    pub fn with_bytes_per_thread(mut self, bytes: u64) -> Self {
        self.bytes_per_thread = bytes;
        self
    }

    /// Most threads one gather uses.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Least batch bytes per thread.
    pub fn bytes_per_thread(&self) -> u64 {
        self.bytes_per_thread
    }

    /// Threads a gather of `layout` uses.
    pub fn threads_for(&self, layout: &BatchLayout) -> usize {
        let by_size = layout.total_bytes().checked_div(self.bytes_per_thread).unwrap_or(u64::MAX);
        let by_size = usize::try_from(by_size).unwrap_or(usize::MAX);
        self.threads.min(layout.rows()).min(by_size).max(1)
    }
}

/// Host batch buffers: one 64-byte-aligned buffer per requested column,
/// laid out `[rows, window.len, *shape]`, plus each row's valid length.
pub struct HostBatch {
    /// The layout of the last gather (or of the allocation).
    layout: BatchLayout,
    /// Invariant: `buffers.len() == layout.columns().len()` and
    /// `buffers[i].len() >= layout.column_bytes(i)`; bytes past that are
    /// not part of the batch. Empty while deferred
    /// ([`HostBatch::deferred`]): the first gather allocates them.
    buffers: Vec<AlignedBytes>,
    /// Invariant: `lengths.len() == layout.rows()`.
    lengths: Vec<u64>,
}

impl HostBatch {
    /// Allocates zeroed buffers for `layout`.
    pub fn new(layout: &BatchLayout) -> Result<Self> {
        let buffers = (0..layout.columns().len())
            .map(|i| {
                let bytes = layout.column_bytes(i);
                // `BatchLayout::new` checked that the total fits a usize.
                let len = usize::try_from(bytes).map_err(|_| Error::SizeOverflow("batch column bytes".into()))?;
                AlignedBytes::zeroed(len, BATCH_ALIGN).map_err(|f| {
                    Error::Region(format!("cannot allocate {bytes} bytes for batch column {i}: {}", f.reason()))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(HostBatch { layout: layout.clone(), buffers, lengths: vec![0; layout.rows()] })
    }

    /// A batch for `layout` whose buffers are allocated by its first
    /// gather, not now: for an owner that may never gather into it (a
    /// sampler used only with caller-owned buffers), which then never pays
    /// for mapping and faulting in memory it does not touch. Until that
    /// gather it has no columns ([`HostBatch::columns`] is 0).
    pub fn deferred(layout: &BatchLayout) -> Self {
        HostBatch { layout: layout.clone(), buffers: Vec::new(), lengths: vec![0; layout.rows()] }
    }

    /// Allocates a deferred batch's buffers for its layout now (nothing to
    /// do for one already allocated): for an owner that must not find out
    /// memory is short only after it has drawn rows.
    pub fn allocate(&mut self) -> Result<()> {
        if self.is_deferred() {
            *self = HostBatch::new(&self.layout)?;
        }
        Ok(())
    }

    /// Whether the buffers are still to be allocated ([`HostBatch::deferred`]).
    fn is_deferred(&self) -> bool {
        self.buffers.is_empty() && !self.layout.columns().is_empty()
    }

    /// The layout of the batch now held.
    pub fn layout(&self) -> &BatchLayout {
        &self.layout
    }

    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.layout.rows()
    }

    /// Number of requested columns.
    pub fn columns(&self) -> usize {
        self.buffers.len()
    }

    /// The bytes of the `i`-th requested column, `[rows, window.len,
    /// *shape]`. Panics if `i >= self.columns()`.
    pub fn column(&self, i: usize) -> &[u8] {
        &self.buffers[i].as_slice()[..self.column_len(i)]
    }

    /// The bytes of the `i`-th requested column, mutably (to hand the
    /// buffer to a consumer that writes in place). Panics if
    /// `i >= self.columns()`.
    pub fn column_mut(&mut self, i: usize) -> &mut [u8] {
        let n = self.column_len(i);
        &mut self.buffers[i].as_mut_slice()[..n]
    }

    /// The `i`-th column as elements of `T`, or `None` when its bytes per
    /// step are not a multiple of `T`'s size (or, for `bool`, when a byte
    /// is neither 0 nor 1). Panics if `i >= self.columns()`.
    pub fn column_as<T: gear_core::Element>(&self, i: usize) -> Option<&[T]> {
        if !self.layout.step_bytes()[i].is_multiple_of(std::mem::size_of::<T>() as u64) {
            return None;
        }
        gear_core::from_bytes(self.column(i))
    }

    /// The bytes of row `r` of the `i`-th column, `[window.len, *shape]`.
    /// Panics if `i` or `r` is out of range.
    pub fn row(&self, i: usize, r: usize) -> &[u8] {
        assert!(r < self.layout.rows(), "row {r} out of range: the batch has {} rows", self.layout.rows());
        let n = self.layout.row_bytes(i) as usize;
        &self.column(i)[r * n..(r + 1) * n]
    }

    /// Valid steps of each row.
    pub fn lengths(&self) -> &[u64] {
        &self.lengths
    }

    fn column_len(&self, i: usize) -> usize {
        self.layout.column_bytes(i) as usize
    }

    /// Makes the buffers hold a batch of `layout`, reusing them when they
    /// are large enough (allocating them when deferred).
    fn prepare(&mut self, layout: &BatchLayout) -> Result<()> {
        if self.is_deferred() {
            *self = HostBatch::new(layout)?;
            return Ok(());
        }
        if self.buffers.len() != layout.columns().len() {
            return Err(Error::InvalidWindow(format!(
                "the batch buffers hold {} columns, the layout asks for {}",
                self.buffers.len(),
                layout.columns().len()
            )));
        }
        for (i, b) in self.buffers.iter().enumerate() {
            let needed = layout.column_bytes(i);
            if (b.len() as u64) < needed {
                return Err(Error::BufferTooSmall { what: format!("batch column {i}"), needed, got: b.len() as u64 });
            }
        }
        if self.layout != *layout {
            self.layout.clone_from(layout);
        }
        self.lengths.resize(layout.rows(), 0);
        Ok(())
    }
}

impl std::fmt::Debug for HostBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBatch").field("layout", &self.layout).field("lengths", &self.lengths).finish()
    }
}

fn no_host_address() -> Error {
    Error::Unsupported("the cpu collector reads host memory, and this table has no host address")
}

/// Checks everything `gather` relies on, before any byte is written.
fn validate(table: &Layout, rows: &[GatherRow], layout: &BatchLayout) -> Result<()> {
    // A BatchLayout is consistent and its sizes fit `usize` by construction;
    // what remains to check is that it was made for a table like this one.
    layout.window().validate(table.max_len())?;
    for (&c, &s) in layout.columns().iter().zip(layout.step_bytes()) {
        if c >= table.columns() {
            return Err(Error::ColumnIndex { index: c, count: table.columns() });
        }
        if s != table.step_bytes(c) {
            return Err(Error::StepSize { column: format!("#{c}"), got: s, expected: table.step_bytes(c) });
        }
    }
    if rows.len() != layout.rows() {
        return Err(Error::InvalidWindow(format!("{} rows given, the batch layout has {}", rows.len(), layout.rows())));
    }
    for (r, row) in rows.iter().enumerate() {
        table.check_slot(u64::from(row.slot))?;
        row.check_len(r, table.max_len())?;
    }
    Ok(())
}

/// Gathers `rows` into the matching rows of `out` (one slice per column,
/// each exactly `rows.len()` rows long) and `lengths`.
fn gather_rows(
    src: &SharedBytes<'_>,
    table: &Layout,
    layout: &BatchLayout,
    rows: &[GatherRow],
    out: &mut [&mut [MaybeUninit<u8>]],
    lengths: &mut [u64],
) {
    let window = layout.window();
    let l = window.len as usize;
    let stride = table.slot_stride();
    // Per requested column: where it starts inside a slot, bytes per step.
    let columns: Vec<(u64, usize)> =
        layout.columns().iter().zip(layout.step_bytes()).map(|(&c, &s)| (table.offset(0, c, 0), s as usize)).collect();
    // Rows sit at random places in the table: start loading the first line
    // of every window before copying any, so the misses overlap. (Longer
    // windows continue sequentially, where the hardware prefetcher helps.)
    // Small rows keep several columns on one line: ask for it once.
    for row in rows {
        let w = row.resolve(&window);
        if w.steps > 0 {
            let mut last_line = u64::MAX;
            for &(base, s) in &columns {
                let at = u64::from(row.slot) * stride + base + w.src_step * s as u64;
                if at / 64 != last_line {
                    src.prefetch(at as usize);
                    last_line = at / 64;
                }
            }
        }
    }
    for (r, (row, len)) in rows.iter().zip(lengths.iter_mut()).enumerate() {
        let w = row.resolve(&window);
        *len = w.steps;
        let first = u64::from(row.slot) * stride;
        for (&(base, s), buf) in columns.iter().zip(out.iter_mut()) {
            let dst = &mut buf[r * l * s..(r + 1) * l * s];
            // Validated: slot < capacity and src_step + steps <= start + len <= T.
            let at = (first + base + w.src_step * s as u64) as usize;
            if w.steps as usize == l {
                // A full row, the common case: one copy, no padding.
                src.copy_to(at, dst);
                continue;
            }
            let (head, rest) = dst.split_at_mut(w.dst_step as usize * s);
            let (data, tail) = rest.split_at_mut(w.steps as usize * s);
            head.fill(MaybeUninit::new(0));
            tail.fill(MaybeUninit::new(0));
            if !data.is_empty() {
                src.copy_to(at, data);
            }
        }
    }
}

/// Checks caller-owned column buffers against a batch layout: one buffer
/// per requested column, each at least the column's batch bytes
/// ([`BatchLayout::column_bytes`]). [`CpuCollector::gather_into`] checks
/// this itself; callers with state to protect check first.
pub fn check_column_buffers<T>(layout: &BatchLayout, columns: &[&mut [T]]) -> Result<()> {
    if columns.len() != layout.columns().len() {
        return Err(Error::InvalidWindow(format!(
            "{} column buffers given, the batch layout has {} columns",
            columns.len(),
            layout.columns().len()
        )));
    }
    for (i, c) in columns.iter().enumerate() {
        let needed = layout.column_bytes(i);
        if (c.len() as u64) < needed {
            return Err(Error::BufferTooSmall { what: format!("batch column {i}"), needed, got: c.len() as u64 });
        }
    }
    Ok(())
}

/// [`check_column_buffers`], and one length per row.
fn check_out<T>(layout: &BatchLayout, columns: &[&mut [T]], lengths: &[u64]) -> Result<()> {
    check_column_buffers(layout, columns)?;
    if lengths.len() != layout.rows() {
        return Err(Error::InvalidWindow(format!(
            "{} row lengths given, the batch layout has {} rows",
            lengths.len(),
            layout.rows()
        )));
    }
    Ok(())
}

fn check_which(which: &[usize], rows: usize) -> Result<()> {
    match which.iter().find(|&&r| r >= rows) {
        Some(&r) => {
            Err(Error::InvalidWindow(format!("row {r} to gather again is out of range: the batch has {rows} rows")))
        }
        None => Ok(()),
    }
}

impl CpuCollector {
    /// Gathers `rows` straight into caller-owned buffers (a pinned staging
    /// area, a tensor's storage), with the same output contract as
    /// [`Collector::gather`]: `columns[i]` receives requested column `i` as
    /// `[rows, window.len, *shape]` in its first
    /// [`BatchLayout::column_bytes`] bytes (bytes past them are left
    /// alone), and `lengths[r]` row `r`'s copied steps. Everything is
    /// checked before a byte is written.
    pub fn gather_into(
        &self,
        src: &TableView<'_>,
        rows: &[GatherRow],
        layout: &BatchLayout,
        columns: &mut [&mut [u8]],
        lengths: &mut [u64],
    ) -> Result<()> {
        // SAFETY: the gather writes copies of table bytes and zeros only.
        let mut views: Vec<&mut [MaybeUninit<u8>]> = columns.iter_mut().map(|c| unsafe { as_uninit(c) }).collect();
        self.gather_into_uninit(src, rows, layout, &mut views, lengths)
    }

    /// [`CpuCollector::gather_into`] into buffers that may be
    /// uninitialised: on success every byte of each column's first
    /// [`BatchLayout::column_bytes`] bytes has been written.
    pub(crate) fn gather_into_uninit(
        &self,
        src: &TableView<'_>,
        rows: &[GatherRow],
        layout: &BatchLayout,
        columns: &mut [&mut [MaybeUninit<u8>]],
        lengths: &mut [u64],
    ) -> Result<()> {
        let bytes = SharedBytes::of_view(src).ok_or_else(no_host_address)?;
        validate(src.layout(), rows, layout)?;
        check_out(layout, columns, lengths)?;
        self.gather_checked(&bytes, src.layout(), rows, layout, columns, lengths);
        Ok(())
    }

    /// [`CpuCollector::gather_into`] once `validate` and `check_out` passed.
    fn gather_checked(
        &self,
        bytes: &SharedBytes<'_>,
        table_layout: &Layout,
        rows: &[GatherRow],
        layout: &BatchLayout,
        columns: &mut [&mut [MaybeUninit<u8>]],
        lengths: &mut [u64],
    ) {
        let mut cols: Vec<&mut [MaybeUninit<u8>]> =
            columns.iter_mut().enumerate().map(|(i, c)| &mut c[..layout.column_bytes(i) as usize]).collect();
        let threads = self.threads_for(layout);
        if threads <= 1 {
            gather_rows(bytes, table_layout, layout, rows, &mut cols, lengths);
            return;
        }
        // Shares of rows in a queue that the spawned threads and this one
        // drain, several per thread: a thread that starts late or loses its
        // core for a while (a busy or shared machine) leaves its shares to
        // the others instead of making every thread wait for its half. If a
        // thread cannot be spawned, the others take its shares too.
        let per = rows.len().div_ceil(threads * SHARES_PER_THREAD);
        let row_bytes: Vec<usize> = (0..cols.len()).map(|i| layout.row_bytes(i) as usize).collect();
        let mut shares = Vec::with_capacity(threads);
        let (mut rows_left, mut lens_left) = (rows, lengths);
        while !rows_left.is_empty() {
            let n = per.min(rows_left.len());
            let (rows_now, rows_rest) = rows_left.split_at(n);
            let (lens_now, lens_rest) = std::mem::take(&mut lens_left).split_at_mut(n);
            let mut cols_now = Vec::with_capacity(cols.len());
            for (c, rb) in cols.iter_mut().zip(&row_bytes) {
                let (now, rest) = std::mem::take(c).split_at_mut(n * rb);
                cols_now.push(now);
                *c = rest;
            }
            shares.push(Share { rows: rows_now, cols: cols_now, lengths: lens_now });
            (rows_left, lens_left) = (rows_rest, lens_rest);
        }
        let queue = std::sync::Mutex::new(shares);
        let work = || loop {
            let share = queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner).pop();
            let Some(mut share) = share else { break };
            gather_rows(bytes, table_layout, layout, share.rows, &mut share.cols, share.lengths);
        };
        std::thread::scope(|scope| {
            for _ in 1..threads {
                if std::thread::Builder::new().name("gear-cpu-gather".into()).spawn_scoped(scope, work).is_err() {
                    break;
                }
            }
            work();
        });
    }

    /// [`Collector::regather`] into caller-owned buffers: copies again the
    /// rows listed in `which`, as [`CpuCollector::gather_into`] would.
    pub fn regather_into(
        &self,
        src: &TableView<'_>,
        rows: &[GatherRow],
        layout: &BatchLayout,
        which: &[usize],
        columns: &mut [&mut [u8]],
        lengths: &mut [u64],
    ) -> Result<()> {
        // SAFETY: the gather writes copies of table bytes and zeros only.
        let mut views: Vec<&mut [MaybeUninit<u8>]> = columns.iter_mut().map(|c| unsafe { as_uninit(c) }).collect();
        self.regather_into_uninit(src, rows, layout, which, &mut views, lengths)
    }

    /// [`CpuCollector::regather_into`] into buffers that may be
    /// uninitialised (the rows in `which` are written whole).
    pub(crate) fn regather_into_uninit(
        &self,
        src: &TableView<'_>,
        rows: &[GatherRow],
        layout: &BatchLayout,
        which: &[usize],
        columns: &mut [&mut [MaybeUninit<u8>]],
        lengths: &mut [u64],
    ) -> Result<()> {
        let bytes = SharedBytes::of_view(src).ok_or_else(no_host_address)?;
        validate(src.layout(), rows, layout)?;
        check_which(which, rows.len())?;
        check_out(layout, columns, lengths)?;
        regather_checked(&bytes, src.layout(), rows, layout, which, columns, lengths);
        Ok(())
    }
}

/// [`CpuCollector::regather_into`] once every check passed.
fn regather_checked(
    bytes: &SharedBytes<'_>,
    table_layout: &Layout,
    rows: &[GatherRow],
    layout: &BatchLayout,
    which: &[usize],
    columns: &mut [&mut [MaybeUninit<u8>]],
    lengths: &mut [u64],
) {
    for &r in which {
        let mut cols: Vec<&mut [MaybeUninit<u8>]> = columns
            .iter_mut()
            .enumerate()
            .map(|(i, c)| {
                let n = layout.row_bytes(i) as usize;
                &mut c[r * n..(r + 1) * n]
            })
            .collect();
        gather_rows(bytes, table_layout, layout, &rows[r..=r], &mut cols, &mut lengths[r..=r]);
    }
}

impl HostBatch {
    /// The column buffers and row lengths, for the gathers.
    fn parts(&mut self) -> (Vec<&mut [MaybeUninit<u8>]>, &mut [u64]) {
        let HostBatch { buffers, lengths, .. } = self;
        // SAFETY: the gathers write copies of table bytes and zeros only.
        (buffers.iter_mut().map(|b| unsafe { as_uninit(b.as_mut_slice()) }).collect(), lengths)
    }
}

impl Collector for CpuCollector {
    type Batch = HostBatch;
    type Error = Error;

    fn alloc_batch(&self, layout: &BatchLayout) -> Result<HostBatch> {
        HostBatch::new(layout)
    }

    fn gather(&self, src: &TableView<'_>, rows: &[GatherRow], layout: &BatchLayout, out: &mut HostBatch) -> Result<()> {
        let bytes = SharedBytes::of_view(src).ok_or_else(no_host_address)?;
        validate(src.layout(), rows, layout)?;
        // `prepare` sizes the buffers and lengths for the layout, which is
        // what `check_out` would check.
        out.prepare(layout)?;
        let (mut cols, lengths) = out.parts();
        self.gather_checked(&bytes, src.layout(), rows, layout, &mut cols, lengths);
        Ok(())
    }

    fn regather(
        &self,
        src: &TableView<'_>,
        rows: &[GatherRow],
        layout: &BatchLayout,
        which: &[usize],
        out: &mut HostBatch,
    ) -> Result<()> {
        let bytes = SharedBytes::of_view(src).ok_or_else(no_host_address)?;
        validate(src.layout(), rows, layout)?;
        check_which(which, rows.len())?;
        out.prepare(layout)?;
        let (mut cols, lengths) = out.parts();
        regather_checked(&bytes, src.layout(), rows, layout, which, &mut cols, lengths);
        Ok(())
    }

    fn lengths<'b>(&self, out: &'b HostBatch) -> &'b [u64] {
        out.lengths()
    }
}

/// A contiguous share of a batch's rows, handed to one thread.
struct Share<'r, 'b> {
    rows: &'r [GatherRow],
    cols: Vec<&'b mut [MaybeUninit<u8>]>,
    lengths: &'b mut [u64],
}
