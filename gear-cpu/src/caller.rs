//! Caller-owned buffers (a pinned staging area, a tensor's storage) as a
//! batch the CPU collector fills through gear-core's [`Collector`] trait,
//! so that gathering into them follows the same sampling protocol as
//! gathering into a [`HostBatch`](crate::HostBatch).

use crate::collect::CpuCollector;
use gear_core::{BatchLayout, Collector, Error, GatherRow, Result, TableView};
use std::marker::PhantomData;
use std::mem::MaybeUninit;

/// Buffers owned by the caller, borrowed for one sample: `columns[i]`
/// receives requested column `i` as `[rows, window.len, *shape]` in its
/// first [`BatchLayout::column_bytes`] bytes, `lengths[r]` row `r`'s copied
/// steps.
///
/// The buffers may be uninitialised (an encode buffer's spare capacity):
/// a gather that succeeds has written every byte of each column's first
/// `column_bytes`. The collector writes only initialised bytes (copies of
/// table bytes, and zeros), never `MaybeUninit::uninit()`, so buffers that
/// were initialised stay so.
#[derive(Debug)]
pub struct CallerBatch<'a, 'b> {
    /// One buffer per requested column.
    pub columns: &'a mut [&'b mut [MaybeUninit<u8>]],
    /// One valid length per row.
    pub lengths: &'a mut [u64],
}

/// The CPU collector writing into a [`CallerBatch`]: gathers exactly as
/// [`CpuCollector::gather_into`] does. It allocates nothing: the caller
/// sizes the buffers from the [`BatchLayout`], so
/// [`Collector::alloc_batch`] is refused.
#[derive(Debug)]
pub struct IntoCallerBuffers<'c, 'a, 'b> {
    collector: &'c CpuCollector,
    _batch: PhantomData<fn(&mut CallerBatch<'a, 'b>)>,
}

impl CpuCollector {
    /// This collector as one that fills caller-owned buffers.
    pub fn into_caller_buffers<'a, 'b>(&self) -> IntoCallerBuffers<'_, 'a, 'b> {
        IntoCallerBuffers { collector: self, _batch: PhantomData }
    }
}

impl<'a, 'b> Collector for IntoCallerBuffers<'_, 'a, 'b> {
    type Batch = CallerBatch<'a, 'b>;
    type Error = Error;

    fn alloc_batch(&self, _: &BatchLayout) -> Result<CallerBatch<'a, 'b>> {
        Err(Error::Unsupported("caller-owned buffers are sized by the caller from the batch layout, not allocated"))
    }

    fn gather(
        &self,
        src: &TableView<'_>,
        rows: &[GatherRow],
        layout: &BatchLayout,
        out: &mut CallerBatch<'a, 'b>,
    ) -> Result<()> {
        self.collector.gather_into_uninit(src, rows, layout, out.columns, out.lengths)
    }

    fn regather(
        &self,
        src: &TableView<'_>,
        rows: &[GatherRow],
        layout: &BatchLayout,
        which: &[usize],
        out: &mut CallerBatch<'a, 'b>,
    ) -> Result<()> {
        self.collector.regather_into_uninit(src, rows, layout, which, out.columns, out.lengths)
    }

    fn lengths<'o>(&self, out: &'o CallerBatch<'a, 'b>) -> &'o [u64] {
        out.lengths
    }
}
