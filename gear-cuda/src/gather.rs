//! [`CudaCollector`]: the GPU implementation of [`gear_core::Collector`].
//!
//! One launch of `gear_gather` per batch: for each (row, column) the window
//! is copied from the table's device-mapped host memory (zero-copy over the
//! bus) or, for rows a [`RowCache`] holds, from device memory, into one
//! device buffer per column laid out `[rows, window.len, *shape]`. Work runs
//! on the collector's stream (the caller's, see [`CudaCollector::on_stream`])
//! and the batch's event is recorded after it: a trainer stream waits with
//! [`CudaBatch::wait_on`] instead of blocking the host.
//!
//! The host gets the valid lengths at once ([`CudaBatch::lengths`], computed
//! with `WindowSpec::resolve`); the kernel writes the same numbers to
//! [`CudaBatch::lengths_device`] for device-side consumers.

use crate::cache::RowCache;
use crate::device::CudaDevice;
use crate::error::{Error, Result};
use crate::kernels::KernelFn;
use crate::memory::DeviceMemory;
use crate::plan::{self, GatherPlan};
use cudarc::driver::{CudaEvent, CudaStream, LaunchConfig, PushKernelArg};
use gear_core::{BatchLayout, Collector, GatherRow, TableView};
use std::sync::Arc;

/// Gathers batches on one device and stream, optionally reading hot rows
/// from a device cache.
#[derive(Clone)]
pub struct CudaCollector {
    pub(crate) device: CudaDevice,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) cache: Option<Arc<dyn RowCache>>,
}

impl std::fmt::Debug for CudaCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaCollector").field("device", &self.device).field("cached", &self.cache.is_some()).finish()
    }
}

/// A batch in device memory: one buffer per requested column, the valid
/// lengths, and the event recorded after the gather that filled it.
pub struct CudaBatch {
    pub(crate) layout: BatchLayout,
    pub(crate) columns: Vec<DeviceMemory>,
    pub(crate) lengths_dev: DeviceMemory,
    pub(crate) lengths: Vec<u64>,
    /// Device copy of the plan's word table.
    pub(crate) args: DeviceMemory,
    pub(crate) event: CudaEvent,
    /// The stream of the last gather into this batch.
    pub(crate) last_stream: Option<Arc<CudaStream>>,
    pub(crate) cached_rows: usize,
}

impl std::fmt::Debug for CudaBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBatch").field("layout", &self.layout).field("cached_rows", &self.cached_rows).finish()
    }
}

impl CudaBatch {
    /// The layout the batch was allocated for.
    pub fn layout(&self) -> &BatchLayout {
        &self.layout
    }

    /// The device buffer of the `i`-th requested column, laid out
    /// `[rows, window.len, *shape]`.
    pub fn column(&self, i: usize) -> Option<&DeviceMemory> {
        self.columns.get(i)
    }

    /// Valid steps per row of the last gather (host copy, available as soon
    /// as `gather` returns).
    pub fn lengths(&self) -> &[u64] {
        &self.lengths
    }

    /// Valid steps per row as `u64` in device memory, written by the kernel.
    pub fn lengths_device(&self) -> &DeviceMemory {
        &self.lengths_dev
    }

    /// Rows of the last gather that were read from the device cache.
    pub fn cached_rows(&self) -> usize {
        self.cached_rows
    }

    /// The event recorded after the last gather into this batch.
    pub fn event(&self) -> &CudaEvent {
        &self.event
    }

    /// Makes `stream` wait (on the device, not the host) until the batch is
    /// complete.
    pub fn wait_on(&self, stream: &CudaStream) -> Result<()> {
        Ok(stream.wait(&self.event)?)
    }

    /// Blocks the host until the batch is complete.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.event.synchronize()?)
    }

    /// Whether the last gather has completed (without blocking).
    pub fn is_ready(&self) -> Result<bool> {
        Ok(self.event.try_is_complete()?)
    }

    /// Waits for the batch and copies column `i` to the host.
    pub fn column_to_host(&self, i: usize) -> Result<Vec<u8>> {
        let col = self
            .columns
            .get(i)
            .ok_or_else(|| Error::InvalidArgument(format!("column {i} of a {}-column batch", self.columns.len())))?;
        self.synchronize()?;
        col.to_vec()
    }

    /// Waits for the batch and copies the kernel-written lengths to the host.
    pub fn lengths_from_device(&self) -> Result<Vec<u64>> {
        self.synchronize()?;
        let bytes = self.lengths_dev.to_vec()?;
        Ok(bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
    }
}

impl Drop for CudaBatch {
    fn drop(&mut self) {
        // A queued gather still writes the buffers about to be freed.
        let _ = self.event.synchronize();
    }
}

impl CudaCollector {
    /// A collector on the device's stream, reading every row zero-copy.
    pub fn new(device: &CudaDevice) -> Self {
        CudaCollector { device: device.clone(), stream: device.stream().clone(), cache: None }
    }

    /// The same collector issuing its work on `stream` (the caller's), which
    /// must belong to the device's context.
    pub fn on_stream(mut self, stream: Arc<CudaStream>) -> Result<Self> {
        if **stream.context() != **self.device.context() {
            return Err(Error::InvalidArgument("stream belongs to another device context".into()));
        }
        self.stream = stream;
        Ok(self)
    }

    /// The same collector reading the rows `cache` holds from device memory.
    pub fn with_cache(mut self, cache: Arc<dyn RowCache>) -> Result<Self> {
        if **cache.context() != **self.device.context() {
            return Err(Error::InvalidArgument("cache lives in another device context".into()));
        }
        self.cache = Some(cache);
        Ok(self)
    }

    /// The stream gathers are issued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// Allocates device buffers for batches of `layout`.
    pub fn alloc(&self, layout: &BatchLayout) -> Result<CudaBatch> {
        let ctx = self.device.context();
        let columns = (0..layout.columns().len())
            .map(|i| DeviceMemory::alloc(ctx, layout.column_bytes(i)))
            .collect::<Result<_>>()?;
        let rows = layout.rows() as u64;
        let lengths_dev = DeviceMemory::alloc(ctx, rows * 8)?;
        let words = 2 * rows + 3 * layout.columns().len() as u64;
        let args = DeviceMemory::alloc(ctx, words * 8)?;
        let event = ctx.new_event(None)?;
        Ok(CudaBatch {
            layout: layout.clone(),
            columns,
            lengths_dev,
            lengths: vec![0; layout.rows()],
            args,
            event,
            last_stream: None,
            cached_rows: 0,
        })
    }

    /// Gathers `rows` of the table seen through `src` into `out` on this
    /// collector's stream and records `out`'s event. Returns once the work
    /// is queued; `out.lengths()` is already valid.
    ///
    /// The table must be device-mapped (`src.device` set: a table in
    /// [`crate::PinnedMemory`] or a [`crate::RegisteredRegion`]). Rows are
    /// not checked against the slot protocol here: callers read each row's
    /// length with `SlotRecord::read_begin` before and check
    /// `read_validate` after the event completes, as for any reader.
    ///
    /// Do not gather into a batch the trainer may still be reading on the
    /// device: have this collector's stream wait for the trainer first.
    pub fn gather_into(&self, src: &TableView<'_>, rows: &[GatherRow], out: &mut CudaBatch) -> Result<()> {
        let data_base = src.device().ok_or_else(|| {
            Error::InvalidArgument(
                "the table is not mapped for the device: put it in PinnedMemory or register its region".into(),
            )
        })?;
        let dst_bases: Vec<u64> = out.columns.iter().map(|c| c.device_addr()).collect();
        match &self.cache {
            None => {
                let plan = plan::plan_gather(src.layout(), &out.layout, rows, data_base, &dst_bases, &[])?;
                self.launch(&plan, out, None)
            }
            Some(cache) => {
                let stream = self.stream.clone();
                cache.with_rows(src.layout(), rows, &stream, &mut |cached| {
                    let plan = plan::plan_gather(src.layout(), &out.layout, rows, data_base, &dst_bases, cached)?;
                    self.launch(&plan, out, None)
                })
            }
        }
    }

    /// Gathers again only the rows `which` of a batch `out` already holds
    /// (`rows` is the whole batch, with the replaced rows), one small launch
    /// per row, each writing that row's slice of every column and its
    /// length. For rows redrawn after a torn read: the other rows are not
    /// copied again. Same rules as [`CudaCollector::gather_into`].
    pub fn regather_rows(
        &self,
        src: &TableView<'_>,
        rows: &[GatherRow],
        which: &[usize],
        out: &mut CudaBatch,
    ) -> Result<()> {
        if rows.len() != out.layout.rows() {
            return Err(Error::InvalidArgument(format!("{} rows for a batch of {}", rows.len(), out.layout.rows())));
        }
        let data_base = src.device().ok_or_else(|| {
            Error::InvalidArgument("the table is not mapped for the device: register its region".into())
        })?;
        let one = BatchLayout::new(src.layout(), out.layout.columns(), 1, out.layout.window())?;
        for &r in which {
            let row = rows
                .get(r..=r)
                .ok_or_else(|| Error::InvalidArgument(format!("row {r} outside a batch of {}", rows.len())))?;
            let dst_bases: Vec<u64> = out
                .columns
                .iter()
                .enumerate()
                .map(|(i, c)| c.device_addr() + r as u64 * out.layout.row_bytes(i))
                .collect();
            match &self.cache {
                None => {
                    let plan = plan::plan_gather(src.layout(), &one, row, data_base, &dst_bases, &[])?;
                    self.launch(&plan, out, Some(r))?;
                }
                Some(cache) => {
                    let stream = self.stream.clone();
                    cache.with_rows(src.layout(), row, &stream, &mut |cached| {
                        let plan = plan::plan_gather(src.layout(), &one, row, data_base, &dst_bases, cached)?;
                        self.launch(&plan, out, Some(r))
                    })?;
                }
            }
        }
        Ok(())
    }

    /// Launches `gear_gather` for `plan` on `stream`, its row and column
    /// tables laid out from device address `tables` as
    /// [`GatherPlan::words`] orders them, writing row lengths from
    /// `lengths` on.
    ///
    /// # Safety
    /// The tables at `tables` must hold the plan's words (or rows the
    /// device wrote in their place, under the same bounds) by the time the
    /// kernel runs on `stream`: every source range inside memory the device
    /// may read, every destination inside buffers that outlive the work,
    /// and `lengths` valid for the plan's rows.
    pub(crate) unsafe fn launch_gather_kernel(
        &self,
        stream: &CudaStream,
        plan: &GatherPlan,
        tables: u64,
        lengths: u64,
    ) -> Result<()> {
        let func = self.device.function(KernelFn::Gather)?;
        let row_len = tables + 8 * plan.row_len_at() as u64;
        let cols = tables + 8 * plan.cols_at() as u64;
        let cfg = LaunchConfig {
            grid_dim: (plan.grid.0, plan.grid.1, 1),
            block_dim: (plan::BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(&func);
        b.arg(&tables)
            .arg(&row_len)
            .arg(&cols)
            .arg(&plan.rows)
            .arg(&plan.ncols)
            .arg(&plan.w_offset)
            .arg(&plan.w_len)
            .arg(&plan.pad_head)
            .arg(&lengths);
        // SAFETY: the argument list matches gear_gather's signature (three
        // u64 table addresses, u64 rows, u64 ncols, i64 offset, u64 len, u32
        // pad, u64 lengths address); what the addresses point at is the
        // caller's contract.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Queues `plan`: a whole batch (`row: None`), or one row of it whose
    /// plan addresses row `row`'s slices and length.
    fn launch(&self, plan: &GatherPlan, out: &mut CudaBatch, row: Option<usize>) -> Result<()> {
        let stream = &self.stream;
        // A batch last filled on another stream: order this gather after it
        // (the argument table and buffers are reused).
        if let Some(prev) = &out.last_stream {
            if **prev != **stream {
                stream.wait(&out.event)?;
            }
        }
        if !plan.is_empty() {
            let bytes: Vec<u8> = plan.words.iter().flat_map(|w| w.to_le_bytes()).collect();
            out.args.write_async(0, &bytes, stream)?;
            let lengths = out.lengths_dev.device_addr() + 8 * row.unwrap_or(0) as u64;
            // SAFETY: the tables were uploaded to `out.args` on this stream
            // just before; plan_gather checked every slot, length and column
            // against the layout, so each source range lies in the mapped
            // data area (or a cache slot) and each destination in this
            // batch's buffers, which outlive the work because the batch is
            // only reused after its event (above); `lengths` addresses row
            // `row`'s length (or all rows') in `out.lengths_dev`.
            unsafe { self.launch_gather_kernel(stream, plan, out.args.device_addr(), lengths) }?;
        }
        out.event.record(stream)?;
        out.last_stream = Some(stream.clone());
        match row {
            None => {
                out.lengths.clone_from(&plan.lengths);
                out.cached_rows = plan.cached_rows;
            }
            Some(r) => out.lengths[r] = plan.lengths[0],
        }
        Ok(())
    }
}

impl Collector for CudaCollector {
    type Batch = CudaBatch;
    type Error = Error;

    fn alloc_batch(&self, layout: &BatchLayout) -> Result<CudaBatch> {
        self.alloc(layout)
    }

    /// Queues the gather ([`CudaCollector::gather_into`]);
    /// [`Collector::settle`] waits for it.
    fn gather(&self, src: &TableView<'_>, rows: &[GatherRow], layout: &BatchLayout, out: &mut CudaBatch) -> Result<()> {
        check_batch_layout(out, layout)?;
        self.gather_into(src, rows, out)
    }

    /// Gathers only the rows `which` ([`CudaCollector::regather_rows`])
    /// and waits for them, since the caller validates them next.
    fn regather(
        &self,
        src: &TableView<'_>,
        rows: &[GatherRow],
        layout: &BatchLayout,
        which: &[usize],
        out: &mut CudaBatch,
    ) -> Result<()> {
        check_batch_layout(out, layout)?;
        self.regather_rows(src, rows, which, out)?;
        out.synchronize()
    }

    /// Waits for the batch's event: the device has finished reading the
    /// table for every gather queued into `out`.
    fn settle(&self, out: &mut CudaBatch) -> Result<()> {
        out.synchronize()
    }

    fn lengths<'b>(&self, out: &'b CudaBatch) -> &'b [u64] {
        out.lengths()
    }
}

fn check_batch_layout(out: &CudaBatch, layout: &BatchLayout) -> Result<()> {
    if out.layout == *layout {
        Ok(())
    } else {
        Err(gear_core::Error::InvalidWindow("the batch was allocated for a different layout".into()).into())
    }
}
