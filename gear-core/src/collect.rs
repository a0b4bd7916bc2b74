//! The collector trait: gather the windows of chosen slots and columns into
//! batch buffers.
//!
//! Every backend writes the same output shape, so results compare byte for
//! byte: for each requested column `c`, one contiguous buffer laid out
//! `[rows, window.len, *shape(c)]`, where row `r`'s steps start at byte
//! `r * window.len * s[c]`, the copied steps sit where
//! [`WindowSpec::resolve`] says, every other byte is zero, and
//! `lengths[r]` is the row's valid length.

use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::region::TableView;
use crate::window::WindowSpec;

/// One batch row: a slot and the sequence of its steps the window applies
/// to: steps `[start, start + len)`. For a whole trajectory `start` is 0
/// and `len` the length published when the slot was chosen (later appends
/// are not read); for an item, its window (a table with items keeps its
/// steps in 32 bits, so `start` has 32 and a row stays 16 bytes). The
/// window rule sees a trajectory of `len` steps, and the copy reads
/// `start` steps further.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatherRow {
    /// Slot index.
    pub slot: u32,
    /// First step of the sequence (0 for a whole trajectory).
    pub start: u32,
    /// Steps in the sequence: the stored length `k` the window rule is
    /// applied to.
    pub len: u64,
}

impl GatherRow {
    /// A row over the first `len` steps of `slot` (a whole trajectory of
    /// published length `len`).
    pub const fn whole(slot: u32, len: u64) -> Self {
        GatherRow { slot, start: 0, len }
    }

    /// Where the row's window is: [`WindowSpec::resolve`] of `len`, with
    /// `src_step` counted from the slot's first step (wrapping only for a
    /// row [`GatherRow::check_len`] refuses).
    #[inline]
    pub fn resolve(&self, window: &WindowSpec) -> crate::window::ResolvedWindow {
        let mut w = window.resolve(self.len);
        w.src_step = w.src_step.wrapping_add(u64::from(self.start));
        w
    }

    /// Checks the row against a table of `max_len` steps per slot: the
    /// sequence must lie inside the slot.
    #[inline]
    pub fn check_len(&self, row: usize, max_len: u64) -> Result<()> {
        match u64::from(self.start).checked_add(self.len) {
            Some(end) if end <= max_len => Ok(()),
            _ => Err(self.too_long(row, max_len)),
        }
    }

    #[cold]
    fn too_long(&self, row: usize, max_len: u64) -> Error {
        Error::InvalidWindow(format!(
            "row {row} (slot {}): steps {}..{} exceed the table's maximum trajectory length {max_len}",
            self.slot,
            self.start,
            u64::from(self.start).saturating_add(self.len)
        ))
    }
}

/// The shape of a batch: which columns, how many rows, which window.
/// Only [`BatchLayout::new`] makes one, so every value has columns inside
/// its table, step sizes matching them, and a byte size that fits `usize`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchLayout {
    columns: Vec<usize>,
    step_bytes: Vec<u64>,
    rows: usize,
    window: WindowSpec,
}

impl BatchLayout {
    /// Validates columns and window against a table layout.
    pub fn new(layout: &Layout, columns: &[usize], rows: usize, window: WindowSpec) -> Result<Self> {
        window.validate(layout.max_len())?;
        if columns.is_empty() {
            return Err(Error::InvalidWindow("no columns requested".into()));
        }
        let step_bytes = columns
            .iter()
            .map(|&c| {
                if c < layout.columns() {
                    Ok(layout.step_bytes(c))
                } else {
                    Err(Error::ColumnIndex { index: c, count: layout.columns() })
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let total = step_bytes.iter().try_fold(0u64, |acc, s| {
            s.checked_mul(window.len)
                .and_then(|x| x.checked_mul(rows as u64))
                .and_then(|x| acc.checked_add(x))
                .ok_or_else(|| Error::SizeOverflow("batch bytes".into()))
        })?;
        usize::try_from(total).map_err(|_| Error::SizeOverflow("batch bytes (as usize)".into()))?;
        Ok(BatchLayout { columns: columns.to_vec(), step_bytes, rows, window })
    }

    /// Requested columns, by index into the spec.
    pub fn columns(&self) -> &[usize] {
        &self.columns
    }

    /// Bytes per step of each requested column.
    pub fn step_bytes(&self) -> &[u64] {
        &self.step_bytes
    }

    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The window applied to every row.
    pub fn window(&self) -> WindowSpec {
        self.window
    }

    /// Bytes of one row of the `i`-th requested column.
    pub fn row_bytes(&self, i: usize) -> u64 {
        self.step_bytes[i] * self.window.len
    }

    /// Bytes of the whole buffer of the `i`-th requested column.
    pub fn column_bytes(&self, i: usize) -> u64 {
        self.row_bytes(i) * self.rows as u64
    }

    /// Bytes of all columns together.
    pub fn total_bytes(&self) -> u64 {
        (0..self.columns.len()).map(|i| self.column_bytes(i)).sum()
    }
}

/// Gathers windows from a table's data area into a backend's batch buffers.
///
/// A gather may be asynchronous (queued on a device, say): the sampling
/// protocol calls [`Collector::settle`] before it checks each row's slot
/// generation, since only bytes that have been read can be validated.
pub trait Collector {
    /// The backend's batch buffers (host vectors, device buffers, ...).
    type Batch;

    /// The backend's error type; gear-core's refusals convert into it.
    type Error: From<Error> + std::error::Error + Send + Sync + 'static;

    /// Allocates buffers for batches of this layout (reusable across calls).
    fn alloc_batch(&self, layout: &BatchLayout) -> Result<Self::Batch, Self::Error>;

    /// Gathers `rows` into `out`, which was allocated for `layout`.
    /// `rows.len()` must equal `layout.rows`. Fills the valid lengths.
    fn gather(
        &self,
        src: &TableView<'_>,
        rows: &[GatherRow],
        layout: &BatchLayout,
        out: &mut Self::Batch,
    ) -> Result<(), Self::Error>;

    /// Gathers again only the rows whose indices are in `which` (rows whose
    /// slot was reused during the first copy and were redrawn), leaving the
    /// other rows of `out` as they are. The default gathers every row,
    /// which is correct but copies more; collectors override it.
    fn regather(
        &self,
        src: &TableView<'_>,
        rows: &[GatherRow],
        layout: &BatchLayout,
        which: &[usize],
        out: &mut Self::Batch,
    ) -> Result<(), Self::Error> {
        let _ = which;
        self.gather(src, rows, layout, out)
    }

    /// Returns once every gather into `out` has finished reading the
    /// table. Collectors whose `gather` copies before it returns (the CPU
    /// one) keep this default, which returns at once.
    fn settle(&self, out: &mut Self::Batch) -> Result<(), Self::Error> {
        let _ = out;
        Ok(())
    }

    /// The valid length of each row of `out`, as the last gather or
    /// regather set it.
    fn lengths<'b>(&self, out: &'b Self::Batch) -> &'b [u64];
}
