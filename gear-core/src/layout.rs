//! The byte layout of a table's data area (SPEC.md, "Layout"):
//!
//! `offset(slot i, column c, step t) = i*stride + A[c]*T + t*s[c]`
//!
//! where `s[c]` is the bytes per step of column `c`, `A` the prefix sum of
//! `s` (`A[0] = 0`), `T` the maximum trajectory length and
//! `stride = T * sum(s)`. Each column of a slot is contiguous over time, so a
//! window of one column of one trajectory is one contiguous byte range and is
//! copied with a single `memcpy` (or a single RDMA read).

use crate::error::{Error, Result};
use crate::spec::TableSpec;
use std::ops::Range;

/// Precomputed offsets of a table's data area. All offsets are `u64` and
/// were checked for overflow at construction, so the accessors need no
/// further checks for in-range arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// `s[c]`: bytes per step of each column.
    step_bytes: Vec<u64>,
    /// `A[c] * T`: where column `c` starts inside a slot.
    column_base: Vec<u64>,
    /// `T * sum(s)`.
    slot_stride: u64,
    max_len: u64,
    capacity: u64,
    /// `capacity * slot_stride`.
    total_bytes: u64,
}

impl Layout {
    /// Computes the layout of a spec with checked arithmetic.
    pub fn new(spec: &TableSpec) -> Result<Self> {
        let overflow = |what: &str| Error::SizeOverflow(what.to_owned());
        let t = spec.max_len();
        let mut step_bytes = Vec::with_capacity(spec.columns().len());
        let mut column_base = Vec::with_capacity(spec.columns().len());
        let mut prefix = 0u64;
        for c in spec.columns() {
            let s = c.step_bytes()?;
            column_base.push(prefix.checked_mul(t).ok_or_else(|| overflow("column offset"))?);
            step_bytes.push(s);
            prefix = prefix.checked_add(s).ok_or_else(|| overflow("bytes per step"))?;
        }
        let slot_stride = prefix.checked_mul(t).ok_or_else(|| overflow("slot stride"))?;
        let total_bytes = slot_stride.checked_mul(spec.capacity()).ok_or_else(|| overflow("table bytes"))?;
        // Keep every byte offset addressable on this machine as well.
        usize::try_from(total_bytes).map_err(|_| overflow("table bytes (as usize)"))?;
        Ok(Layout { step_bytes, column_base, slot_stride, max_len: t, capacity: spec.capacity(), total_bytes })
    }

    /// Number of columns.
    pub fn columns(&self) -> usize {
        self.step_bytes.len()
    }

    /// `s[c]`, bytes per step of column `c`.
    pub fn step_bytes(&self, column: usize) -> u64 {
        self.step_bytes[column]
    }

    /// Bytes per step summed over all columns.
    pub fn row_bytes(&self) -> u64 {
        self.slot_stride / self.max_len
    }

    /// `T`.
    pub fn max_len(&self) -> u64 {
        self.max_len
    }

    /// Slots.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes between consecutive slots.
    pub fn slot_stride(&self) -> u64 {
        self.slot_stride
    }

    /// Size of the whole data area.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// Byte offset of `(slot, column, step)` from the start of the data area.
    /// Callers keep `slot < capacity`, `column < columns()`, `step <= T`.
    #[inline]
    pub fn offset(&self, slot: u64, column: usize, step: u64) -> u64 {
        debug_assert!(slot < self.capacity && step <= self.max_len);
        slot * self.slot_stride + self.column_base[column] + step * self.step_bytes[column]
    }

    /// Byte range of `steps` consecutive steps of one column of one slot.
    #[inline]
    pub fn range(&self, slot: u64, column: usize, first_step: u64, steps: u64) -> Range<u64> {
        debug_assert!(first_step + steps <= self.max_len);
        let start = self.offset(slot, column, first_step);
        start..start + steps * self.step_bytes[column]
    }

    /// Checks a slot index against the capacity.
    pub fn check_slot(&self, slot: u64) -> Result<()> {
        if slot < self.capacity {
            Ok(())
        } else {
            Err(Error::SlotOutOfRange { slot, capacity: self.capacity })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ColumnSpec, DType};
    use proptest::prelude::*;

    fn arb_spec() -> impl Strategy<Value = TableSpec> {
        let dtype = prop::sample::select(DType::ALL.to_vec());
        let column = (dtype, prop::collection::vec(1u64..6, 0..3));
        (prop::collection::vec(column, 1..6), 1u64..40, 1u64..20).prop_map(|(cols, t, cap)| {
            let cols = cols.into_iter().enumerate().map(|(i, (d, s))| ColumnSpec::new(format!("c{i}"), d, s)).collect();
            TableSpec::new(cols, t, cap).unwrap()
        })
    }

    proptest! {
        /// Every (slot, column) range is in bounds, the ranges tile the data
        /// area exactly, and each step sits where the SPEC formula says.
        #[test]
        #[cfg_attr(miri, ignore = "safe arithmetic, nothing for Miri to check; minutes under it")]
        fn ranges_tile_the_area_without_overlap(spec in arb_spec()) {
            let layout = Layout::new(&spec).unwrap();
            let t = spec.max_len();
            let mut ranges = Vec::new();
            for slot in 0..spec.capacity() {
                for c in 0..layout.columns() {
                    let r = layout.range(slot, c, 0, t);
                    prop_assert!(r.end <= layout.total_bytes());
                    prop_assert_eq!(r.end - r.start, t * spec.columns()[c].step_bytes().unwrap());
                    for step in 0..t {
                        let a: u64 = spec.columns()[..c].iter().map(|x| x.step_bytes().unwrap()).sum();
                        let expect = slot * layout.slot_stride() + a * t + step * layout.step_bytes(c);
                        prop_assert_eq!(layout.offset(slot, c, step), expect);
                    }
                    ranges.push(r);
                }
            }
            ranges.sort_by_key(|r| r.start);
            let mut end = 0;
            for r in ranges {
                prop_assert_eq!(r.start, end, "gap or overlap");
                end = r.end;
            }
            prop_assert_eq!(end, layout.total_bytes());
        }
    }
}
