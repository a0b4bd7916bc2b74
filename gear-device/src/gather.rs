//! [`DeviceCollector`]: gear-core's [`Collector`] on any device.
//!
//! One launch of `gear_gather` per batch: for each (row, column) the window
//! is copied from the table's device-mapped host memory (zero-copy over the
//! bus) or, for rows a [`RowCache`] holds, from device memory, into one
//! device buffer per column laid out `[rows, window.len, *shape]`. Work runs
//! on the collector's stream (the caller's, see
//! [`DeviceCollector::on_stream`]) and the batch's event is recorded after
//! it: a trainer stream waits with [`DeviceBatch::wait_on`] instead of
//! blocking the host.
//!
//! The host gets the valid lengths at once ([`DeviceBatch::lengths`],
//! computed with `WindowSpec::resolve`); the kernel writes the same numbers
//! to [`DeviceBatch::lengths_device`] for device-side consumers.

use crate::cache::RowCache;
use crate::kernels::KernelFn;
use crate::launch::launch;
use crate::plan::{self, GatherPlan};
use gear_core::{
    Access, BatchLayout, Collector, Device, DeviceApi, DeviceBuffer, GatherRow, Indirect, KernelArg, TableView,
};
use std::sync::Arc;

fn refuse<A: DeviceApi>(msg: impl Into<String>) -> A::Error {
    A::Error::from(gear_core::Error::Device(msg.into()))
}

/// Gathers batches on one device and stream, optionally reading hot rows
/// from a device cache.
pub struct DeviceCollector<A: DeviceApi> {
    pub(crate) device: A::Device,
    pub(crate) stream: A::Stream,
    pub(crate) cache: Option<Arc<dyn RowCache<A>>>,
}

impl<A: DeviceApi> Clone for DeviceCollector<A> {
    fn clone(&self) -> Self {
        DeviceCollector { device: self.device.clone(), stream: self.stream.clone(), cache: self.cache.clone() }
    }
}

impl<A: DeviceApi> std::fmt::Debug for DeviceCollector<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceCollector").field("device", &self.device).field("cached", &self.cache.is_some()).finish()
    }
}

/// A batch in device memory: one buffer per requested column, the valid
/// lengths, and the event recorded after the gather that filled it. Its
/// drop waits for that gather (which writes the buffers about to be freed).
pub struct DeviceBatch<A: DeviceApi> {
    pub(crate) device: A::Device,
    pub(crate) layout: BatchLayout,
    pub(crate) columns: Vec<A::Buffer>,
    pub(crate) lengths_dev: A::Buffer,
    pub(crate) lengths: Vec<u64>,
    /// The gather's word tables (rows' sources and lengths, columns).
    pub(crate) args: A::Buffer,
    pub(crate) event: A::Event,
    /// The stream of the last gather into this batch.
    pub(crate) last_stream: Option<A::Stream>,
    pub(crate) cached_rows: usize,
}

impl<A: DeviceApi> std::fmt::Debug for DeviceBatch<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBatch").field("layout", &self.layout).field("cached_rows", &self.cached_rows).finish()
    }
}

impl<A: DeviceApi> DeviceBatch<A> {
    /// The layout the batch was allocated for.
    pub fn layout(&self) -> &BatchLayout {
        &self.layout
    }

    /// The device buffer of the `i`-th requested column, laid out
    /// `[rows, window.len, *shape]`.
    pub fn column(&self, i: usize) -> Option<&A::Buffer> {
        self.columns.get(i)
    }

    /// Valid steps per row of the last gather (host copy, available as soon
    /// as the gather is queued).
    pub fn lengths(&self) -> &[u64] {
        &self.lengths
    }

    /// Valid steps per row as `u64` in device memory, written by the kernel.
    pub fn lengths_device(&self) -> &A::Buffer {
        &self.lengths_dev
    }

    /// Rows of the last gather that were read from the device cache.
    pub fn cached_rows(&self) -> usize {
        self.cached_rows
    }

    /// The event recorded after the last gather into this batch.
    pub fn event(&self) -> &A::Event {
        &self.event
    }

    /// The device the batch lives on.
    pub fn device(&self) -> &A::Device {
        &self.device
    }

    /// Makes `stream` wait (on the device, not the host) until the batch is
    /// complete.
    pub fn wait_on(&self, stream: &A::Stream) -> Result<(), A::Error> {
        self.device.wait(stream, &self.event)
    }

    /// Blocks the host until the batch is complete.
    pub fn synchronize(&self) -> Result<(), A::Error> {
        self.device.event_synchronize(&self.event)
    }

    /// Whether the last gather has completed (without blocking).
    pub fn is_ready(&self) -> Result<bool, A::Error> {
        self.device.event_done(&self.event)
    }

    /// Waits for the batch and copies column `i` to the host.
    pub fn column_to_host(&self, i: usize) -> Result<Vec<u8>, A::Error> {
        let col = self
            .columns
            .get(i)
            .ok_or_else(|| refuse::<A>(format!("column {i} of a {}-column batch", self.columns.len())))?;
        self.synchronize()?;
        let mut v = vec![0u8; col.len() as usize];
        self.device.read(col, 0, &mut v)?;
        Ok(v)
    }

    /// Waits for the batch and copies the kernel-written lengths to the host.
    pub fn lengths_from_device(&self) -> Result<Vec<u64>, A::Error> {
        self.synchronize()?;
        let mut bytes = vec![0u8; self.lengths_dev.len() as usize];
        self.device.read(&self.lengths_dev, 0, &mut bytes)?;
        Ok(bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
    }

    /// Orders the next work on `stream` after this batch's last gather
    /// (the argument table and buffers are reused) when that ran on another
    /// stream.
    pub(crate) fn order_after_last(&self, stream: &A::Stream) -> Result<(), A::Error> {
        match &self.last_stream {
            Some(prev) if !self.device.same_stream(prev, stream) => self.device.wait(stream, &self.event),
            _ => Ok(()),
        }
    }
}

impl<A: DeviceApi> Drop for DeviceBatch<A> {
    fn drop(&mut self) {
        // A queued gather still writes the buffers about to be freed.
        let _ = self.device.event_synchronize(&self.event);
    }
}

impl<A: DeviceApi> DeviceCollector<A> {
    /// A collector on the device's stream, reading every row zero-copy.
    pub fn new(device: &A::Device) -> Self {
        DeviceCollector { device: device.clone(), stream: device.stream().clone(), cache: None }
    }

    /// The same collector issuing its work on `stream` (the caller's), which
    /// must belong to the device.
    pub fn on_stream(mut self, stream: A::Stream) -> Result<Self, A::Error> {
        if !self.device.owns_stream(&stream) {
            return Err(refuse::<A>("stream belongs to another device"));
        }
        self.stream = stream;
        Ok(self)
    }

    /// The same collector reading the rows `cache` holds from device memory.
    pub fn with_cache(mut self, cache: Arc<dyn RowCache<A>>) -> Result<Self, A::Error> {
        if !cache.is_on(&self.device) {
            return Err(refuse::<A>("cache lives on another device"));
        }
        self.cache = Some(cache);
        Ok(self)
    }

    /// The stream gathers are issued on.
    pub fn stream(&self) -> &A::Stream {
        &self.stream
    }

    /// The device.
    pub fn device(&self) -> &A::Device {
        &self.device
    }

    /// Allocates device buffers for batches of `layout`.
    pub fn alloc(&self, layout: &BatchLayout) -> Result<DeviceBatch<A>, A::Error> {
        let columns =
            (0..layout.columns().len()).map(|i| self.device.alloc(layout.column_bytes(i))).collect::<Result<_, _>>()?;
        let rows = layout.rows() as u64;
        let lengths_dev = self.device.alloc(rows * 8)?;
        let words = 2 * rows + 3 * layout.columns().len() as u64;
        let args = self.device.alloc(words * 8)?;
        let event = self.device.new_event()?;
        Ok(DeviceBatch {
            device: self.device.clone(),
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
    /// The table must be device-mapped (`src.device` set: a table in pinned
    /// memory or a registered region), and stay mapped until the batch's
    /// event (the view's contract). Rows are not checked against the slot
    /// protocol here: callers read each row's length with
    /// `SlotRecord::read_begin` before and check `read_validate` after the
    /// gather completes, as for any reader.
    ///
    /// Do not gather into a batch the trainer may still be reading on the
    /// device: have this collector's stream wait for the trainer first.
    pub fn gather_into(
        &self,
        src: &TableView<'_>,
        rows: &[GatherRow],
        out: &mut DeviceBatch<A>,
    ) -> Result<(), A::Error> {
        let data_base = mapped_base::<A>(src)?;
        let dst_bases: Vec<u64> = out.columns.iter().map(|c| c.device_addr()).collect();
        match &self.cache {
            None => {
                let plan = plan::plan_gather(src.layout(), &out.layout, rows, data_base, &dst_bases, &[])?;
                self.launch(&plan, out, None, &[])
            }
            Some(cache) => {
                let stream = self.stream.clone();
                let stride = src.layout().slot_stride();
                cache.with_rows(src.layout(), rows, &stream, &mut |cached| {
                    let plan = plan::plan_gather(src.layout(), &out.layout, rows, data_base, &dst_bases, cached)?;
                    self.launch(&plan, out, None, &cached_ranges(cached, stride))
                })
            }
        }
    }

    /// Gathers again only the rows `which` of a batch `out` already holds
    /// (`rows` is the whole batch, with the replaced rows), one small launch
    /// per row, each writing that row's slice of every column and its
    /// length. For rows redrawn after a torn read: the other rows are not
    /// copied again. Same rules as [`DeviceCollector::gather_into`].
    pub fn regather_rows(
        &self,
        src: &TableView<'_>,
        rows: &[GatherRow],
        which: &[usize],
        out: &mut DeviceBatch<A>,
    ) -> Result<(), A::Error> {
        if rows.len() != out.layout.rows() {
            return Err(refuse::<A>(format!("{} rows for a batch of {}", rows.len(), out.layout.rows())));
        }
        let data_base = mapped_base::<A>(src)?;
        let one = BatchLayout::new(src.layout(), out.layout.columns(), 1, out.layout.window())?;
        let stride = src.layout().slot_stride();
        for &r in which {
            let row =
                rows.get(r..=r).ok_or_else(|| refuse::<A>(format!("row {r} outside a batch of {}", rows.len())))?;
            let dst_bases: Vec<u64> = out
                .columns
                .iter()
                .enumerate()
                .map(|(i, c)| c.device_addr() + r as u64 * out.layout.row_bytes(i))
                .collect();
            match &self.cache {
                None => {
                    let plan = plan::plan_gather(src.layout(), &one, row, data_base, &dst_bases, &[])?;
                    self.launch(&plan, out, Some(r), &[])?;
                }
                Some(cache) => {
                    let stream = self.stream.clone();
                    cache.with_rows(src.layout(), row, &stream, &mut |cached| {
                        let plan = plan::plan_gather(src.layout(), &one, row, data_base, &dst_bases, cached)?;
                        self.launch(&plan, out, Some(r), &cached_ranges(cached, stride))
                    })?;
                }
            }
        }
        Ok(())
    }

    /// Launches `gear_gather` for `plan` on `stream`, its row and column
    /// tables laid out in `tables` from its start as [`GatherPlan::words`]
    /// orders them, writing row lengths at `lengths` (an address inside
    /// `lengths_buf`). `data_base` is the table's mapped data area, and
    /// `extra` the cache entries the rows read.
    ///
    /// # Safety
    /// The tables must hold the plan's words (or rows the device wrote in
    /// their place, under the same bounds) by the time the kernel runs on
    /// `stream`: every source range inside memory the device may read,
    /// every destination inside `columns`, which outlive the work, and
    /// `lengths` valid for the plan's rows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn launch_gather_kernel(
        &self,
        stream: &A::Stream,
        plan: &GatherPlan,
        tables: u64,
        lengths: u64,
        data_base: u64,
        columns: &[A::Buffer],
        extra: &[Indirect],
    ) -> Result<(), A::Error> {
        let row_len = tables + 8 * plan.row_len_at() as u64;
        let cols = tables + 8 * plan.cols_at() as u64;
        let args = [
            KernelArg::Ptr(tables, Access::Read),
            KernelArg::Ptr(row_len, Access::Read),
            KernelArg::Ptr(cols, Access::Read),
            KernelArg::U64(plan.rows),
            KernelArg::U64(plan.ncols),
            KernelArg::I64(plan.w_offset),
            KernelArg::U64(plan.w_len),
            KernelArg::U32(plan.pad_head),
            KernelArg::Ptr(lengths, Access::Write),
        ];
        let mut indirect: Vec<Indirect> = Vec::with_capacity(1 + columns.len() + extra.len());
        indirect.push(Indirect { addr: data_base, len: None, access: Access::Read });
        indirect.extend(columns.iter().filter(|c| !c.is_empty()).map(|c| Indirect {
            addr: c.device_addr(),
            len: None,
            access: Access::Write,
        }));
        indirect.extend_from_slice(extra);
        let dims = ([plan.grid.0, plan.grid.1, 1], [plan::BLOCK, 1, 1]);
        // SAFETY: the argument list is gear_gather's (checked by `launch`
        // against its parameters); what the addresses point at is the
        // caller's contract, and `indirect` declares what the tables name.
        unsafe { launch::<A>(&self.device, stream, KernelFn::Gather, dims, &args, &indirect) }
    }

    /// Queues `plan`: a whole batch (`row: None`), or one row of it whose
    /// plan addresses row `row`'s slices and length.
    fn launch(
        &self,
        plan: &GatherPlan,
        out: &mut DeviceBatch<A>,
        row: Option<usize>,
        cached: &[Indirect],
    ) -> Result<(), A::Error> {
        let stream = &self.stream;
        out.order_after_last(stream)?;
        if !plan.is_empty() {
            let bytes: Vec<u8> = plan.words.iter().flat_map(|w| w.to_le_bytes()).collect();
            self.device.write(stream, &out.args, 0, &bytes)?;
            let lengths = out.lengths_dev.device_addr() + 8 * row.unwrap_or(0) as u64;
            let data_base = plan.table_base;
            // SAFETY: the tables were uploaded to `out.args` on this stream
            // just before; plan_gather checked every slot, length and column
            // against the layout, so each source range lies in the mapped
            // data area (or a cache entry, declared in `cached`) and each
            // destination in this batch's buffers, which outlive the work
            // because the batch waits for its event before it is freed or
            // reused; `lengths` addresses row `row`'s length (or all rows')
            // in `out.lengths_dev`.
            unsafe {
                self.launch_gather_kernel(
                    stream,
                    plan,
                    out.args.device_addr(),
                    lengths,
                    data_base,
                    &out.columns,
                    cached,
                )
            }?;
        }
        self.device.record(&out.event, stream)?;
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

/// The device address of the table's data area, or a refusal.
pub(crate) fn mapped_base<A: DeviceApi>(src: &TableView<'_>) -> Result<u64, A::Error> {
    src.device().ok_or_else(|| {
        refuse::<A>("the table is not mapped for the device: put it in pinned memory or register its region")
    })
}

/// The cache entries a plan's rows read, as declarations.
fn cached_ranges(cached: &[Option<u64>], stride: u64) -> Vec<Indirect> {
    cached.iter().flatten().map(|&addr| Indirect { addr, len: Some(stride), access: Access::Read }).collect()
}

impl<A: DeviceApi> Collector for DeviceCollector<A> {
    type Batch = DeviceBatch<A>;
    type Error = A::Error;

    fn alloc_batch(&self, layout: &BatchLayout) -> Result<DeviceBatch<A>, A::Error> {
        self.alloc(layout)
    }

    /// Queues the gather ([`DeviceCollector::gather_into`]);
    /// [`Collector::settle`] waits for it.
    fn gather(
        &self,
        src: &TableView<'_>,
        rows: &[GatherRow],
        layout: &BatchLayout,
        out: &mut DeviceBatch<A>,
    ) -> Result<(), A::Error> {
        check_batch_layout::<A>(out, layout)?;
        self.gather_into(src, rows, out)
    }

    /// Gathers only the rows `which` ([`DeviceCollector::regather_rows`])
    /// and waits for them, since the caller validates them next.
    fn regather(
        &self,
        src: &TableView<'_>,
        rows: &[GatherRow],
        layout: &BatchLayout,
        which: &[usize],
        out: &mut DeviceBatch<A>,
    ) -> Result<(), A::Error> {
        check_batch_layout::<A>(out, layout)?;
        self.regather_rows(src, rows, which, out)?;
        out.synchronize()
    }

    /// Waits for the batch's event: the device has finished reading the
    /// table for every gather queued into `out`.
    fn settle(&self, out: &mut DeviceBatch<A>) -> Result<(), A::Error> {
        out.synchronize()
    }

    fn lengths<'b>(&self, out: &'b DeviceBatch<A>) -> &'b [u64] {
        out.lengths()
    }
}

fn check_batch_layout<A: DeviceApi>(out: &DeviceBatch<A>, layout: &BatchLayout) -> Result<(), A::Error> {
    if out.layout == *layout {
        Ok(())
    } else {
        Err(gear_core::Error::InvalidWindow("the batch was allocated for a different layout".into()).into())
    }
}
