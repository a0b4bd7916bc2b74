//! Drawn rows as byte ranges of the table's region, for readers that copy
//! the windows themselves (a remote trainer reading a shard over a
//! transport) instead of having the table gather them.
//!
//! A reader of a [`RowRanges`] keeps the seqlock rule of local readers
//! (`gear_core::slot`): copy the window bytes first, then read the 8-byte
//! word at [`RowRanges::generation_offset`] (the slot record's
//! `generation << 32 | state`, native-endian) and keep the row only if
//! [`generation_of`] gives [`RowRanges::generation`] (the key's, or for an
//! item, its trajectory's); otherwise the slot was reused during the copy
//! and the row is drawn again. An item's window never changes while its
//! trajectory stays, so its trajectory's generation is all a remote reader
//! checks.
//!
//! Offsets are from the first byte of the region ([`ReplayTable::memory`]),
//! which holds the header, the slot records and the data area.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gear_core::{MemoryRegion, ResolvedWindow, SlotKey, WindowSpec};

use super::ReplayTable;
use crate::error::{Error, Result};
use crate::sampler::{RandomStarts, MAX_BATCH_ROWS};

/// One drawn row: its key, probability and weight as a gathered sample
/// reports them, and where its bytes are in the region.
#[derive(Clone, Debug, PartialEq)]
pub struct RowRanges {
    /// The drawn trajectory (or item).
    pub key: SlotKey,
    /// The generation the slot's generation word must still hold after the
    /// copy: the key's, or for an item its trajectory's.
    pub generation: u32,
    /// The probability it was drawn with.
    pub probability: f64,
    /// Its importance-sampling weight.
    pub weight: f64,
    /// Which stored steps the window takes and where they land in a row.
    pub window: ResolvedWindow,
    /// Per requested column, the region bytes of the window's steps
    /// (empty when the window has no steps).
    pub columns: Vec<Range<u64>>,
    /// Region offset of the slot's 8-byte generation word.
    pub generation_offset: u64,
}

/// The generation in a generation word read from
/// [`RowRanges::generation_offset`] (its high 32 bits).
pub const fn generation_of(word: u64) -> u32 {
    (word >> 32) as u32
}

/// The table's region as a [`MemoryRegion`] of its own that keeps the table
/// open: what a transport server exposes, and what a CUDA device registers
/// (which takes ownership of what it registers) while the table keeps
/// owning the bytes.
pub(crate) struct TableMemory {
    /// Keeps the table, and so its region, alive.
    table: ReplayTable,
}

impl TableMemory {
    /// The region of `table`.
    pub(crate) fn new(table: ReplayTable) -> Self {
        TableMemory { table }
    }

    fn region(&self) -> &dyn MemoryRegion {
        &**self.table.shared.region.region()
    }
}

// SAFETY: every method forwards to the table's region, the
// `Box<dyn MemoryRegion>` its `TableRegion` owns, which keeps the
// MemoryRegion promises for as long as it lives. That region is dropped
// only with the table's `Shared`, i.e. after the last `ReplayTable` clone;
// `self.table` is one, so the heap pool is not freed nor the shared mapping
// unmapped while this value lives.
unsafe impl MemoryRegion for TableMemory {
    fn kind(&self) -> gear_core::MemoryKind {
        self.region().kind()
    }
    fn len(&self) -> u64 {
        self.region().len()
    }
    fn alignment(&self) -> u64 {
        self.region().alignment()
    }
    fn host_ptr(&self) -> Option<std::ptr::NonNull<u8>> {
        self.region().host_ptr()
    }
    fn device_ptr(&self) -> Option<u64> {
        self.region().device_ptr()
    }
    fn name(&self) -> Option<&str> {
        self.region().name()
    }
}

impl ReplayTable {
    /// The whole region (header, slot records, data) as a memory region
    /// that keeps the table open while it lives: what a transport server
    /// exposes for remote reads of [`RowRanges`].
    pub fn memory(&self) -> Arc<dyn MemoryRegion> {
        Arc::new(TableMemory::new(self.clone()))
    }

    /// Region offset of `slot`'s generation word.
    pub fn generation_offset(&self, slot: u32) -> Result<u64> {
        let region = &self.shared.region;
        region.slot(slot)?;
        Ok(region.region_layout().slots_offset + u64::from(slot) * std::mem::size_of::<gear_core::SlotRecord>() as u64)
    }

    /// The region bytes of `window` over the steps `[start, start + len)`
    /// of `slot` (a trajectory of `len` published steps with `start` 0, or
    /// an item's window), per column of `columns` (indices into the spec).
    /// The resolved window's `src_step` counts from the slot's first step.
    pub fn window_ranges(
        &self,
        slot: u32,
        start: u32,
        len: u64,
        window: &WindowSpec,
        columns: &[usize],
    ) -> Result<(ResolvedWindow, Vec<Range<u64>>)> {
        let region = &self.shared.region;
        let layout = region.layout();
        layout.check_slot(u64::from(slot))?;
        let row = gear_core::GatherRow { slot, start, len };
        row.check_len(0, layout.max_len())?;
        let w = row.resolve(window);
        let data = region.region_layout().data_offset;
        let mut out = Vec::with_capacity(columns.len());
        for &c in columns {
            if c >= layout.columns() {
                return Err(gear_core::Error::ColumnIndex { index: c, count: layout.columns() }.into());
            }
            out.push(if w.steps == 0 {
                data..data
            } else {
                let r = layout.range(u64::from(slot), c, w.src_step, w.steps);
                data + r.start..data + r.end
            });
        }
        Ok((w, out))
    }

    /// Draws `rows` rows with the table's strategy (waiting up to
    /// `timeout` for data or the rate limiter, counted against it like a
    /// gathered batch) and returns where their windows are, without
    /// copying a byte. The reader must re-check each row's generation after
    /// copying (module docs). Rows retired by `max_times_sampled` are freed
    /// at once: a reader that finds one reused draws again. With
    /// `random_start`, each row's window starts at a uniformly random step
    /// of its trajectory as [`crate::SampleConfig::random_start`] says
    /// (`window.offset` is not used).
    pub fn draw_ranges(
        &self,
        rows: usize,
        window: WindowSpec,
        random_start: bool,
        columns: &[usize],
        timeout: Option<Duration>,
    ) -> Result<Vec<RowRanges>> {
        if rows == 0 || rows > MAX_BATCH_ROWS {
            return Err(Error::Config(format!("batch of {rows} rows: expected 1 to {MAX_BATCH_ROWS}")));
        }
        window.validate(self.spec().max_len())?;
        let count = self.spec().columns().len();
        if let Some(&c) = columns.iter().find(|&&c| c >= count) {
            return Err(gear_core::Error::ColumnIndex { index: c, count }.into());
        }
        let mut selection = self.selection();
        let mut drawn = Vec::with_capacity(rows);
        let deadline = timeout.map(|t| Instant::now() + t);
        self.select(rows, deadline, true, &mut selection, &mut drawn)?;
        self.retire(&selection.retiring);
        let mut random_starts = random_start.then(|| RandomStarts::new(selection.seed));
        let window = if random_start { RandomStarts::window(window) } else { window };
        drawn
            .iter()
            .map(|d| {
                let trajectory = d.trajectory(self.shared.items_per_slot);
                let len = random_starts.as_mut().map_or(d.len, |starts| starts.cut(d.len, window.len));
                let (window, columns) = self.window_ranges(trajectory.slot, d.start, len, &window, columns)?;
                Ok(RowRanges {
                    key: d.sampled.key,
                    generation: trajectory.generation,
                    probability: d.sampled.probability,
                    weight: d.sampled.weight,
                    window,
                    columns,
                    generation_offset: self.generation_offset(trajectory.slot)?,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gear_core::{ColumnSpec, DType, TableSpec};

    #[test]
    fn ranges_point_at_the_window_bytes_and_the_generation_word() {
        let spec = TableSpec::new(
            vec![ColumnSpec::new("a", DType::U8, vec![3]), ColumnSpec::new("b", DType::I16, vec![])],
            8,
            4,
        )
        .unwrap();
        let table = ReplayTable::builder(spec).build().unwrap();
        let mut t = table.writer().begin(None).unwrap();
        t.append_column(0, 5, crate::StepValue::bytes(&[7u8; 15])).unwrap();
        t.append_column(1, 5, crate::StepValue::bytes(&[9u8; 10])).unwrap();
        let key = t.end().unwrap();
        let rows = table.draw_ranges(4, WindowSpec::last(3), false, &[1, 0], None).unwrap();
        let memory = table.memory();
        let base = memory.host_ptr().unwrap().as_ptr();
        for row in rows {
            assert_eq!(row.key, key);
            assert_eq!(row.window.steps, 3);
            assert_eq!(row.columns[0].end - row.columns[0].start, 6);
            assert_eq!(row.columns[1].end - row.columns[1].start, 9);
            // SAFETY: the ranges lie inside the region, which `memory`
            // keeps mapped; no writer runs.
            let b = unsafe { std::slice::from_raw_parts(base.add(row.columns[0].start as usize), 6) };
            assert!(b.iter().all(|&x| x == 9));
            // SAFETY: as above; the word is 8-byte aligned in the slot records.
            let word = unsafe { base.add(row.generation_offset as usize).cast::<u64>().read() };
            assert_eq!(generation_of(word), key.generation);
        }
    }
}
