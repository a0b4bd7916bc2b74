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

/// One batch row: a slot and the stored length to apply the window to (the
/// length published when the slot was chosen; later appends are not read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatherRow {
    /// Slot index.
    pub slot: u32,
    /// Stored (published) length `k` of the trajectory.
    pub len: u64,
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
